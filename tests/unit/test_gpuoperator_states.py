"""The state walk of gpu-operator v26.7.0's Reconcile, with fake controls: every state in
upstream's order on every pass, not-ready ones collected, never stopping the walk."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpulab.gpuoperator import api, states
from gpulab.gpuoperator.states import ClusterPolicyController

DEVICE_PLUGIN_OFF = {"devicePlugin": {"enabled": False}}


def controller(statuses: dict[str, str], spec: dict[str, Any] | None = None) -> tuple:
    """A controller whose every state has one control returning ``statuses[state]``
    (ready by default); ``calls`` records the order the controls ran in."""
    calls: list[str] = []
    ctrl = ClusterPolicyController(singleton={"spec": spec or {}})
    for name in states.STATES:

        def control(n: ClusterPolicyController, name: str = name) -> str:
            calls.append(name)
            return statuses.get(name, api.READY)

        ctrl.add_state(name, [control])
    return ctrl, calls


# NVIDIA/gpu-operator v26.7.0 (10ee5b3) controllers/state_manager.go (blob d49c311) lines
# 798-818, ClusterPolicyController.init, verbatim: `git show
# v26.7.0:controllers/state_manager.go | sed -n 798,818p` prints the same text.
STATE_MANAGER_INIT_V26_7_0 = """
		addState(n, "/opt/gpu-operator/pre-requisites")
		addState(n, "/opt/gpu-operator/state-operator-metrics")
		addState(n, "/opt/gpu-operator/state-driver")
		addState(n, "/opt/gpu-operator/state-container-toolkit")
		addState(n, "/opt/gpu-operator/state-operator-validation")
		addState(n, "/opt/gpu-operator/state-device-plugin")
		addState(n, "/opt/gpu-operator/state-mps-control-daemon")
		addState(n, "/opt/gpu-operator/state-dcgm")
		addState(n, "/opt/gpu-operator/state-dcgm-exporter")
		addState(n, "/opt/gpu-operator/gpu-feature-discovery")
		addState(n, "/opt/gpu-operator/state-mig-manager")
		addState(n, "/opt/gpu-operator/state-node-status-exporter")
		// add sandbox workload states
		addState(n, "/opt/gpu-operator/state-vgpu-manager")
		addState(n, "/opt/gpu-operator/state-vgpu-device-manager")
		addState(n, "/opt/gpu-operator/state-sandbox-validation")
		addState(n, "/opt/gpu-operator/state-vfio-manager")
		addState(n, "/opt/gpu-operator/state-sandbox-device-plugin")
		addState(n, "/opt/gpu-operator/state-kata-device-plugin")
		addState(n, "/opt/gpu-operator/state-kata-manager")
		addState(n, "/opt/gpu-operator/state-cc-manager")
"""


def test_the_states_are_the_releases_addstate_calls_in_their_order() -> None:
    release = re.findall(r'addState\(n, "/opt/gpu-operator/([^"]+)"\)', STATE_MANAGER_INIT_V26_7_0)
    assert len(release) == 20
    assert tuple(release) == states.STATES


def test_a_pass_walks_every_state_in_order_even_after_a_not_ready_one() -> None:
    ctrl, calls = controller({"state-driver": api.NOT_READY, "state-dcgm": api.NOT_READY})
    seen: list[tuple[str, str]] = []
    result = states.walk(ctrl, lambda s, st: seen.append((s, st)))
    assert calls == list(states.STATES)  # the first not-ready state does not stop the walk
    assert result.not_ready == ["state-driver", "state-dcgm"]
    assert seen == list(result.statuses)
    assert ctrl.last()
    end = states.outcome(result, has_nfd_labels=True, has_gpu_nodes=True)
    assert end.state == api.NOT_READY
    assert end.requeue_after == 5.0
    assert end.condition == (
        api.COND_ERROR,
        api.OPERAND_NOT_READY,
        "ClusterPolicy is not ready; states not ready: [state-driver state-dcgm]",
    )


def test_every_pass_starts_again_from_the_first_state() -> None:
    ctrl, calls = controller({})
    states.walk(ctrl)
    states.walk(ctrl)
    assert calls == list(states.STATES) * 2


def test_a_state_is_as_ready_as_its_least_ready_control() -> None:
    ctrl = ClusterPolicyController()
    ctrl.add_state(
        "state-driver",
        [lambda n: api.READY, lambda n: api.NOT_READY, lambda n: api.READY],
    )
    assert ctrl.step() == api.NOT_READY and ctrl.last()


@pytest.mark.parametrize(
    ("nfd", "gpus", "reason", "requeue"),
    [
        (True, True, api.RECONCILED, None),
        (True, False, api.NO_GPU_NODES, None),
        (False, False, api.NFD_LABELS_MISSING, 45.0),
    ],
)
def test_all_ready_is_ready_with_upstreams_reason(
    nfd: bool, gpus: bool, reason: str, requeue: float | None
) -> None:
    ctrl, _ = controller({})
    end = states.outcome(states.walk(ctrl), has_nfd_labels=nfd, has_gpu_nodes=gpus)
    assert (end.state, end.condition[:2], end.requeue_after) == (
        api.READY,
        (api.COND_READY, reason),
        requeue,
    )


def test_an_api_error_stops_the_pass_at_its_state() -> None:
    def broken(n: ClusterPolicyController) -> str:
        raise RuntimeError("409 Conflict")

    ctrl, calls = controller({})
    ctrl.controls[3] = [broken]
    with pytest.raises(RuntimeError):
        states.walk(ctrl)
    assert calls == list(states.STATES[:3])
    assert ctrl.state_names[ctrl.idx] == "state-container-toolkit"


@pytest.mark.parametrize(
    ("state", "spec", "enabled"),
    [
        ("state-device-plugin", {}, True),
        ("state-device-plugin", DEVICE_PLUGIN_OFF, False),
        ("state-mps-control-daemon", DEVICE_PLUGIN_OFF, False),
        ("state-dcgm", {}, True),  # DCGMSpec.IsEnabled: true when unset
        ("state-dcgm", {"dcgm": {"enabled": False}}, False),
        ("state-node-status-exporter", {}, False),
        ("state-operator-validation", DEVICE_PLUGIN_OFF, True),
        ("state-vfio-manager", {"vfioManager": {"enabled": True}}, False),  # needs sandbox
        ("state-vfio-manager", {"vfioManager": {"enabled": True},
                                "sandboxWorkloads": {"enabled": True}}, True),
        ("state-sandbox-validation", {"sandboxWorkloads": {"enabled": True}}, True),
        ("state-kata-device-plugin", {"sandboxWorkloads": {"enabled": True, "mode": "kata"},
                                      "kataSandboxDevicePlugin": {"enabled": True}}, True),
        ("state-kata-manager", {"sandboxWorkloads": {"enabled": True},
                                "kataManager": {"enabled": True}}, False),
        ("pre-requisites", {"cdi": {"nriPluginEnabled": True}}, False),
    ],
)  # fmt: skip
def test_is_state_enabled(state: str, spec: dict, enabled: bool) -> None:
    assert states.is_state_enabled(state, spec) is enabled


def test_a_state_without_objects_reports_disabled_or_ready() -> None:
    ctrl = ClusterPolicyController(singleton={"spec": {}})
    ctrl.add_state("state-node-status-exporter", [])
    ctrl.add_state("state-mps-control-daemon", [])
    assert states.walk(ctrl).statuses == (
        ("state-node-status-exporter", api.DISABLED),
        ("state-mps-control-daemon", api.READY),
    )


def test_conditions_pair_ready_and_error_and_keep_transition_times() -> None:
    ready = states.conditions([], api.COND_READY, api.RECONCILED, "all good", "t1")
    assert [(c["type"], c["status"], c["reason"]) for c in ready] == [
        ("Ready", "True", "Reconciled"),
        ("Error", "False", "Ready"),
    ]
    again = states.conditions(ready, api.COND_READY, api.RECONCILED, "still", "t2")
    assert {c["lastTransitionTime"] for c in again} == {"t1"}
    failed = states.conditions(again, api.COND_ERROR, api.OPERAND_NOT_READY, "driver", "t3")
    by_type = {c["type"]: c for c in failed}
    assert by_type["Ready"] == {
        "type": "Ready", "status": "False", "reason": "Error", "message": "",
        "lastTransitionTime": "t3",
    }  # fmt: skip
    assert by_type["Error"]["message"] == "driver"


def _policy(name: str, created: str) -> dict:
    return {"metadata": {"name": name, "creationTimestamp": created}}


def test_the_oldest_clusterpolicy_is_the_singleton_name_breaks_ties() -> None:
    policies = [
        _policy("b", "2026-01-02T00:00:00Z"),
        _policy("z", "2026-01-01T00:00:00Z"),
        _policy("a", "2026-01-02T00:00:00Z"),
    ]
    assert api.singleton(policies)["metadata"]["name"] == "z"
    assert api.singleton(policies[::2])["metadata"]["name"] == "a"
    assert api.singleton([]) is None
