"""harness/podrunner/status.py: kubelet's getPhase and the pod conditions."""

from __future__ import annotations

from harness.podrunner.status import ContainerStatus, phase, pod_status

RUNNING = {"running": {"startedAt": "2026-12-01T00:00:00Z"}}


def c(
    name: str,
    state: dict | None = None,
    last: dict | None = None,
    ready: bool = False,
    init: bool = False,
) -> ContainerStatus:
    out = ContainerStatus(name, "gpulab:dev", init=init, ready=ready)
    if state is not None:
        out.state = state
    if last is not None:
        out.last_state = last
    return out


def done(code: int) -> dict:
    return {"terminated": {"exitCode": code}}


def test_phase_waits_for_init_containers() -> None:
    assert phase("Always", [c("init")], [c("app", RUNNING)]) == "Pending"
    assert phase("Always", [c("init", done(0), init=True)], [c("app", RUNNING)]) == "Running"
    # a failed init container with restartPolicy Never fails the pod
    assert phase("Never", [c("init", done(1), init=True)], [c("app")]) == "Failed"
    assert phase("Always", [c("init", done(1), init=True)], [c("app")]) == "Pending"


def test_phase_of_stopped_containers_follows_the_restart_policy() -> None:
    crashed = c("app", {"waiting": {"reason": "CrashLoopBackOff"}}, last=done(1))
    assert phase("Always", [], [crashed]) == "Running"
    assert phase("OnFailure", [], [c("app", done(0))]) == "Succeeded"
    assert phase("OnFailure", [], [c("app", done(2))]) == "Running"
    assert phase("Never", [], [c("a", done(0)), c("b", done(3))]) == "Failed"
    assert phase("Never", [], [c("a", done(0))]) == "Succeeded"
    assert phase("Always", [], [c("a", RUNNING), c("b")]) == "Pending"


def test_conditions_and_lists() -> None:
    pod = {
        "spec": {"restartPolicy": "Always"},
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t0"},
                {"type": "Initialized", "status": "True", "lastTransitionTime": "t1"},
            ]
        },
    }
    status = pod_status(
        pod,
        [],
        [c("a", RUNNING, ready=True), c("b", RUNNING)],
        "127.20.128.9",
        "127.0.0.1",
        "t",
        True,
    )
    conds = {x["type"]: x for x in status["conditions"]}
    assert conds["Initialized"]["lastTransitionTime"] == "t1"  # unchanged: time kept
    assert conds["Ready"]["status"] == "False"
    assert conds["Ready"]["message"] == "containers with unready status: [b]"
    assert conds["PodScheduled"]["lastTransitionTime"] == "t0"
    assert status["podIP"] == "127.20.128.9"
    assert [x["name"] for x in status["containerStatuses"]] == ["a", "b"]
    assert "initContainerStatuses" not in status
