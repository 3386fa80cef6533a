"""The kueue addon's process bookkeeping: finding the controller, restarting it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulab.wait import wait_for
from harness.addons import kueue as addon
from harness.errors import HarnessError
from harness.local import LocalCluster, pid_alive
from harness.spec import parse


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    cluster = LocalCluster(parse({"name": "kueue-unit", "nodes": [{"name": "n"}]}))
    yield cluster
    for rec in cluster.processes():
        if pid_alive(rec.pid, rec.exe):
            os.killpg(rec.pid, signal.SIGKILL)


def test_a_cluster_without_the_addon_says_so(local: LocalCluster) -> None:
    with pytest.raises(HarnessError, match=r"runs no kueue-controller \(addon kueue not started\)"):
        addon.controller(local)


def test_restart_refuses_while_the_controller_runs(local: LocalCluster) -> None:
    rec = local.start_process(addon.NAME, ["sleep", "30"], ports=[1], service=addon.SERVICE)
    assert addon.controller(local) == rec
    with pytest.raises(HarnessError, match=rf"still runs \(pid {rec.pid}\)"):
        addon.restart(local)


def test_a_process_started_again_replaces_its_dead_record(local: LocalCluster) -> None:
    first = local.start_process(addon.NAME, ["sleep", "30"], ports=[1], service=addon.SERVICE)
    other = local.start_process("other", ["sleep", "30"])
    os.killpg(first.pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(first.pid, first.exe), 5, "the first process to die")
    second = local.start_process(addon.NAME, ["sleep", "30"], ports=[1], service=addon.SERVICE)
    assert [r.pid for r in local.processes()] == [other.pid, second.pid]
    assert local.running()  # no dead record left for check_alive to trip over
    assert local.apply_transform().service_ports == {addon.SERVICE: 1}
