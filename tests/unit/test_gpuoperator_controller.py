"""ClusterPolicyReconciler.Reconcile of gpu-operator v26.7.0 (clusterpolicy_controller.go)
against in-memory caches, fake controls and a fake status API: the singleton walked,
every other ClusterPolicy ignored, the status and conditions written as updateCRState
and SetConditions do, the requeue, the metrics."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from test_gpuoperator_migmanager import Steps

from gpulab.gpuoperator import api, controller, nodelabels, states
from gpulab.gpuoperator.states import ClusterPolicyController
from gpulab.informer import Store

NS = "gpu-operator"
GPU_NODE = {"metadata": {"name": "gpu-a100", "resourceVersion": "1", "labels": {
    "feature.node.kubernetes.io/pci-10de.present": "true", nodelabels.COMMON_GPU_LABEL: "true",
}}}  # fmt: skip


def policy(name: str, created: str, state: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "nvidia.com/v1", "kind": api.KIND, "metadata": {
        "name": name, "uid": f"uid-{name}", "creationTimestamp": created, "resourceVersion": "1",
    }, "spec": {}}  # fmt: skip
    if state:
        out["status"] = {"state": state}
    return out


class FakeCustom:
    """ClusterPolicies as the API server serves them; status writes recorded. ``conflicts``
    PUTs fail with 409 first."""

    def __init__(self, *policies: dict[str, Any], conflicts: int = 0) -> None:
        self.objects = {p["metadata"]["name"]: copy.deepcopy(p) for p in policies}
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.conflicts = conflicts

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str) -> Any:
        if name not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.objects[name])

    def replace_cluster_custom_object_status(
        self, group: str, version: str, plural: str, name: str, body: dict[str, Any]
    ) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise ApiException(status=409, reason="Conflict")
        self.writes.append((name, copy.deepcopy(body["status"])))
        self.objects[name] = body


def reconciler(
    custom: FakeCustom, statuses: dict[str, str] | None = None
) -> tuple[controller.ClusterPolicyReconciler, Steps, list[str]]:
    """A reconciler whose caches hold ``custom``'s ClusterPolicies and one GPU node, and
    whose every state has one control answering ``statuses[state]`` (ready by default)."""
    steps = Steps()
    r = controller.ClusterPolicyReconciler(
        client.ApiClient(),
        NS,
        "gpulab:dev",
        steps,
        controller.OperatorMetrics(),  # type: ignore[arg-type]
    )
    r.custom = custom  # type: ignore[assignment]
    r.policies, r.nodes = Store(), Store()
    r.policies.replace(list(custom.objects.values()))
    r.nodes.replace([GPU_NODE])
    walked: list[str] = []
    for state in states.STATES:

        def control(n: ClusterPolicyController, state: str = state) -> str:
            walked.append(f"{n.singleton['metadata']['name']}:{state}")
            return (statuses or {}).get(state, api.READY)

        r.ctrl.add_state(state, [control])
    return r, steps, walked


def _value(metric: Any) -> float:
    return metric._value.get()


def test_the_singleton_is_walked_and_made_ready() -> None:
    custom = FakeCustom(policy("cluster-policy", "2026-01-01T00:00:00Z"))
    r, steps, walked = reconciler(custom)
    assert r.Reconcile("cluster-policy") is None  # ready: no requeue
    assert walked == [f"cluster-policy:{s}" for s in states.STATES]
    ((name, status),) = custom.writes
    assert (name, status["state"], status["namespace"]) == ("cluster-policy", api.READY, NS)
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions == {"Ready": ("True", api.RECONCILED), "Error": ("False", "Ready")}
    assert _value(r.metrics.status) == controller.STATUS_SUCCESS
    assert _value(r.metrics.gpu_nodes_total) == 1 and _value(r.metrics.has_nfd_labels) == 1
    assert steps[-1]["step"] == "Reconcile" and steps[-1]["message"].startswith(
        "status.state ready"
    )
    # a second pass changes nothing: no status write
    r.Reconcile("cluster-policy")
    assert len(custom.writes) == 1
    # every state's status is traced once, when it first comes
    assert [s["message"] for s in steps if s["step"] == "step"] == [
        f"{s}: ready" for s in states.STATES
    ]


def test_a_state_not_ready_makes_the_policy_not_ready_and_requeues_after_5s() -> None:
    custom = FakeCustom(policy("cluster-policy", "2026-01-01T00:00:00Z"))
    r, steps, walked = reconciler(custom, {"state-driver": api.NOT_READY})
    assert r.Reconcile("cluster-policy") == 5.0
    assert len(walked) == len(states.STATES)  # the walk does not stop at the driver
    status = custom.writes[-1][1]
    assert status["state"] == api.NOT_READY
    error = next(c for c in status["conditions"] if c["type"] == "Error")
    assert (error["status"], error["reason"], error["message"]) == (
        "True", api.OPERAND_NOT_READY,
        "ClusterPolicy is not ready; states not ready: [state-driver]",
    )  # fmt: skip
    assert _value(r.metrics.status) == controller.STATUS_NOT_READY
    assert _value(r.metrics.failed) == 1
    assert "states not ready: state-driver; requeue after 5s" in steps[-1]["message"]


def test_every_clusterpolicy_but_the_oldest_is_ignored_once() -> None:
    custom = FakeCustom(
        policy("cluster-policy", "2026-01-01T00:00:00Z"),
        policy("newer", "2026-02-01T00:00:00Z"),
    )
    r, steps, walked = reconciler(custom)
    assert r.Reconcile("newer") is None
    assert walked == []  # nothing of the newer one is applied
    assert custom.writes == [("newer", {"state": api.IGNORED, "namespace": NS})]
    assert steps[-1] == {
        "step": "Reconcile",
        "message": "ignored: ClusterPolicy cluster-policy is the active one (the oldest); only "
        "one ClusterPolicy is reconciled",
        "warning": True,
    }
    r.policies.replace([policy("cluster-policy", "2026-01-01T00:00:00Z"),
                        policy("newer", "2026-02-01T00:00:00Z", api.IGNORED)])  # fmt: skip
    r.Reconcile("newer")
    assert len(custom.writes) == 1  # already ignored: no second write


def test_a_deleted_clusterpolicy_only_marks_the_metric_unavailable() -> None:
    r, steps, walked = reconciler(FakeCustom())
    assert r.Reconcile("gone") is None
    assert walked == [] and steps == []
    assert _value(r.metrics.status) == controller.STATUS_UNAVAILABLE


def test_an_api_error_in_a_state_is_written_to_the_status_and_raised() -> None:
    """The error ends the pass (the work queue backs off and retries)."""
    custom = FakeCustom(policy("cluster-policy", "2026-01-01T00:00:00Z"))
    r, steps, _ = reconciler(custom)

    def broken(n: ClusterPolicyController) -> str:
        raise ApiException(status=409, reason="Conflict")

    r.ctrl.controls[states.STATES.index("state-device-plugin")] = [broken]
    with pytest.raises(ApiException):
        r.Reconcile("cluster-policy")
    status = custom.writes[-1][1]
    error = next(c for c in status["conditions"] if c["type"] == "Error")
    assert (status["state"], error["reason"]) == (api.NOT_READY, api.RECONCILE_FAILED)
    assert error["message"] == "Failed to reconcile state-device-plugin: 409 Conflict"
    assert steps[-1]["warning"]


def test_update_status_retries_conflicts_keeps_transition_times_and_ignores_deletion() -> None:
    custom = FakeCustom(policy("cluster-policy", "2026-01-01T00:00:00Z"), conflicts=2)
    r, _, _ = reconciler(custom)
    r._update_status("cluster-policy", api.READY, (api.COND_READY, api.RECONCILED, "ok"))
    assert len(custom.writes) == 1  # after two 409s
    first = {c["type"]: c["lastTransitionTime"] for c in custom.writes[0][1]["conditions"]}
    r._update_status("cluster-policy", api.READY, (api.COND_READY, api.RECONCILED, "still ok"))
    again = {c["type"]: c["lastTransitionTime"] for c in custom.writes[1][1]["conditions"]}
    assert again == first  # the message changed, the condition's status did not
    r._update_status("deleted-meanwhile", api.READY, None)  # 404: nothing to write
    assert len(custom.writes) == 2
