"""Volcano's job and queue controllers' pure parts, and the admission functions: pods and
PodGroup of a vcjob, lifecycle policies, the job and queue state machines, upstream's
webhook messages."""

from __future__ import annotations

import json
import re

import pytest

from gpulab.informer import Store
from gpulab.volcano import apis
from gpulab.volcano import objects as vo
from gpulab.volcano.controllers.job import helpers
from gpulab.volcano.controllers.job.state import KILL, RETAIN_SOFT, SYNC, next_step
from gpulab.volcano.controllers.queue import next_state, pod_group_counts
from gpulab.volcano.webhooks import jobs, queues

GPU = "nvidia.com/gpu"


def job(**kw: object) -> dict:
    body = vo.vcjob(
        "train",
        [vo.task("worker", 4, gpus=2), vo.task("ps", 1, cpu="2")],
        queue="team",
        **kw,  # type: ignore[arg-type]
    )
    body["metadata"].update(namespace="ns", uid="u-1")
    body["spec"]["minAvailable"] = body["spec"].get("minAvailable", 5)
    body["status"] = {"version": 2, "retryCount": 1}
    return body


def test_a_pod_is_named_annotated_and_labelled_as_upstream() -> None:
    j = job()
    pod = helpers.create_job_pod(j, j["spec"]["tasks"][0], 3)
    meta = pod["metadata"]
    assert meta["name"] == "train-worker-3"
    assert meta["ownerReferences"][0]["kind"] == "Job" and meta["ownerReferences"][0]["controller"]
    assert meta["annotations"] == {
        apis.TASK_INDEX: "3",
        apis.TASK_SPEC_KEY: "worker",
        apis.KUBE_GROUP_NAME_ANNOTATION: "train-u-1",
        apis.JOB_NAME_KEY: "train",
        apis.QUEUE_NAME_KEY: "team",
        apis.JOB_VERSION: "2",
        apis.POD_TEMPLATE_KEY: "train-worker",
        apis.JOB_RETRY_COUNT_KEY: "1",
    }
    assert meta["labels"] == {
        apis.TASK_INDEX: "3",
        apis.JOB_NAME_KEY: "train",
        apis.TASK_SPEC_KEY: "worker",
        apis.JOB_NAMESPACE_KEY: "ns",
        apis.QUEUE_NAME_KEY: "team",
    }
    assert pod["spec"]["schedulerName"] == "volcano"


def test_the_pod_group_carries_min_member_and_the_first_pods_resources() -> None:
    j = job(min_available=3)
    for t in j["spec"]["tasks"]:
        t["minAvailable"] = 1
    pg = helpers.new_pod_group(j, {})
    assert pg["metadata"]["name"] == "train-u-1"
    spec = pg["spec"]
    assert spec["minMember"] == 3 and spec["queue"] == "team"
    assert spec["minTaskMember"] == {"worker": 1, "ps": 1}
    # minAvailable 3 >= the tasks' own (1 + 1): one worker, the ps, then one more worker
    assert spec["minResources"][GPU] == "4"
    assert spec["minResources"]["cpu"] == "4"
    assert spec["minResources"]["pods"] == "3"
    assert spec["minResources"]["requests.nvidia.com/gpu"] == "4"


def test_fewer_min_available_than_the_tasks_counts_the_first_pods() -> None:
    j = job(min_available=2)  # tasks' minAvailable unset: 4 + 1 > 2
    assert helpers.calc_pg_min_resources(j)[GPU] == "4"


@pytest.mark.parametrize(
    ("request_", "want"),
    [
        ({"event": apis.POD_EVICTED_EVENT, "job_version": 2}, (apis.RESTART_JOB, 0.0)),
        ({"event": apis.POD_EVICTED_EVENT, "job_version": 1}, (apis.SYNC_JOB, 0.0)),  # outdated
        ({"event": apis.POD_FAILED_EVENT, "job_version": 2, "task": "ps"}, (apis.ABORT_JOB, 0.0)),
        ({"event": apis.POD_PENDING_EVENT, "job_version": 2}, (apis.SYNC_JOB, 0.0)),
        ({"event": apis.OUT_OF_SYNC_EVENT, "job_version": 2}, (apis.SYNC_JOB, 0.0)),
        ({"action": apis.RESUME_JOB}, (apis.RESUME_JOB, 0.0)),
        (
            {"event": apis.POD_FAILED_EVENT, "job_version": 2, "exit_code": 3},
            (apis.TERMINATE_JOB, 90.0),
        ),
    ],
)
def test_apply_policies(request_: dict, want: tuple[str, float]) -> None:
    j = job(
        policies=[
            {"event": apis.POD_EVICTED_EVENT, "action": apis.RESTART_JOB},
            {"exitCode": 3, "action": apis.TERMINATE_JOB, "timeout": "1m30s"},
        ]
    )
    j["spec"]["tasks"][1]["policies"] = [{"event": apis.POD_FAILED_EVENT, "action": apis.ABORT_JOB}]
    assert helpers.apply_policies(j, request_) == want


def test_a_job_hashes_to_one_worker_queue_as_gos_fnv32() -> None:
    # FNV-1 32-bit test vectors (Go's hash/fnv New32)
    assert helpers.fnv32(b"") == 0x811C9DC5
    assert helpers.fnv32(b"a") == 0x050C5D7E
    assert helpers.fnv32(b"foobar") == 0x31F0B262


def test_the_job_state_machine() -> None:
    running = {"minAvailable": 2, "tasks": [{"name": "w", "replicas": 3}]}
    j = {"spec": {**running, "maxRetry": 3}}
    step = next_step(apis.JOB_PENDING, apis.SYNC_JOB)
    status = {"running": 2}
    assert step.kind == SYNC and step.update is not None and step.update(j, status)
    assert status["state"]["phase"] == apis.JOB_RUNNING
    step = next_step(apis.JOB_RUNNING, apis.RESTART_JOB)
    status = {"retryCount": 0}
    assert step.kind == KILL and step.update is not None and step.update(j, status)
    assert status["state"]["phase"] == apis.JOB_RESTARTING and status["retryCount"] == 1
    step = next_step(apis.JOB_RESTARTING, apis.SYNC_JOB)
    status = {"retryCount": 1, "terminating": 0, "minAvailable": 2}
    assert step.update is not None and step.update(j, status)
    assert status["state"]["phase"] == apis.JOB_PENDING
    status = {"retryCount": 3}
    assert step.update(j, status) and status["state"]["phase"] == apis.JOB_FAILED
    step = next_step(apis.JOB_RUNNING, apis.SYNC_JOB)
    status = {"succeeded": 3}
    assert step.update is not None and step.update(j, status)
    assert status["state"]["phase"] == apis.JOB_COMPLETED
    step = next_step(apis.JOB_RUNNING, apis.ABORT_JOB)
    assert step.kind == KILL and step.retain == RETAIN_SOFT
    assert next_step(apis.JOB_COMPLETED, apis.SYNC_JOB).update is None


@pytest.mark.parametrize(
    ("current", "action", "has_pgs", "want"),
    [
        ("", apis.SYNC_QUEUE, False, apis.QUEUE_OPEN),
        (apis.QUEUE_OPEN, apis.CLOSE_QUEUE, True, apis.QUEUE_CLOSING),
        (apis.QUEUE_OPEN, apis.CLOSE_QUEUE, False, apis.QUEUE_CLOSED),
        (apis.QUEUE_CLOSED, apis.SYNC_QUEUE, True, apis.QUEUE_CLOSED),
        (apis.QUEUE_CLOSING, apis.SYNC_QUEUE, False, apis.QUEUE_CLOSED),
        (apis.QUEUE_CLOSED, apis.OPEN_QUEUE, False, apis.QUEUE_OPEN),
    ],
)
def test_the_queue_state_machine(current: str, action: str, has_pgs: bool, want: str) -> None:
    assert next_state(current, current, action, has_pgs) == want


def test_pod_groups_are_counted_by_phase_per_queue() -> None:
    pgs = [
        vo.podgroup("a", queue="q", phase=apis.PG_INQUEUE),
        vo.podgroup("b", queue="q", phase=apis.PG_RUNNING),
        vo.podgroup("c", queue="other", phase=apis.PG_RUNNING),
    ]
    counts = pod_group_counts(pgs, "q")
    assert counts[apis.PG_INQUEUE] == 1 and counts[apis.PG_RUNNING] == 1


# -- admission -----------------------------------------------------------------------------

OPEN = {"status": {"state": "Open"}}


def queue_lookup(name: str) -> dict | None:
    return {"default": OPEN, "team": OPEN, "shut": {"status": {"state": "Closed"}}}.get(name)


def test_mutate_fills_upstreams_defaults() -> None:
    body = vo.vcjob("j", [vo.task("", 2)])
    body["spec"].pop("schedulerName")
    patch = {p["path"]: p["value"] for p in jobs.mutate_patch(body)}
    assert patch["/spec/queue"] == "default"
    assert patch["/spec/schedulerName"] == "volcano"
    assert patch["/spec/maxRetry"] == 3
    assert patch["/spec/minAvailable"] == 2
    task = patch["/spec/tasks"][0]
    assert (task["name"], task["minAvailable"], task["maxRetry"]) == ("default0", 2, 3)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda j: j["spec"].update(minAvailable=9),
            "job 'minAvailable' should not be greater than total replicas in tasks;",
        ),
        (
            lambda j: j["spec"]["tasks"].append(dict(j["spec"]["tasks"][0])),
            "duplicated task name w;",
        ),
        (
            lambda j: j["spec"].update(queue="nope"),
            'unable to find job queue: queue.scheduling.volcano.sh "nope" not found;',
        ),
        (
            lambda j: j["spec"].update(queue="shut"),
            "can only submit job to queue with state `Open`, queue `shut` status is `Closed`;",
        ),
        (
            lambda j: j["spec"]["tasks"][0].update(minAvailable=5),
            "'minAvailable' is greater than 'replicas' in task: w, job: j;",
        ),
        (lambda j: j["spec"].update(plugins={"sshh": []}), "unable to find job plugin: sshh;"),
        (lambda j: j["spec"].update(tasks=[]), "No task specified in job spec"),
    ],
)
def test_validate_answers_with_upstreams_message(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    body = vo.vcjob("j", [vo.task("w", 2)], queue="team", min_available=2)
    mutate(body)
    assert jobs.validate_job_create(body, queue_lookup).strip().endswith(message)


def test_a_valid_job_is_admitted_and_an_update_may_only_scale() -> None:
    body = vo.vcjob("j", [vo.task("w", 2)], queue="team", min_available=2)
    assert jobs.validate_job_create(body, queue_lookup) == ""
    scaled = vo.vcjob("j", [vo.task("w", 3)], queue="team", min_available=3)
    assert jobs.validate_job_update(body, scaled) == ""
    moved = vo.vcjob("j", [vo.task("w", 2)], queue="default", min_available=2)
    assert jobs.validate_job_update(body, moved).startswith("job updates may not change fields")


def test_policy_messages_are_upstreams() -> None:
    body = vo.vcjob("j", [vo.task("w", 2)], queue="team", min_available=2)
    body["spec"]["policies"] = [
        {"event": "PodFailed", "action": "RestartJob"},
        {"event": "PodFailed", "action": "AbortJob"},
    ]
    message = jobs.validate_job_create(body, queue_lookup)
    assert message.startswith(
        "1 error occurred:\n\t* duplicate event PodFailed  across different policy"
    )
    # upstream prints getValidEvents() / getValidActions(), built from Go maps: any order
    found = re.search(r"valid events are \[(.*)\], valid actions are \[(.*)\];$", message)
    assert found is not None, message
    assert set(found.group(1).split(" ")) == {
        "*", "PodFailed", "PodEvicted", "PodPending", "Unknown", "TaskCompleted", "TaskFailed",
        "JobUpdated",
    }  # fmt: skip
    assert set(found.group(2).split(" ")) == {
        "AbortJob", "RestartJob", "RestartTask", "RestartPod", "RestartPartition",
        "TerminateJob", "CompleteJob", "ResumeJob",
    }  # fmt: skip


def test_queue_admission() -> None:
    assert queues.mutate_patch({"spec": {}}) == [
        {"op": "add", "path": "/spec/reclaimable", "value": True},
        {"op": "add", "path": "/spec/weight", "value": 1},
    ]
    store = Store()
    store.replace([vo.queue("default"), vo.queue("team")])
    assert queues.validate_delete("default", store) == "`default` queue can not be deleted"
    assert queues.validate_delete("team", store) == ""


def test_a_deleted_pod_group_brings_its_job_back_on_the_same_worker_queue() -> None:
    from kubernetes import client

    from gpulab.trace import Tracer
    from gpulab.volcano.controllers.job.job_controller import JobController

    controller = JobController(client.ApiClient(), Tracer("test", None))
    pg = vo.podgroup("a-train-1234", "team-a")
    pg["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "a-train", "uid": "1"}
    ]
    controller._pod_group_deleted(pg)
    queue = controller._queue_of({"namespace": "team-a", "job": "a-train"})
    assert json.loads(queue.get(timeout=0.1) or "{}") == {
        "namespace": "team-a",
        "job": "a-train",
        "event": "",
    }
    assert all(len(q) == 0 for q in controller.work_queues)
