"""Volcano's job controller with fake API clients: delayed policy actions cancelled as
upstream's CleanPodDelayActionsIfNeed / AddDelayActionForJob / cleanupDelayActions do,
TaskFailed from the task's restarts, RestartTask / RestartPod deleting the PodGroup, the
job plugins (env, svc, ssh, pytorch, mpi) on the pods and around them, and the one
Warning for a plugin the lab does not implement."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from volcano_helpers import FakeApi

from gpulab.trace import Tracer
from gpulab.volcano import apis
from gpulab.volcano import objects as vo
from gpulab.volcano.controllers.job import helpers, plugins
from gpulab.volcano.controllers.job.job_controller import JobController

Obj = dict[str, Any]
NS = "team"


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


@pytest.fixture
def controller(api: FakeApi) -> Iterator[JobController]:
    c = JobController(client.ApiClient(), Tracer("vc-controller-manager", stream=io.StringIO()))
    c.core = c.networking = c.custom = api  # type: ignore[assignment]
    c.core.api_client = api  # type: ignore[attr-defined]
    c.queues.store.apply("ADDED", vo.queue(NS))
    yield c
    for q in c.work_queues:
        q.shutdown()


def add_job(c: JobController, body: Obj, phase: str = apis.JOB_RUNNING) -> Obj:
    body["metadata"].update(namespace=NS, uid="job-uid", resourceVersion="1")
    body["status"] = {"state": {"phase": phase}, "version": 0}
    c.jobs.store.apply("ADDED", body)
    return body


def request(event: str, pod: str = "train-w-0", uid: str = "pod-1", **kw: Any) -> str:
    body = {
        "namespace": NS,
        "job": "train",
        "job_uid": "job-uid",
        "task": "w",
        "pod": pod,
        "pod_uid": uid,
        "event": event,
        "exit_code": 0,
        "job_version": 0,
        **kw,
    }
    return json.dumps(body, sort_keys=True)


def executed(c: JobController, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the actions the controller executes instead of executing them."""
    runs: list[str] = []
    monkeypatch.setattr(c, "execute", lambda _job, action, _req: runs.append(action))
    return runs


def fire(c: JobController) -> list[str]:
    """Every delayed request that comes due within a second, reconciled."""
    fired = []
    queue = c._queue_of({"namespace": NS, "job": "train"})
    while (key := queue.get(timeout=0.5)) is not None:
        queue.done(key)
        fired.append(key)
        c.reconcile(key)
    return fired


def policy_job(*policies: Obj) -> Obj:
    return vo.vcjob("train", [vo.task("w", 2)], queue=NS, min_available=2, policies=policies)


# -- delayed actions ----------------------------------------------------------------------------


def test_a_pod_that_leaves_pending_cancels_its_pending_timeout(
    controller: JobController, monkeypatch: pytest.MonkeyPatch
) -> None:
    """{PodPending, RestartJob, timeout}: a pod that starts in time restarts nothing."""
    runs = executed(controller, monkeypatch)
    add_job(
        controller, policy_job({"event": "PodPending", "action": "RestartJob", "timeout": "200ms"})
    )
    controller.reconcile(request(apis.POD_PENDING_EVENT))
    controller.reconcile(request(apis.POD_PENDING_EVENT))  # one timer per pod
    controller.reconcile(request(apis.POD_RUNNING_EVENT))
    assert len(fire(controller)) == 1
    assert apis.RESTART_JOB not in runs


def test_a_pending_timeout_fires_for_a_pod_that_stays_pending(
    controller: JobController, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: nothing cancels it, it runs once; the same name with another uid (a
    recreated pod) does not cancel the first pod's timer."""
    runs = executed(controller, monkeypatch)
    add_job(
        controller, policy_job({"event": "PodPending", "action": "RestartJob", "timeout": "200ms"})
    )
    controller.reconcile(request(apis.POD_PENDING_EVENT))
    controller.reconcile(request(apis.POD_FAILED_EVENT, uid="pod-2"))
    fire(controller)
    assert runs.count(apis.RESTART_JOB) == 1


def test_a_pod_that_runs_again_cancels_its_failed_timeout(
    controller: JobController, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = executed(controller, monkeypatch)
    add_job(
        controller, policy_job({"event": "PodFailed", "action": "RestartJob", "timeout": "200ms"})
    )
    controller.reconcile(request(apis.POD_FAILED_EVENT))
    controller.reconcile(request(apis.POD_RUNNING_EVENT))
    fire(controller)
    assert apis.RESTART_JOB not in runs


def test_an_action_that_ran_cancels_the_other_pods_timers(
    controller: JobController, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two pods wait for the same delayed RestartJob; the first that fires runs it, the
    second is cancelled (cleanupDelayActions) - the job restarts once, not twice."""
    runs = executed(controller, monkeypatch)
    add_job(
        controller, policy_job({"event": "PodPending", "action": "RestartJob", "timeout": "200ms"})
    )
    controller.reconcile(request(apis.POD_PENDING_EVENT, pod="train-w-0", uid="a"))
    controller.reconcile(request(apis.POD_PENDING_EVENT, pod="train-w-1", uid="b"))
    assert len(fire(controller)) == 2
    assert runs.count(apis.RESTART_JOB) == 1


def test_an_immediate_job_action_cancels_the_delayed_ones(
    controller: JobController, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = executed(controller, monkeypatch)
    add_job(
        controller,
        policy_job(
            {"event": "PodPending", "action": "AbortJob", "timeout": "200ms"},
            {"event": "PodEvicted", "action": "RestartJob"},
        ),
    )
    controller.reconcile(request(apis.POD_PENDING_EVENT, pod="train-w-1", uid="b"))
    controller.reconcile(request(apis.POD_EVICTED_EVENT))
    fire(controller)
    assert runs == [apis.RESTART_JOB]


def test_the_delay_event_says_the_timeout_as_go_prints_it(controller: JobController) -> None:
    add_job(
        controller, policy_job({"event": "PodPending", "action": "RestartJob", "timeout": "10m"})
    )
    controller.reconcile(request(apis.POD_PENDING_EVENT))
    log = controller.tracer._stream.getvalue()  # type: ignore[attr-defined]
    assert "Execute action RestartJob after 10m0s" in log


# -- TaskFailed, TaskCompleted -----------------------------------------------------------------


def task_pod(index: int, phase: str, restarts: int = 0) -> Obj:
    pod = helpers.create_job_pod(
        {"metadata": {"name": "train", "namespace": NS, "uid": "job-uid"}, "spec": {}},
        {"name": "w", "template": {"spec": {"containers": [{"name": "main"}]}}},
        index,
    )
    pod["metadata"]["uid"] = f"pod-{index}"
    pod["status"] = {"phase": phase, "containerStatuses": [{"restartCount": restarts}]}
    return pod


def queued(c: JobController) -> list[Obj]:
    queue = c._queue_of({"namespace": NS, "job": "train"})
    out = []
    while (key := queue.get(timeout=0.05)) is not None:
        queue.done(key)
        out.append(json.loads(key))
    return out


def test_restarts_reaching_the_tasks_max_retry_are_a_task_failed_event(
    controller: JobController,
) -> None:
    body = policy_job({"event": "TaskFailed", "action": "AbortJob"})
    body["spec"]["tasks"][0]["maxRetry"] = 3
    add_job(controller, body)
    controller._pod_added(task_pod(0, "Running", restarts=1))
    controller._pod_added(task_pod(1, "Running", restarts=1))
    queued(controller)
    controller._pod_updated(task_pod(1, "Running", restarts=1), task_pod(1, "Running", restarts=2))
    (req,) = queued(controller)
    assert req["event"] == apis.TASK_FAILED_EVENT
    job = controller.jobs.store.get(f"{NS}/train")
    assert helpers.apply_policies(job, req) == (apis.ABORT_JOB, 0.0)
    # below maxRetry it stays an ordinary update; a phase change wins over TaskFailed
    controller._pod_updated(task_pod(1, "Running", restarts=2), task_pod(1, "Running", restarts=1))
    assert queued(controller)[0]["event"] == apis.OUT_OF_SYNC_EVENT
    controller._pod_updated(task_pod(0, "Pending", restarts=5), task_pod(0, "Running", restarts=5))
    assert queued(controller)[0]["event"] == apis.POD_RUNNING_EVENT


def test_task_completed_counts_the_tasks_replicas() -> None:
    task = {"name": "w", "replicas": 3}
    two = [task_pod(i, "Succeeded") for i in range(2)]
    assert not helpers.task_completed(task, two)
    assert helpers.task_completed(task, [*two, task_pod(2, "Succeeded")])
    assert not helpers.task_failed({**task, "maxRetry": -1}, [task_pod(0, "Running", 99)])


# -- RestartTask, RestartPod -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "target", "killed"),
    [
        (apis.RESTART_TASK, {"task": "w"}, ["train-w-0", "train-w-1"]),
        (apis.RESTART_POD, {"task": "w", "pod": "train-w-0"}, ["train-w-0"]),
    ],
)
def test_restart_task_deletes_the_pod_group_too(
    controller: JobController, api: FakeApi, action: str, target: Obj, killed: list[str]
) -> None:
    """killPods deletes the PodGroup whatever it killed: the gang is enqueued again.
    RestartTask kills the task's pods, RestartPod only the pod the request names."""
    body = add_job(controller, vo.vcjob("train", [vo.task("w", 2), vo.task("ps", 1)], queue=NS))
    for i in range(2):
        controller._remember(task_pod(i, "Running"))
    controller.execute(body, action, target)
    deleted = [name for method, name in api.calls if method.startswith("delete")]
    assert deleted == [*killed, "train-job-uid"]


# -- plugins -------------------------------------------------------------------------------------


def pytorch_job(*args: str) -> Obj:
    body = vo.vcjob("train", [vo.task("master", 1), vo.task("worker", 3)], queue=NS)
    body["metadata"].update(namespace=NS, uid="job-uid")
    body["spec"]["plugins"] = {"pytorch": list(args), "svc": [], "env": []}
    return body


def env_of(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def made_pod(job: Obj, task: int, index: int) -> Obj:
    pod = helpers.create_job_pod(job, job["spec"]["tasks"][task], index)
    for plugin in plugins.of(job):
        plugin.on_pod_create(pod, job)
    return pod


def test_pytorch_gives_each_rank_its_world() -> None:
    job = pytorch_job("--master=master", "--worker=worker", "--port=23456")
    master, worker = made_pod(job, 0, 0), made_pod(job, 1, 2)
    m, w = env_of(master["spec"]["containers"][0]), env_of(worker["spec"]["containers"][0])
    assert (m["WORLD_SIZE"], m["RANK"], w["WORLD_SIZE"], w["RANK"]) == ("4", "0", "4", "3")
    assert m["MASTER_ADDR"] == w["MASTER_ADDR"] == "train-master-0.train"
    assert m["MASTER_PORT"] == "23456"
    assert worker["spec"]["containers"][0]["ports"] == [
        {"name": "pytorchjob-port", "containerPort": 23456}
    ]
    assert (w["VC_TASK_INDEX"], w["VK_TASK_INDEX"]) == ("2", "2")  # env
    assert w["VC_WORKER_HOSTS"] == {
        "configMapKeyRef": {"name": "train-svc", "key": "VC_WORKER_HOSTS"}
    }
    assert (worker["spec"]["hostname"], worker["spec"]["subdomain"]) == ("train-worker-2", "train")
    assert "initContainers" not in worker["spec"]
    waiting = made_pod(pytorch_job("--wait-master-enabled"), 1, 0)
    (init,) = waiting["spec"]["initContainers"]
    assert init["name"] == "wait-for-master" and init["image"] == "busybox:1.36.1"
    assert "nc -z train-master-0.train 23456" in init["command"][2]


def test_svc_and_ssh_create_their_objects_once_and_remove_them(api: FakeApi) -> None:
    job = pytorch_job()
    job["spec"]["plugins"] = {"svc": ["--disable-network-policy=false"], "ssh": []}
    for plugin in plugins.of(job):
        plugin.on_job_add(job, api)  # type: ignore[arg-type]
    hosts = api.objects[("config_map", "train-svc")]["data"]
    assert (
        hosts["VC_WORKER_HOSTS"] == "train-worker-0.train,train-worker-1.train,train-worker-2.train"
    )
    assert hosts["VC_MASTER_NUM"] == "1" and hosts["master.host"] == "train-master-0.train"
    service = api.objects[("service", "train")]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {apis.JOB_NAME_KEY: "train", apis.JOB_NAMESPACE_KEY: NS}
    assert ("network_policy", "train") in api.objects
    secret = api.objects[("secret", "train-ssh")]["stringData"]
    assert secret["id_rsa"].startswith("-----BEGIN RSA PRIVATE KEY-----")
    assert (
        secret["id_rsa.pub"].startswith("ssh-rsa ")
        and secret["authorized_keys"] == secret["id_rsa.pub"]
    )
    assert "Host train-worker-2\n  HostName train-worker-2.train\n  Port 22\n" in secret["config"]
    assert job["status"]["controlledResources"] == {"plugin-svc": "svc", "plugin-ssh": "ssh"}
    creates = len([c for c in api.calls if c[0].startswith("create")])
    for plugin in plugins.of(job):
        plugin.on_job_add(job, api)  # type: ignore[arg-type]
    assert len([c for c in api.calls if c[0].startswith("create")]) == creates
    for plugin in plugins.of(job):
        plugin.on_job_delete(job, api)  # type: ignore[arg-type]
    assert not api.objects and job["status"]["controlledResources"] == {}


def test_mpi_tells_the_master_its_workers() -> None:
    job = pytorch_job()
    job["spec"]["plugins"] = {"mpi": ["--port=2222"]}
    master = made_pod(job, 0, 0)["spec"]["containers"][0]
    assert env_of(master)["MPI_HOST"] == (
        "train-worker-0.train,train-worker-1.train,train-worker-2.train"
    )
    assert master["ports"] == [{"name": "mpijob-port", "containerPort": 2222}]
    assert "env" not in made_pod(job, 1, 0)["spec"]["containers"][0]


def test_plugin_flags_parse_as_gos_flag_package() -> None:
    defaults = {"master": "master", "port": 23456, "wait-master-enabled": False}
    assert plugins.parse_flags(
        "p", ["-master", "lead", "--port=1", "-wait-master-enabled"], defaults
    ) == {
        "master": "lead",
        "port": 1,
        "wait-master-enabled": True,
    }
    # an unknown flag stops the parse; what came before it stays
    assert plugins.parse_flags("p", ["--port=7", "--nope", "--master=x"], defaults)["port"] == 7
    assert (
        plugins.parse_flags("p", ["--port=7", "--nope", "--master=x"], defaults)["master"]
        == "master"
    )


def test_a_synced_job_creates_its_pods_through_the_plugins(
    controller: JobController, api: FakeApi
) -> None:
    job = pytorch_job("--master=master", "--worker=worker")
    job["status"] = {"state": {"phase": apis.JOB_PENDING}, "version": 0}
    job["metadata"]["resourceVersion"] = "1"
    controller.jobs.store.apply("ADDED", job)
    pg = helpers.new_pod_group(job, {})
    pg["status"] = {"phase": apis.PG_INQUEUE}
    controller.podgroups.store.apply("ADDED", pg)
    controller.reconcile(json.dumps({"namespace": NS, "job": "train", "event": "OutOfSync"}))
    pods = {name: body for (kind, name), body in api.objects.items() if kind == "pod"}
    assert sorted(pods) == ["train-master-0", *(f"train-worker-{i}" for i in range(3))]
    assert env_of(pods["train-worker-1"]["spec"]["containers"][0])["RANK"] == "2"
    assert ("service", "train") in api.objects and ("config_map", "train-svc") in api.objects


def test_a_plugin_the_lab_does_not_implement_is_a_warning_once(
    controller: JobController, api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tensorflow is accepted (as upstream) but not applied: one Warning PluginError on
    the Job naming it, however often the job is synced, and the pods are still created."""
    steps: list[tuple[str, str, bool]] = []
    record = controller.tracer.step

    def step(reason: str, regarding: Any, message: str, *, warning: bool = False) -> None:
        steps.append((reason, message, warning))
        record(reason, regarding, message, warning=warning)

    monkeypatch.setattr(controller.tracer, "step", step)
    job = vo.vcjob("train", [vo.task("w", 2)], queue=NS)
    job["metadata"].update(namespace=NS, uid="job-uid", resourceVersion="1")
    job["status"] = {"state": {"phase": apis.JOB_PENDING}, "version": 0}
    job["spec"]["plugins"] = {"tensorflow": []}
    controller.jobs.store.apply("ADDED", job)
    pg = helpers.new_pod_group(job, {})
    pg["status"] = {"phase": apis.PG_INQUEUE}
    controller.podgroups.store.apply("ADDED", pg)
    for _ in range(2):
        controller.reconcile(json.dumps({"namespace": NS, "job": "train", "event": "OutOfSync"}))
    warnings = [(r, m) for r, m, warning in steps if warning and r == "PluginError"]
    assert len(warnings) == 1 and "job plugin(s) tensorflow not implemented" in warnings[0][1]
    log = controller.tracer._stream.getvalue()  # type: ignore[attr-defined]
    assert log.count('"step": "PluginError"') == 1
    pods = sorted(name for kind, name in api.objects if kind == "pod")
    assert pods == ["train-w-0", "train-w-1"]
