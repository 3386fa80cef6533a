"""The job controller: a vcjob's PodGroup, its pods, its phase and its lifecycle policies.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/controllers/job``:
- ``job_controller_handler.go``: a Job added or changed, a pod of a Job added (event
  PodPending), changed (PodRunning / PodPending on a phase change, PodFailed with the
  first container's exit code, TaskCompleted once as many pods of its task succeeded as
  it has replicas, TaskFailed while the restarts of its task's Running and Pending pods
  reach the task's maxRetry - ``cache.TaskCompleted`` / ``cache.TaskFailed``) or deleted
  (PodEvicted, unless the controller itself marked it out of sync), a PodGroup whose
  phase changed (Unknown -> event Unknown), a bus.volcano.sh Command naming a Job - each
  becomes a request on the work queue;
- ``job_controller.go`` ``processNextReq``: ``CleanPodDelayActionsIfNeed`` first (a pod
  that left Pending cancels its delayed PodPending action, a pod that runs cancels its
  delayed PodFailed / PodEvicted one), then ``applyPolicies`` turns the request's event
  into an action (``RestartJob`` for ``PodEvicted`` if the job says so); a policy with a
  ``timeout`` becomes a delayed action (``AddDelayActionForJob``: an Event "Execute action
  <action> after <timeout>", one timer per pod - the same action again keeps the running
  timer); otherwise an Event ``ExecuteAction`` "Start to execute action <action> " is
  recorded for any action but SyncJob and the job's state executes it (state.py); an
  action that is not internal then cancels the delayed actions it makes redundant
  (``cleanupDelayActions``: every delayed job-level action of the job, the task's or the
  pod's for RestartTask / RestartPod), as does a delayed action once it ran;
- ``job_controller_actions.go`` ``syncJob`` (initiate: status Pending, the job plugins'
  ``OnJobAdd``, then ``createOrUpdatePodGroup``; an initiated job: the plugins'
  ``OnJobUpdate``; pods are created only once the PodGroup left Pending - i.e. the
  scheduler's enqueue let it in - each passed through the plugins' ``OnPodCreate``; pods
  beyond the replicas or out of sync are deleted; the counts and the phase go to
  ``status``) and ``killJob`` / ``killTarget`` (``killPods``: for the whole job its
  version goes up and its pods - but the retained phases - are marked
  ``volcano.sh/controller-out-of-sync`` and deleted, for RestartTask / RestartPod only the
  task's or the pod's; then the plugins' ``OnJobDelete``, the status, and the PodGroup is
  deleted in both cases, so the gang goes back through enqueue), ``recordPodGroupEvent``
  (Warning ``PodGroupPending`` while the PodGroup's newest condition is not Scheduled).

Workers as upstream's: ``--worker-threads`` (3) queues, a job hashed (FNV-32) to one. The
job plugins are plugins.py.

Lab differences: pods are found through their controller reference, not a separate job
cache; a PodGroup's deletion also queues its Job (upstream watches PodGroup updates
only); a delayed action fires through the job's work queue (upstream: its own
goroutine), so it never runs beside another request of the same job; no PVCs,
partitions, ``ttlSecondsAfterFinished`` or ``runningDuration``. The lab also traces
``CreatePodGroup``, ``SyncJob`` (pods created / deleted) and ``KillJob`` as Events on the
Job.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import logging
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.informer import PODS, Handlers, Informer, ListWatch, key_of
from gpulab.trace import ObjectRef, Tracer
from gpulab.volcano import apis
from gpulab.volcano.controllers.job import helpers, plugins
from gpulab.volcano.controllers.job.state import KILL, KILL_TARGET, RETAIN_SOFT, Step, next_step
from gpulab.workqueue import WorkQueue, run_worker

_log = logging.getLogger(__name__)

Obj = dict[str, Any]
G, V = apis.BATCH_GROUP, apis.BATCH_VERSION


def job_ref(job: Mapping[str, Any]) -> ObjectRef:
    meta = job["metadata"]
    return ObjectRef(
        "Job", meta["name"], meta["namespace"], meta.get("uid"), api_version=f"{G}/{V}"
    )


def _rv(obj: Mapping[str, Any] | None) -> int:
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


POD_EVENTS = frozenset(
    {apis.POD_PENDING_EVENT, apis.POD_RUNNING_EVENT, apis.POD_FAILED_EVENT, apis.POD_EVICTED_EVENT}
)


@dataclass(frozen=True)
class DelayedAction:
    """delayAction: what fires after ``delay`` unless cancelled (``token`` identifies the
    timer on the work queue)."""

    job_key: str
    task: str
    pod: str
    pod_uid: str
    event: str
    action: str
    delay: float
    token: str


class DelayedActions:
    """delayActionMap: per job key, per pod name, the pending delayed action; a cancelled
    timer's token is no longer live and its firing is dropped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[str, dict[str, DelayedAction]] = {}
        self._live: set[str] = set()

    @staticmethod
    def job_key(request: Mapping[str, Any]) -> str:
        return f"{request['namespace']}/{request['job']}"

    def add(self, request: Mapping[str, Any], action: str, delay: float) -> DelayedAction | None:
        """AddDelayActionForJob: the new timer, or None when the pod already waits for the
        same action (that timer keeps running)."""
        key, pod = self.job_key(request), str(request.get("pod") or "")
        with self._lock:
            timers = self._by_job.setdefault(key, {})
            old = timers.get(pod)
            if old is not None and old.action == action:
                return None
            timer = DelayedAction(
                key,
                str(request.get("task") or ""),
                pod,
                str(request.get("pod_uid") or ""),
                str(request.get("event") or ""),
                action,
                delay,
                str(uuid.uuid4()),
            )
            timers[pod] = timer
            self._live.add(timer.token)
            return timer

    def clean_if_needed(self, request: Mapping[str, Any]) -> DelayedAction | None:
        """CleanPodDelayActionsIfNeed: the delayed action this pod event cancels, if any."""
        event = request.get("event")
        if event not in POD_EVENTS or event == apis.POD_PENDING_EVENT:
            return None
        with self._lock:
            timers = self._by_job.get(self.job_key(request), {})
            timer = timers.get(str(request.get("pod") or ""))
            if timer is None:
                return None
            same_pod = request.get("pod_uid") == timer.pod_uid  # not its successor's
            pending = timer.event == apis.POD_PENDING_EVENT and same_pod
            ran = (
                timer.event in (apis.POD_FAILED_EVENT, apis.POD_EVICTED_EVENT)
                and event == apis.POD_RUNNING_EVENT
            )
            if not (pending or ran):
                return None
            del timers[timer.pod]
            self._live.discard(timer.token)
            return timer

    def live(self, token: str) -> bool:
        with self._lock:
            return token in self._live

    def fired(self, token: str) -> None:
        with self._lock:
            self._live.discard(token)

    def cleanup(self, job_key: str, action: str, task: str, pod: str) -> list[DelayedAction]:
        """cleanupDelayActions: cancel the job's delayed actions of the executed action's
        type (for a task or pod action, of the same task or pod)."""
        kind = helpers.action_type(action)
        cancelled = []
        with self._lock:
            timers = self._by_job.get(job_key, {})
            for timer in list(timers.values()):
                if helpers.action_type(timer.action) != kind:
                    continue
                if kind == helpers.TASK_ACTION and timer.task != task:
                    continue
                if kind == helpers.POD_ACTION and timer.pod != pod:
                    continue
                del timers[timer.pod]
                self._live.discard(timer.token)
                cancelled.append(timer)
        return cancelled


class JobController:
    def __init__(self, api: client.ApiClient, tracer: Tracer, workers: int = 3) -> None:
        self.core = client.CoreV1Api(api)
        self.networking = client.NetworkingV1Api(api)  # the plugins write through both
        self.custom = client.CustomObjectsApi(api)
        self.tracer = tracer
        self.delayed = DelayedActions()
        self._plugin_warned: set[str] = set()  # job uids told about a plugin not implemented
        # One queue per worker; a job always hashes to the same one, so its requests are
        # handled in order, by one worker at a time (upstream's queueList + getWorkerQueue).
        self.work_queues = [WorkQueue() for _ in range(max(1, workers))]
        self.pool = concurrent.futures.ThreadPoolExecutor(16, "job-controller-pods")
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, Obj]] = {}  # job uid -> pod name -> pod
        self._latest: dict[str, Obj] = {}  # job key -> the newest Job we wrote
        self.jobs = Informer(
            ListWatch(api, apis.JOBS),
            Handlers(self._job_added, self._job_updated, self._job_deleted),
            name="informer-jobs",
        )
        self.pods = Informer(
            ListWatch(api, PODS),
            Handlers(self._pod_added, self._pod_updated, self._pod_deleted),
            name="informer-job-pods",
        )
        self.podgroups = Informer(
            ListWatch(api, apis.PODGROUPS),
            Handlers(on_update=self._pod_group_updated, on_delete=self._pod_group_deleted),
            name="informer-job-podgroups",
        )
        self.queues = Informer(ListWatch(api, apis.QUEUES), name="informer-job-queues")
        self.priority_classes = Informer(
            ListWatch(api, apis.PRIORITY_CLASSES), name="informer-job-priorityclasses"
        )
        self.commands = Informer(
            ListWatch(api, apis.COMMANDS), Handlers(self._command), name="informer-job-commands"
        )
        self._informers = [
            self.jobs,
            self.pods,
            self.podgroups,
            self.queues,
            self.priority_classes,
            self.commands,
        ]

    # ---------------------------------------------------------------- handlers

    def _queue_of(self, request: Mapping[str, Any]) -> WorkQueue:
        key = f"{request['namespace']}/{request['job']}".encode()
        return self.work_queues[helpers.fnv32(key) % len(self.work_queues)]

    def _enqueue(self, **request: Any) -> None:
        self._queue_of(request).add(json.dumps(request, sort_keys=True))

    def _job_added(self, job: Obj) -> None:
        meta = job["metadata"]
        self._enqueue(namespace=meta["namespace"], job=meta["name"], event=apis.OUT_OF_SYNC_EVENT)

    def _job_updated(self, old: Obj, new: Obj) -> None:
        phase = lambda j: ((j.get("status") or {}).get("state") or {}).get("phase")  # noqa: E731
        if old.get("spec") == new.get("spec") and phase(old) == phase(new):
            return
        self._job_added(new)

    def _job_deleted(self, job: Obj) -> None:
        with self._lock:
            self._pods.pop(str(job["metadata"].get("uid")), None)
            self._latest.pop(key_of(job), None)

    def _pod_request(self, pod: Obj, event: str, exit_code: int = 0) -> None:
        uid = helpers.controller_uid(pod)
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        if uid is None or apis.JOB_NAME_KEY not in ann or apis.TASK_SPEC_KEY not in ann:
            return
        version = ann.get(apis.JOB_VERSION, "")
        if not version.isdigit():
            return
        meta = pod["metadata"]
        self._enqueue(
            namespace=meta["namespace"],
            job=ann[apis.JOB_NAME_KEY],
            job_uid=uid,
            task=ann[apis.TASK_SPEC_KEY],
            pod=meta["name"],
            pod_uid=str(meta.get("uid") or ""),
            event=event,
            exit_code=exit_code,
            job_version=int(version),
        )

    def _remember(self, pod: Obj) -> bool:
        uid = helpers.controller_uid(pod)
        if uid is None:
            return False
        with self._lock:
            self._pods.setdefault(uid, {})[pod["metadata"]["name"]] = pod
        return True

    def _pod_added(self, pod: Obj) -> None:
        if self._remember(pod):
            event = (
                apis.OUT_OF_SYNC_EVENT if helpers.is_out_of_sync(pod) else apis.POD_PENDING_EVENT
            )
            self._pod_request(pod, event)

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        if not self._remember(new):
            return
        old_phase = (old.get("status") or {}).get("phase")
        phase = (new.get("status") or {}).get("phase")
        event, exit_code = apis.OUT_OF_SYNC_EVENT, 0
        if phase == "Failed":
            if old_phase != "Failed":
                event = apis.POD_FAILED_EVENT
                statuses = (new.get("status") or {}).get("containerStatuses") or [{}]
                terminated = (statuses[0].get("state") or {}).get("terminated")
                exit_code = int((terminated or {}).get("exitCode") or 0)
        elif phase == "Succeeded":
            if old_phase != "Succeeded" and helpers.task_completed(*self._task_of(new)):
                event = apis.TASK_COMPLETED_EVENT
        elif phase in ("Running", "Pending"):
            if helpers.task_failed(*self._task_of(new)):
                event = apis.TASK_FAILED_EVENT
            if old_phase != phase:
                event = apis.POD_RUNNING_EVENT if phase == "Running" else apis.POD_PENDING_EVENT
        if helpers.is_out_of_sync(new):
            event = apis.OUT_OF_SYNC_EVENT
        self._pod_request(new, event, exit_code)

    def _task_of(self, pod: Obj) -> tuple[Mapping[str, Any] | None, list[Obj]]:
        """The pod's task as its Job declares it, and the task's pods the cache holds."""
        uid, task = helpers.controller_uid(pod), helpers.task_key(pod)
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        job = self.jobs.store.get(f"{pod['metadata']['namespace']}/{ann.get(apis.JOB_NAME_KEY)}")
        with self._lock:
            pods = list(self._pods.get(uid or "", {}).values())
        return helpers.task_spec(job, task), [p for p in pods if helpers.task_key(p) == task]

    def _pod_deleted(self, pod: Obj) -> None:
        uid = helpers.controller_uid(pod)
        if uid is None:
            return
        with self._lock:
            known = pod["metadata"]["name"] in self._pods.get(uid, {})
            self._pods.get(uid, {}).pop(pod["metadata"]["name"], None)
        evicted = known and not helpers.is_out_of_sync(pod)
        self._pod_request(pod, apis.POD_EVICTED_EVENT if evicted else apis.OUT_OF_SYNC_EVENT)

    @staticmethod
    def _owner(pg: Obj) -> str:
        refs = pg["metadata"].get("ownerReferences") or []
        return next((r["name"] for r in refs if r.get("kind") == "Job"), pg["metadata"]["name"])

    def _pod_group_updated(self, old: Obj, new: Obj) -> None:
        old_phase = (old.get("status") or {}).get("phase")
        phase = (new.get("status") or {}).get("phase")
        if old_phase == phase:
            return
        event = apis.JOB_UNKNOWN_EVENT if phase == apis.PG_UNKNOWN else ""
        self._enqueue(namespace=new["metadata"]["namespace"], job=self._owner(new), event=event)

    def _pod_group_deleted(self, pg: Obj) -> None:
        """A lab addition: KillJob deletes the PodGroup; the Job is looked at again once
        the cache has seen it go, so a restarting job recreates it even when every pod
        event came while the cache still held the old one."""
        self._enqueue(namespace=pg["metadata"]["namespace"], job=self._owner(pg), event="")

    def _command(self, cmd: Obj) -> None:
        target = cmd.get("target") or {}
        if target.get("kind") == "Job":
            meta = cmd["metadata"]
            self._enqueue(
                namespace=meta["namespace"],
                job=target["name"],
                command=meta["name"],
                action=str(cmd.get("action")),
                event=apis.COMMAND_ISSUED_EVENT,
            )

    # ---------------------------------------------------------------- processNextReq

    def job(self, namespace: str, name: str) -> Obj | None:
        """The job as the store has it, or as we last wrote it if that is newer."""
        stored = self.jobs.store.get(f"{namespace}/{name}")
        with self._lock:
            latest = self._latest.get(f"{namespace}/{name}")
        if stored is None:
            return None
        if latest is not None and latest["metadata"].get("uid") == stored["metadata"].get("uid"):
            return latest if _rv(latest) > _rv(stored) else stored
        return stored

    def reconcile(self, key: str) -> float | None:
        request = json.loads(key)
        if request.get("delayed"):
            self._run_delayed(request)
            return None
        if request.get("command"):
            try:
                self.custom.delete_namespaced_custom_object(
                    apis.BUS_GROUP,
                    apis.BUS_VERSION,
                    request["namespace"],
                    "commands",
                    request["command"],
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
        cancelled = self.delayed.clean_if_needed(request)
        if cancelled is not None:
            _log.info(
                "Cancel delayed action <%s> for pod <%s> because of event <%s> of Job <%s>",
                cancelled.action,
                cancelled.pod,
                request.get("event"),
                cancelled.job_key,
            )
        job = self.job(request["namespace"], request["job"])
        if job is None:
            return None
        action, delay = helpers.apply_policies(job, request)
        if delay:
            after = helpers.go_duration(delay)
            self._event(job, apis.EXECUTE_ACTION, f"Execute action {action} after {after}")
            timer = self.delayed.add(request, action, delay)
            if timer is not None:
                fire = {k: v for k, v in request.items() if k != "command"}
                fire.update(action=action, delayed=timer.token)
                self._queue_of(request).add_after(json.dumps(fire, sort_keys=True), delay)
            return None
        if action != apis.SYNC_JOB:
            self._event(job, apis.EXECUTE_ACTION, f"Start to execute action {action} ")
        self.execute(job, action, request)
        if action not in helpers.INTERNAL_ACTIONS:
            self._cleanup_delayed(request, action)
        return None

    def _run_delayed(self, request: Mapping[str, Any]) -> None:
        """A delayed action's timer expired: run it unless it was cancelled meanwhile,
        then cancel the delayed actions it makes redundant."""
        token = str(request["delayed"])
        if not self.delayed.live(token):
            return
        job = self.job(request["namespace"], request["job"])
        if job is not None:
            self.execute(job, str(request["action"]), request)
        self.delayed.fired(token)
        self._cleanup_delayed(request, str(request["action"]))

    def _cleanup_delayed(self, request: Mapping[str, Any], action: str) -> None:
        key = DelayedActions.job_key(request)
        task, pod = str(request.get("task") or ""), str(request.get("pod") or "")
        for timer in self.delayed.cleanup(key, action, task, pod):
            _log.info(
                "Cancel delayed action <%s> for pod <%s> because of action <%s> of Job <%s>",
                timer.action,
                timer.pod,
                action,
                key,
            )

    def execute(self, job: Obj, action: str, request: Mapping[str, Any]) -> None:
        """NewState(job).Execute(GetStateAction(...))."""
        phase = ((job.get("status") or {}).get("state") or {}).get("phase") or ""
        step = next_step(phase, action)
        _log.debug(
            "Execute <%s> on Job <%s> in <%s> (version %s) for request %s",
            action,
            key_of(job),
            phase,
            (job.get("status") or {}).get("version"),
            request,
        )
        if step.kind == KILL:
            self.kill_job(job, step)
        elif step.kind == KILL_TARGET:
            target = {"task": request.get("task")}
            if action == apis.RESTART_POD:
                target["pod"] = request.get("pod")
            self.kill_job(job, step, target)
        else:
            self.sync_job(job, step)

    def _event(self, job: Obj, reason: str, message: str, warning: bool = False) -> None:
        self.tracer.step(reason, job_ref(job), message, warning=warning)

    # ---------------------------------------------------------------- syncJob

    def pods_of(self, job: Mapping[str, Any]) -> dict[str, Obj]:
        with self._lock:
            return dict(self._pods.get(str(job["metadata"].get("uid")), {}))

    def _classes(self) -> dict[str, int]:
        return {
            pc["metadata"]["name"]: int(pc.get("value") or 0)
            for pc in self.priority_classes.store.list()
        }

    def sync_job(self, job: Obj, step: Step) -> None:
        meta = job["metadata"]
        if meta.get("deletionTimestamp"):
            return
        job = copy.deepcopy(job)
        queue_name = (job.get("spec") or {}).get("queue") or apis.DEFAULT_QUEUE
        if self.queues.store.get(queue_name) is None:
            raise LookupError(f"queue {queue_name} of job {key_of(job)} not found")
        status: Obj = job.setdefault("status", {})
        initiated = helpers.is_initiated(job)
        if not initiated and not (status.get("state") or {}).get("phase"):
            when = helpers.now()
            status["state"] = {"phase": apis.JOB_PENDING, "lastTransitionTime": when}
            status["minAvailable"] = int(job["spec"].get("minAvailable") or 0)
            status["conditions"] = helpers.append_job_condition(
                status.get("conditions") or [], apis.JOB_PENDING, when
            )
            job = copy.deepcopy(self._update_status(job))
            status = job["status"]
        self._run_plugins(job, "on_job_update" if initiated else "on_job_add")
        self.create_or_update_pod_group(job)
        pg = self.podgroups.store.get(f"{meta['namespace']}/{apis.pod_group_name(job)}")
        sync_tasks = False
        if pg is not None:
            sync_tasks = (pg.get("status") or {}).get("phase") not in (None, "", apis.PG_PENDING)
            self._record_pod_group_event(job, pg)
        if not sync_tasks:
            old = copy.deepcopy(status)
            if step.update is not None:
                step.update(job, status)
            if status != old:
                self._transition(status)
                self._update_status(job)
            return
        self._sync_pods(job, step)

    def _run_plugins(self, job: Obj, hook: str) -> None:
        """pluginOnJobAdd / pluginOnJobUpdate / pluginOnJobDelete: each of the job's
        plugins, in the order its spec names them; ``job``'s status.controlledResources
        records what they did."""
        uid = str(job["metadata"].get("uid"))
        skipped = plugins.not_implemented(job)
        if skipped and uid not in self._plugin_warned:
            self._plugin_warned.add(uid)
            self._event(
                job,
                "PluginError",
                f"job plugin(s) {', '.join(skipped)} not implemented in the lab (upstream "
                "changes the pods, e.g. tensorflow sets TF_CONFIG); the pods are created "
                "without them",
                warning=True,
            )
        for plugin in plugins.of(job):
            try:
                getattr(plugin, hook)(job, self)
            except (ApiException, plugins.PluginError) as exc:
                when = {"on_job_add": "add", "on_job_update": "update", "on_job_delete": "delete"}
                self._event(
                    job,
                    "PluginError",
                    f"Execute plugin when job {when[hook]} failed, err: {exc}",
                    warning=True,
                )
                raise

    def _sync_pods(self, job: Obj, step: Step) -> None:
        status = job["status"]
        pods = self.pods_of(job)
        to_create: list[Obj] = []
        to_delete: list[Obj] = []
        counted: list[Obj] = []
        terminating = 0
        for task in job["spec"].get("tasks") or []:
            for index in range(int(task.get("replicas") or 0)):
                name = apis.pod_name(job["metadata"]["name"], task["name"], index)
                pod = pods.pop(name, None)
                if pod is None:
                    pod = helpers.create_job_pod(job, task, index)
                    for plugin in plugins.of(job):
                        plugin.on_pod_create(pod, job)
                    to_create.append(pod)
                    continue
                if pod["metadata"].get("deletionTimestamp"):
                    terminating += 1
                    continue
                if helpers.is_out_of_sync(pod):
                    to_delete.append(pod)
                counted.append(pod)
        to_delete.extend(pods.values())  # beyond the replicas
        created = [f for f in (self.pool.submit(self._create_pod, p) for p in to_create)]
        counted.extend(p for p in (f.result() for f in created) if p is not None)
        for future in [self.pool.submit(self._delete_pod, p) for p in to_delete]:
            future.result()
        terminating += len(to_delete)
        if to_create or to_delete:
            self._event(
                job,
                "SyncJob",
                f"PodGroup {apis.pod_group_name(job)} is {self._pg_phase(job)}: created "
                f"{len(to_create)} pod(s), deleted {len(to_delete)}",
            )
        counts, per_task = helpers.count_pods(counted)
        new_status = {
            "state": status.get("state") or {},
            **counts,
            "terminating": terminating,
            "version": int(status.get("version") or 0),
            "minAvailable": int(job["spec"].get("minAvailable") or 0),
            "taskStatusCount": per_task,
            "conditions": status.get("conditions") or [],
            "retryCount": int(status.get("retryCount") or 0),
            "controlledResources": status.get("controlledResources") or {},
        }
        if step.update is not None:
            step.update(job, new_status)
        if _status_equal(status, new_status):
            return
        self._transition(new_status)
        job["status"] = new_status
        self._update_status(job)

    def _pg_phase(self, job: Obj) -> str:
        pg = self.podgroups.store.get(f"{job['metadata']['namespace']}/{apis.pod_group_name(job)}")
        return str(((pg or {}).get("status") or {}).get("phase") or apis.PG_PENDING)

    def _create_pod(self, pod: Obj) -> Obj | None:
        ns = pod["metadata"]["namespace"]
        try:
            created = self.core.api_client.sanitize_for_serialization(
                self.core.create_namespaced_pod(ns, pod)
            )
        except ApiException as exc:
            if exc.status == 409:  # already there: the informer counts it soon
                return None
            raise
        self._remember(created)
        return created

    def _delete_pod(self, pod: Obj) -> None:
        try:
            self.core.delete_namespaced_pod(pod["metadata"]["name"], pod["metadata"]["namespace"])
        except ApiException as exc:
            if exc.status != 404:
                raise

    @staticmethod
    def _transition(status: Obj) -> None:
        when = helpers.now()
        status.setdefault("state", {})["lastTransitionTime"] = when
        status["conditions"] = helpers.append_job_condition(
            status.get("conditions") or [], status["state"].get("phase", ""), when
        )

    def _update_status(self, job: Obj) -> Obj:
        meta = job["metadata"]
        body = {k: v for k, v in job.items() if k != "status"} | {"status": job["status"]}
        new = self.custom.replace_namespaced_custom_object_status(
            G, V, meta["namespace"], "jobs", meta["name"], body
        )
        with self._lock:
            self._latest[key_of(new)] = new
        return new

    def _record_pod_group_event(self, job: Obj, pg: Mapping[str, Any]) -> None:
        """recordPodGroupEvent: a Warning while the newest true condition is not Scheduled."""
        latest = None
        for cond in (pg.get("status") or {}).get("conditions") or []:
            if cond.get("status") == "True" and (
                latest is None
                or str(cond.get("lastTransitionTime")) > str(latest.get("lastTransitionTime"))
            ):
                latest = cond
        if latest is not None and latest.get("type") != apis.PG_SCHEDULED:
            meta = job["metadata"]
            self._event(
                job,
                apis.POD_GROUP_PENDING,
                f"PodGroup {meta['namespace']}:{meta['name']} {str(latest.get('type')).lower()}, "
                f"reason: {latest.get('message')}",
                warning=True,
            )

    # ---------------------------------------------------------------- createOrUpdatePodGroup

    def create_or_update_pod_group(self, job: Obj) -> None:
        meta = job["metadata"]
        wanted = helpers.new_pod_group(job, self._classes())
        name = wanted["metadata"]["name"]
        existing = self.podgroups.store.get(f"{meta['namespace']}/{name}")
        if existing is None:
            try:
                self.custom.create_namespaced_custom_object(
                    apis.SCHEDULING_GROUP,
                    apis.SCHEDULING_VERSION,
                    meta["namespace"],
                    "podgroups",
                    wanted,
                )
            except ApiException as exc:
                if exc.status != 409:
                    self._event(
                        job,
                        apis.POD_GROUP_ERROR,
                        f"Failed to create PodGroup, err: {exc.reason}",
                        True,
                    )
                    raise
                return
            self._event(
                job,
                "CreatePodGroup",
                f"PodGroup {name}: minMember {wanted['spec']['minMember']}, queue "
                f"{wanted['spec']['queue']}, minResources {wanted['spec']['minResources']}",
            )
            return
        spec = helpers.updated_pod_group_spec(existing, wanted)
        if spec is not None:
            body = {**existing, "spec": spec}
            try:
                self.custom.replace_namespaced_custom_object(
                    apis.SCHEDULING_GROUP,
                    apis.SCHEDULING_VERSION,
                    meta["namespace"],
                    "podgroups",
                    name,
                    body,
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise

    # ---------------------------------------------------------------- killJob / killTarget

    def kill_job(self, job: Obj, step: Step, target: Mapping[str, Any] | None = None) -> None:
        meta = job["metadata"]
        if meta.get("deletionTimestamp"):
            return
        job = copy.deepcopy(job)
        status: Obj = job.setdefault("status", {})
        pods = list(self.pods_of(job).values())
        to_kill: list[Obj] = []
        terminating = 0
        if target is not None:
            to_kill = [
                p
                for p in pods
                if helpers.task_key(p) == target.get("task")
                and (not target.get("pod") or p["metadata"]["name"] == target["pod"])
            ]
        else:
            status["version"] = int(status.get("version") or 0) + 1
            last_retry = (
                int(status.get("retryCount") or 0) >= int(job["spec"].get("maxRetry") or 0) - 1
            )
            retain = RETAIN_SOFT if last_retry else step.retain
            for pod in pods:
                if pod["metadata"].get("deletionTimestamp"):
                    terminating += 1
                elif (pod.get("status") or {}).get("phase") not in retain:
                    to_kill.append(pod)
        patch = [
            {
                "op": "add",
                "path": f"/metadata/annotations/{apis.OUT_OF_SYNC_KEY.replace('/', '~1')}",
                "value": "",
            }
        ]
        for pod in to_kill:
            if pod["metadata"].get("deletionTimestamp"):
                terminating += 1
                continue
            try:
                self.core.patch_namespaced_pod(
                    pod["metadata"]["name"], pod["metadata"]["namespace"], patch
                )
                self._delete_pod(pod)
            except ApiException as exc:
                if exc.status != 404:
                    raise
            terminating += 1
        counts, per_task = helpers.count_pods([])
        status.update(counts)
        status["terminating"] = terminating
        status["taskStatusCount"] = per_task
        if step.update is not None and step.update(job, status):
            self._transition(status)
        self._run_plugins(job, "on_job_delete")
        self._update_status(job)
        if to_kill:
            phase = (status.get("state") or {}).get("phase")
            self._event(job, "KillJob", f"deleted {len(to_kill)} pod(s); job {phase}")
        try:  # the whole job or a target: the gang goes back through enqueue
            self.custom.delete_namespaced_custom_object(
                apis.SCHEDULING_GROUP,
                apis.SCHEDULING_VERSION,
                meta["namespace"],
                "podgroups",
                apis.pod_group_name(job),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    # ---------------------------------------------------------------- run

    def run(self, stop: threading.Event) -> None:
        for informer in self._informers:
            informer.start()
        for i, queue in enumerate(self.work_queues):
            name = f"job-controller-{i}"
            threading.Thread(
                target=run_worker, args=(queue, self.reconcile, name), name=name, daemon=True
            ).start()
        stop.wait()
        for queue in self.work_queues:
            queue.shutdown()
        for informer in self._informers:
            informer.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def has_synced(self) -> bool:
        return all(i.has_synced() for i in self._informers)


def _status_equal(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    keys = ("state", "pending", "running", "succeeded", "failed", "terminating", "unknown")
    keys += ("version", "minAvailable", "taskStatusCount", "retryCount", "controlledResources")
    return all((old.get(k) or 0) == (new.get(k) or 0) for k in keys)
