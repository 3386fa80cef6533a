"""LocalCluster's process records: a stopped process keeps its record (to be started
again, and counted by check_alive) unless it is forgotten."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.local import LocalCluster
from harness.spec import parse


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalCluster:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv("GPULAB_PORT_OFFSET", raising=False)
    return LocalCluster(
        parse({"name": "gpulab-records", "nodes": [{"name": "cpu", "profile": None}]})
    )


def sleeper(local: LocalCluster, name: str) -> None:
    local.start_process(name, [sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_stopped_process_is_still_counted_until_forgotten(local: LocalCluster) -> None:
    sleeper(local, "stays")
    sleeper(local, "peer")
    local.check_alive()
    local.stop_process("peer")
    assert [p.name for p in local.processes()] == ["stays", "peer"]  # restartable
    with pytest.raises(HarnessError, match="peer exited"):
        local.check_alive()
    sleeper(local, "peer")  # started again under its name: replaces the dead record
    local.check_alive()
    local.stop_process("peer", forget=True)
    assert [p.name for p in local.processes()] == ["stays"]
    local.check_alive()  # the forgotten peer no longer counts
    local.stop_process("stays", forget=True)
    assert local.processes() == []


def test_a_restart_waits_for_a_process_that_ignores_sigterm(
    local: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed after the grace period is gone before its replacement starts:
    one record, and check_alive does not report the old process's death later (seen with
    a kube-apiserver that took longer than the grace period to shut down under load)."""
    monkeypatch.setattr("harness.local.STOP_GRACE", 0.2)
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    local.start_process("stubborn", [sys.executable, "-c", stubborn])
    time.sleep(0.5)  # the handler is installed
    new = local.restart_process("stubborn")
    assert [(p.name, p.pid) for p in local.processes()] == [("stubborn", new.pid)]
    local.check_alive()
    local.stop_process("stubborn", forget=True)
