"""up / down of a second, tiny cluster: start-up errors leave nothing behind; down frees all."""

from __future__ import annotations

import socket

import pytest

from gpulab.wait import wait_for
from harness.errors import HarnessError
from harness.local import LocalCluster, pid_alive
from harness.ports import port_in_use
from harness.spec import parse

# brings local clusters up and down
pytestmark = pytest.mark.local_backend

SPEC = {
    "name": "gpulab-lifecycle",
    "ports": {
        "apiserver": 25443,
        "etcd": 25379,
        "etcdPeer": 25380,
        "controllerManager": 25257,
        "scheduler": 25259,
    },
    "nodes": [{"name": "t4", "profile": "t4-x1"}],
}


def test_up_then_down_leaves_no_process_and_no_port() -> None:
    local = LocalCluster(parse(SPEC))
    local.up(print)
    try:
        procs = local.processes()
        assert {p.name for p in procs} == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
            "pod-runner",
            "node-agent-t4",  # kubelet's device manager of the one GPU node
        }
        assert all(pid_alive(p.pid, p.exe) for p in procs)
        assert local.running()
    finally:
        local.down(print)
    assert not any(pid_alive(p.pid, p.exe) for p in procs)
    assert not any(port_in_use(port) for port in parse(SPEC).ports.values())
    assert local.processes() == []


def test_port_in_use_is_one_line_and_starts_nothing() -> None:
    spec = parse({**SPEC, "name": "gpulab-busy"})
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", spec.ports["etcd"]))  # with $GPULAB_PORT_OFFSET applied
        squatter.listen()
        local = LocalCluster(spec)
        with pytest.raises(HarnessError) as exc:
            local.up(print)
    message = str(exc.value)
    assert f"port {spec.ports['etcd']} (etcd) on 127.0.0.1 is in use" in message
    assert "set ports.etcd" in message and "\n" not in message
    assert local.processes() == []
    assert not port_in_use(spec.ports["apiserver"])


def test_a_component_dying_at_start_up_is_reported_and_cleaned_up() -> None:
    spec = parse({**SPEC, "name": "gpulab-dies"})
    local = LocalCluster(spec)
    local.up(print)
    try:
        with pytest.raises(HarnessError, match=r"exited during start-up: .*log: "):
            rec = local.start_process("broken", ["/bin/sh", "-c", "echo boom; exit 3"])
            wait_for(lambda: not pid_alive(rec.pid, rec.exe), 10, "the broken process to exit")
            local.check_alive()
    finally:
        local.down(print)
    assert not any(port_in_use(port) for port in parse(SPEC).ports.values())
