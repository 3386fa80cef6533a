import json
from pathlib import Path

import pytest

from harness import binaries
from harness.errors import HarnessError

KUBE_GOMOD = """module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
)
"""

ETCD_GOMOD = """module go.etcd.io/etcd/server/v3

replace (
\tgo.etcd.io/etcd/api/v3 => ../api
\tgo.etcd.io/etcd/client/v3 => ../client/v3
)

replace go.etcd.io/etcd => ./FORBIDDEN_DEPENDENCY
"""


def test_staging_replaces_point_at_published_v0_versions() -> None:
    assert binaries._path_replaces(KUBE_GOMOD, binaries.KUBERNETES) == [
        ("k8s.io/api", "v0.36.3"),
        ("k8s.io/client-go", "v0.36.3"),
    ]


def test_etcd_sibling_replaces_use_the_same_version_and_skip_the_guard() -> None:
    assert binaries._path_replaces(ETCD_GOMOD, binaries.ETCD) == [
        ("go.etcd.io/etcd/api/v3", "v3.6.16"),
        ("go.etcd.io/etcd/client/v3", "v3.6.16"),
    ]


def test_binary_names_follow_go_build() -> None:
    assert binaries._default_binary_name("go.etcd.io/etcd/server/v3") == "server"
    assert binaries._default_binary_name("k8s.io/kubernetes/cmd/kubectl") == "kubectl"


def test_version_ldflags_set_git_version_for_both_version_packages() -> None:
    flags = " ".join(binaries.KUBERNETES.ldflags)
    assert "-X k8s.io/component-base/version.gitVersion=v1.36.3" in flags
    assert "-X k8s.io/client-go/pkg/version.gitMinor=36" in flags


def test_corrupt_cached_binary_is_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for comp in binaries.COMPONENTS:  # a complete, intact fake cache
        comp.bin_dir.mkdir(parents=True)
        for name in comp.commands:
            (comp.bin_dir / name).write_bytes(f"binary {name}".encode())
        sums = {name: binaries._sha256(comp.bin_dir / name) for name in comp.commands}
        (comp.bin_dir / "manifest.json").write_text(json.dumps(sums))
    binaries.require_built()
    kwok = binaries.KWOK.binary("kwok")
    kwok.write_bytes(b"binary kwoK")  # same size, other bytes
    assert binaries.verify(binaries.KWOK) == [
        f"cached binary {kwok} is corrupt (checksum mismatch)"
    ]
    with pytest.raises(HarnessError, match=r"is corrupt.*run `make binaries`"):
        binaries.require_built()


def test_missing_go_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(binaries.shutil, "which", lambda _name: None)
    with pytest.raises(
        HarnessError, match=r"Go toolchain \(`go`\) is not on PATH.*install Go 1.26\+"
    ):
        binaries.find_go()


def test_a_second_build_waits_for_the_first_and_does_not_build_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `gpulab build`s of one component at once (two terminals): the second waits for
    the first's lock and then finds the binaries built, instead of racing it."""
    import threading
    import time

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    comp = binaries.CRICTL
    started, builds = threading.Event(), []

    def fake_build(c: binaries.Component, go: str, work: Path, progress: object) -> None:
        builds.append(threading.current_thread().name)
        started.set()
        time.sleep(0.3)
        c.bin_dir.mkdir(parents=True)
        (c.bin_dir / "crictl").write_bytes(b"crictl")
        sums = {"crictl": binaries._sha256(c.bin_dir / "crictl")}
        (c.bin_dir / "manifest.json").write_text(json.dumps(sums))

    monkeypatch.setattr(binaries, "_build_locked", fake_build)
    said: list[str] = []
    first = threading.Thread(target=binaries.build, args=(comp, "go", said.append), name="a")
    first.start()
    started.wait(5)
    binaries.build(comp, "go", said.append)
    first.join()
    assert builds == ["a"]
    assert said == [
        f"cri-tools {comp.version}: another build holds it; waiting",
        f"cri-tools {comp.version}: built meanwhile in {comp.bin_dir}",
    ]


def test_cached_binaries_are_named_in_one_line_and_not_again_on_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make demo-*` checks the binaries (`gpulab build`), then the backend's `up` checks
    them again: one line for all, once."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(binaries, "verify", lambda comp: [])
    said: list[str] = []
    binaries.build_all(said.append)
    assert said == [
        f"binaries cached in {tmp_path / 'gpulab' / 'bin'}: "
        + ", ".join(f"{c.name} {c.version}" for c in binaries.COMPONENTS)
    ]
    said.clear()
    binaries.build_all(said.append, say_cached=False)
    assert said == []
