"""Bad input at the edges a user touches, through ``gpulab up`` as its entry point runs it.

A broken cluster spec, a GPU profile with impossible values, a port in use and a missing
binary each end ``gpulab up`` with one line on stderr that says what is wrong and what to
do, a non-zero exit, and nothing started: ``gpulab status`` reports the cluster not
running. Every case fails before any process starts, so the test runs without a cluster:
its spec (cluster ``gpulab-badinput``, ports 33xxx) and its state and cache directories
live in the test's tmp dir. Progress lines (``==> ...``) may come before the error line.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulab import cli

NAME = "gpulab-badinput"
PORTS = {"apiserver": 33443, "etcd": 33379, "etcdPeer": 33380, "controllerManager": 33257,
         "scheduler": 33259}  # fmt: skip
NODES = [{"name": "t4", "profile": "t4-x1"}]


def spec(**changes: Any) -> dict[str, Any]:
    return {"name": NAME, "ports": dict(PORTS), "nodes": list(NODES), **changes}


class Gpulab:
    """``gpulab`` as its entry point runs it (``gpulab.cli.main``), in this process with its
    own state dir (and cache dir and PATH, when a test sets them)."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
        self.tmp = tmp
        self.env = monkeypatch
        self.capsys = capsys
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp / "state"))
        monkeypatch.delenv("GPULAB_PORT_OFFSET", raising=False)  # the spec's ports, as bound

    def write(self, text: str, name: str = "spec.yaml") -> Path:
        path = self.tmp / name
        path.write_text(text)
        return path

    def run(self, *args: str) -> tuple[int, str, str]:
        rc = cli.main(list(args))
        out, err = self.capsys.readouterr()
        return rc, out, err

    def up_fails(self, spec_path: Path) -> str:
        """``gpulab up`` fails with one error line after its progress lines and starts
        nothing; that line."""
        rc, out, err = self.run("up", "--spec", str(spec_path))
        assert rc != 0, out
        lines = (out + err).strip().splitlines()
        errors = [line for line in lines if line.startswith("gpulab: error: ")]
        assert errors == lines[-1:], lines  # one error line, the last one
        assert all(line.startswith("==> ") for line in lines[:-1]), lines  # progress
        rc, out, err = self.run("status", "--spec", str(spec_path))
        if rc == 1 and "is not running" in out + err:
            state = self.tmp / "state" / "gpulab" / NAME / "state.json"
            assert not state.exists() or '"pid"' not in state.read_text()
        else:  # the spec does not load: nothing could have started
            assert rc == 2 and "gpulab: error: " in err
        return lines[-1].removeprefix("gpulab: error: ")


@pytest.fixture
def gpulab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> Gpulab:
    return Gpulab(tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "name: gpulab-badinput\nnodes: [ {name: t4\n",
            r"spec.yaml: not valid YAML at line 3, column 1 \(.*\); fix it",
        ),
        (
            yaml.safe_dump(spec(node=NODES)),
            "the spec: unknown key 'node'; known keys: name, ports, nodes, addons, kubelet",
        ),
        (
            yaml.safe_dump(spec(nodes=[{"name": "t4", "profil": "t4-x1"}])),
            r"nodes\[0\] \(t4\): unknown key 'profil'; known keys: name, profile, ",
        ),
        (
            yaml.safe_dump(spec(nodes=[{"name": "t4", "profile": "a200-x8"}])),
            r"nodes\[0\] \(t4\): unknown GPU profile 'a200-x8'; use one of: .*t4-x4",
        ),
        (
            yaml.safe_dump(spec(ports={**PORTS, "scheduler": 33443})),
            "ports must all differ: apiserver and scheduler are both 33443; give each its own",
        ),
    ],
    ids=["yaml-error", "unknown-key", "unknown-node-key", "unknown-profile", "duplicate-ports"],
)
def test_a_broken_cluster_spec(gpulab: Gpulab, text: str, message: str) -> None:
    line = gpulab.up_fails(gpulab.write(text))
    assert re.search(message, line), line


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ([{"model": "T4", "memory": -16}], r"gpus\[0\]: unknown key 'memory'; known keys: model,"),
        ([{"model": "T4", "count": 0}], r"gpus\[0\]\.count must be a positive integer"),
        (
            [{"model": "A100-SXM4-40GB", "mig": ["3g.20gb", "3g.20gb", "1g.10gb"]}],
            r"3g\.20gb, 3g\.20gb, 1g\.10gb needs 10 memory slices; a NVIDIA A100-SXM4-40GB has 8",
        ),
        (
            [{"model": "A100-SXM4-40GB", "mig": ["1g.10gb"] * 5}],
            r"a NVIDIA A100-SXM4-40GB holds at most 4 x 1g\.10gb",
        ),
        ([{"model": "A100-SXM4-40GB", "mig": ["9g.1tb"]}], r"has no MIG profile '9g\.1tb'"),
    ],
    ids=["memory", "zero-gpus", "mig-memory", "mig-count", "mig-profile"],
)
def test_a_gpu_profile_with_impossible_values(
    gpulab: Gpulab, gpus: list[dict[str, Any]], message: str
) -> None:
    profile = gpulab.write(yaml.safe_dump({"gpus": gpus}), "impossible.yaml")
    text = yaml.safe_dump(spec(nodes=[{"name": "odd", "profile": str(profile)}]))
    line = gpulab.up_fails(gpulab.write(text))
    assert line.startswith(f"cluster spec {gpulab.tmp / 'spec.yaml'}: nodes[0] (odd): {profile}: ")
    assert re.search(message, line), line


def test_a_port_in_use(gpulab: Gpulab) -> None:
    """Checked before the binaries (a build can take minutes) and before anything runs."""
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", PORTS["apiserver"]))
        squatter.listen()
        path = gpulab.write(yaml.safe_dump(spec()))
        gpulab.env.setenv("XDG_CACHE_HOME", str(gpulab.tmp / "empty-cache"))  # never reached
        line = gpulab.up_fails(path)
    assert line == (
        "port 33443 (apiserver) on 127.0.0.1 is in use by another process; stop it "
        f"(`ss -ltnp 'sport = :33443'` shows which) or set ports.apiserver in {path}"
    )
    assert not (gpulab.tmp / "empty-cache" / "gpulab").exists()  # no build began


def test_a_missing_binary(gpulab: Gpulab) -> None:
    """An empty binary cache and no Go toolchain to build one."""
    empty = gpulab.tmp / "empty-cache"
    gpulab.env.setenv("XDG_CACHE_HOME", str(empty))
    go = shutil.which("go")
    path_dirs = os.environ["PATH"].split(os.pathsep)
    gpulab.env.setenv(
        "PATH", os.pathsep.join(d for d in path_dirs if not go or Path(d) != Path(go).parent)
    )
    line = gpulab.up_fails(gpulab.write(yaml.safe_dump(spec())))
    manifest = empty / "gpulab" / "bin"
    assert line.startswith(f"etcd v3.6.16 is not built yet (no {manifest}/etcd-v3.6.16/")
    assert "the Go toolchain (`go`) is not on PATH" in line and "install Go 1.26+" in line
