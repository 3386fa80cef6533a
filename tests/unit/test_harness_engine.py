"""The Docker engine the lab starts (harness/engine.py) and the runtime wrapper it registers
where the host's capability bounding set is short (harness/runc-capfilter), run as dockerd's
shim runs it: a subprocess with runc's arguments, a fake runc recording what it got."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from harness import engine

ALL_40 = (1 << 41) - 1
NO_SYS_RESOURCE = ALL_40 & ~(1 << 24)


def status(bounding: int) -> str:
    return f"Name:\tx\nCapInh:\t0000000000000000\nCapBnd:\t{bounding:016x}\n"


def test_missing_capabilities_are_the_bits_the_bounding_set_lacks() -> None:
    assert engine.missing_capabilities(status(ALL_40), last_cap=40) == []
    assert engine.missing_capabilities(status(NO_SYS_RESOURCE), last_cap=40) == [24]
    # every capability the kernel knows counts, up to cap_last_cap
    assert engine.missing_capabilities(status(ALL_40), last_cap=41) == [41]
    assert engine.capability_names([24, 12, 99]) == [
        "CAP_SYS_RESOURCE",
        "CAP_NET_ADMIN",
        "capability 99",
    ]


def test_dockerd_gets_the_wrapper_only_where_it_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    plain = engine.dockerd_argv(None)
    assert plain[:3] == ["dockerd", "--host", "unix:///var/run/docker.sock"]
    assert plain[plain.index("--data-root") + 1] == str(tmp_path / "cache/gpulab/docker")
    assert "--add-runtime" not in plain and "--default-runtime" not in plain
    wrapped = engine.dockerd_argv(Path("/x/runc-capfilter"))
    assert wrapped[-4:] == [
        "--add-runtime",
        "gpulab-runc=/x/runc-capfilter",
        "--default-runtime",
        "gpulab-runc",
    ]


@pytest.fixture
def fake_runc(tmp_path: Path) -> Path:
    """A `runc` on PATH that records its argv and the specs named in it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runc = bin_dir / "runc"
    runc.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\n')
    runc.chmod(runc.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def run_wrapper(fake_runc: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{fake_runc}:/usr/bin:/bin"}
    return subprocess.run(
        [str(engine.WRAPPER), *args], env=env, capture_output=True, text=True, check=False
    )


def spec_caps(names: list[str]) -> dict[str, list[str]]:
    return {k: list(names) for k in ("bounding", "effective", "permitted", "inheritable")}


def own_missing() -> set[str]:
    return set(engine.capability_names(engine.missing_capabilities()))


def test_the_wrapper_strips_what_the_host_lacks_at_create_and_exec(
    fake_runc: Path, tmp_path: Path
) -> None:
    """Whatever this host lacks is removed from both specs (on a host that lacks nothing,
    nothing is), the rest kept, and runc gets the same arguments."""
    every = engine.capability_names(list(range(41)))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(
        json.dumps({"ociVersion": "1.0.2", "process": {"capabilities": spec_caps(every)}})
    )
    argv = ["--root", "/run/r", "--log", "/l.json", "create", "--bundle", str(bundle), "c1"]
    assert run_wrapper(fake_runc, *argv).returncode == 0
    assert (tmp_path / "argv").read_text().split() == argv
    kept = json.loads((bundle / "config.json").read_text())["process"]["capabilities"]
    want = [n for n in every if n not in own_missing()]
    assert kept == spec_caps(want)

    process = tmp_path / "process.json"
    process.write_text(json.dumps({"args": ["sh"], "capabilities": spec_caps(every)}))
    exec_argv = ["--root", "/run/r", "exec", "--process", str(process), "--detach", "c1"]
    assert run_wrapper(fake_runc, *exec_argv).returncode == 0
    assert json.loads(process.read_text())["capabilities"] == spec_caps(want)
    assert (tmp_path / "argv").read_text().split() == exec_argv


def test_the_wrapper_strips_exactly_the_missing_capabilities(
    fake_runc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wrapper's own filter against a given bounding set (this host's may lack none)."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("capfilter", str(engine.WRAPPER))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    wrapper = importlib.util.module_from_spec(spec)
    loader.exec_module(wrapper)
    monkeypatch.setattr(wrapper, "missing", lambda: {"CAP_SYS_RESOURCE"})
    config = tmp_path / "config.json"
    names = ["CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_SYS_ADMIN"]
    config.write_text(json.dumps({"process": {"capabilities": spec_caps(names)}}))
    wrapper.strip(str(config), is_process_spec=False)
    kept = json.loads(config.read_text())["process"]["capabilities"]
    assert kept == spec_caps(["CAP_CHOWN", "CAP_SYS_ADMIN"])


def test_the_engine_is_stopped_only_when_its_last_user_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two kind clusters (two test workers) share the lab's dockerd: the first `down` must
    not stop it under the second; the last one does."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    started: list[str] = []
    stopped: list[str] = []
    answers = {"up": False}

    def start(progress: object) -> None:
        started.append("dockerd")
        answers["up"] = True

    monkeypatch.setattr(engine, "_answers", lambda: answers["up"])
    monkeypatch.setattr(engine, "_start", start)
    monkeypatch.setattr(engine, "_stop_if_idle", lambda progress: stopped.append("dockerd"))
    engine.ensure_engine(print, "gpulab-kind-e2e")
    engine.ensure_engine(print, "gpulab-kind-gpuop-e2e")
    assert started == ["dockerd"]  # the second user found it answering
    engine.release(print, "gpulab-kind-e2e")
    assert stopped == []
    engine.release(print, "gpulab-kind-gpuop-e2e")
    assert stopped == ["dockerd"]
