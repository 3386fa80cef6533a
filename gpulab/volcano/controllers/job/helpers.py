"""The job controller's pure parts: pods and PodGroup of a vcjob, policies, counts.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/controllers/job``:
- ``job_controller_util.go`` ``createJobPod`` (pod ``<job>-<task>-<index>``, owned by the
  Job; annotations ``volcano.sh/task-index``, ``volcano.sh/task-spec``,
  ``scheduling.k8s.io/group-name`` = ``<job>-<job uid>``, ``volcano.sh/job-name``,
  ``volcano.sh/queue-name``, ``volcano.sh/job-version``, ``volcano.sh/template-uid``,
  ``volcano.sh/job-retry-count``; labels ``volcano.sh/task-index``, ``volcano.sh/job-name``,
  ``volcano.sh/task-spec``, ``volcano.sh/job-namespace``, ``volcano.sh/queue-name``; the
  job's schedulerName and priorityClassName when the template has none; the job's
  ``volcano.sh/preemptable`` annotation / label passed on), ``applyPolicies`` (task
  policies first, then the job's; an event or an exit code picks the action; an outdated
  request - from an older job version - only syncs), ``TasksPriority.CalcPGMinResources``
  / ``CalcFirstCountResources``;
- ``job_controller_actions.go`` ``createOrUpdatePodGroup`` (``minMember`` = minAvailable,
  ``minTaskMember`` per task, ``minResources`` = the quota usage of the first minAvailable
  pods, higher task priority first; ``queue``, ``priorityClassName``; owned by the Job),
  ``shouldUpdateExistingPodGroup``, ``classifyAndAddUpPodBaseOnPhase``, ``calcPodStatus``,
  ``isInitiated``, ``appendJobCondition``;
- ``pkg/controllers/util`` ``GetPodQuotaUsage`` (k8s quota ``PodUsageFunc``: ``pods``,
  ``count/pods``, cpu / memory / ephemeral-storage with their ``requests.`` / ``limits.``
  forms, extended resources as ``requests.<name>`` and, Volcano's addition, ``<name>``).

The job plugins (env, svc, ssh, pytorch, mpi) are plugins.py; ``tensorflow``, ``ray``
and ``hcclrank`` are accepted by the webhook but not applied (a Warning ``PluginError``
Event on the Job says so).

Lab differences, still missing: ``spec.volumes`` (no PVC created, none mounted in the
pods), partitions (``partitionPolicy`` is not read: no sub-groups in the PodGroup, no
``minTaskMember`` from its partitions), ``dependsOn`` (every task's pods are created at
once), network topology (``spec.networkTopology`` is not copied to the PodGroup).
"""

from __future__ import annotations

import copy
import datetime as dt
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from gpulab.framework.resources import is_extended_resource_name, pod_requests
from gpulab.kueue.api import format_quantity, quantity
from gpulab.volcano import apis

Obj = dict[str, Any]
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fnv32(data: bytes) -> int:
    """FNV-1 32-bit (Go's ``hash/fnv.New32``): which worker queue a job goes to."""
    h = 0x811C9DC5
    for byte in data:
        h = (h * 0x01000193) & 0xFFFFFFFF ^ byte
    return h


def task_key(pod: Mapping[str, Any]) -> str:
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    return ann.get(apis.TASK_SPEC_KEY) or apis.DEFAULT_TASK_SPEC


def is_out_of_sync(pod: Mapping[str, Any]) -> bool:
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    return apis.OUT_OF_SYNC_KEY in ann


def owner_ref(job: Mapping[str, Any]) -> Obj:
    """metav1.NewControllerRef(job, JobKind)."""
    meta = job["metadata"]
    return {
        "apiVersion": f"{apis.BATCH_GROUP}/{apis.BATCH_VERSION}",
        "kind": "Job",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the vcjob controlling ``obj`` (isControlledBy), if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == "Job"
            and str(ref.get("apiVersion", "")).startswith(apis.BATCH_GROUP + "/")
        ):
            return str(ref.get("uid"))
    return None


# -- pods -----------------------------------------------------------------------------------


def create_job_pod(job: Mapping[str, Any], task: Mapping[str, Any], index: int) -> Obj:
    """createJobPod: pod ``index`` of ``task``."""
    meta, spec, status = job["metadata"], job.get("spec") or {}, job.get("status") or {}
    template = copy.deepcopy(task.get("template") or {})
    tmeta = template.get("metadata") or {}
    pod_spec = template.get("spec") or {}
    if not pod_spec.get("schedulerName"):
        pod_spec["schedulerName"] = spec.get("schedulerName") or apis.DEFAULT_SCHEDULER_NAME
    if not pod_spec.get("priorityClassName") and spec.get("priorityClassName"):
        pod_spec["priorityClassName"] = spec["priorityClassName"]
    task_name = task.get("name") or apis.DEFAULT_TASK_SPEC
    queue = spec.get("queue") or apis.DEFAULT_QUEUE
    annotations = dict(tmeta.get("annotations") or {})
    annotations.update(
        {
            apis.TASK_INDEX: str(index),
            apis.TASK_SPEC_KEY: task_name,
            apis.KUBE_GROUP_NAME_ANNOTATION: apis.pod_group_name(job),
            apis.JOB_NAME_KEY: meta["name"],
            apis.QUEUE_NAME_KEY: queue,
            apis.JOB_VERSION: str(status.get("version") or 0),
            apis.POD_TEMPLATE_KEY: f"{meta['name']}-{task_name}",
            apis.JOB_RETRY_COUNT_KEY: str(status.get("retryCount") or 0),
        }
    )
    labels = dict(tmeta.get("labels") or {})
    labels.update(
        {
            apis.TASK_INDEX: str(index),
            apis.JOB_NAME_KEY: meta["name"],
            apis.TASK_SPEC_KEY: task_name,
            apis.JOB_NAMESPACE_KEY: meta["namespace"],
            apis.QUEUE_NAME_KEY: queue,
        }
    )
    preemptable = (meta.get("annotations") or {}).get(apis.POD_PREEMPTABLE)
    if preemptable is not None:
        annotations[apis.POD_PREEMPTABLE] = preemptable
    preemptable = (meta.get("labels") or {}).get(apis.POD_PREEMPTABLE)
    if preemptable is not None:
        labels[apis.POD_PREEMPTABLE] = preemptable
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": apis.pod_name(meta["name"], task_name, index),
            "namespace": meta["namespace"],
            "ownerReferences": [owner_ref(job)],
            "labels": labels,
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


# -- the PodGroup ----------------------------------------------------------------------------


def _limits(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """resourcehelper.PodLimits for cpu/memory/ephemeral-storage (app sum, init max)."""
    spec = pod.get("spec") or {}
    out: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        for name, v in ((c.get("resources") or {}).get("limits") or {}).items():
            out[name] = out.get(name, Decimal(0)) + quantity(v)
    for c in spec.get("initContainers") or []:
        for name, v in ((c.get("resources") or {}).get("limits") or {}).items():
            out[name] = max(out.get(name, Decimal(0)), quantity(v))
    return out


def pod_quota_usage(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """GetPodQuotaUsage (see the module docstring)."""
    requests, limits = pod_requests(pod), _limits(pod)
    usage: dict[str, Decimal] = {"count/pods": Decimal(1), "pods": Decimal(1)}
    for name in ("cpu", "memory", "ephemeral-storage"):
        if name in requests:
            usage[name] = requests[name]
            usage[f"requests.{name}"] = requests[name]
        if name in limits:
            usage[f"limits.{name}"] = limits[name]
    for name, q in requests.items():
        if name.startswith("hugepages-"):
            usage[name] = q
            usage[f"requests.{name}"] = q
        if is_extended_resource_name(name):
            usage[f"requests.{name}"] = q
            usage[name] = q
    return usage


def _add(into: dict[str, Decimal], usage: Mapping[str, Decimal], times: int) -> None:
    for name, q in usage.items():
        into[name] = into.get(name, Decimal(0)) + q * times


def calc_task_requests(pod: Mapping[str, Any], replicas: int) -> dict[str, str]:
    """util.CalTaskRequests: the pod's quota usage, ``replicas`` times."""
    out: dict[str, Decimal] = {}
    _add(out, pod_quota_usage(pod), replicas)
    return {name: format_quantity(q) for name, q in sorted(out.items())}


def min_task_member(task: Mapping[str, Any]) -> int:
    """getMinTaskMember."""
    if task.get("minAvailable") is not None:
        return int(task["minAvailable"])
    return int(task.get("replicas") or 0)


def calc_pg_min_resources(
    job: Mapping[str, Any], priority_classes: Mapping[str, int] | None = None
) -> dict[str, str]:
    """calcPGMinResources: quota usage of the first minAvailable pods, tasks of higher
    priority first (each task's own minAvailable before the rest of its replicas)."""
    classes = priority_classes or {}
    spec = job.get("spec") or {}
    tasks = list(spec.get("tasks") or [])
    tasks.sort(
        key=lambda t: (
            -classes.get(
                ((t.get("template") or {}).get("spec") or {}).get("priorityClassName", ""), 0
            )
        )
    )
    job_min = int(spec.get("minAvailable") or 0)
    total_min = sum(min_task_member(t) for t in tasks)
    out: dict[str, Decimal] = {}
    usage = [pod_quota_usage({"spec": (t.get("template") or {}).get("spec") or {}}) for t in tasks]
    if job_min < total_min:  # CalcFirstCountResources
        count = job_min
        for t, u in zip(tasks, usage, strict=True):
            take = min(count, int(t.get("replicas") or 0))
            _add(out, u, take)
            count -= take
            if count <= 0:
                break
    else:  # CalcPGMinResources
        count = 0
        for t, u in zip(tasks, usage, strict=True):
            if t.get("minAvailable") is None:
                continue
            take = min(int(t["minAvailable"]), job_min - count)
            _add(out, u, take)
            count += take
            if count >= job_min:
                break
        left = job_min - count
        for t, u in zip(tasks, usage, strict=True):
            if left <= 0:
                break
            spare = int(t.get("replicas") or 0)
            if t.get("minAvailable") is not None:
                spare -= int(t["minAvailable"])
            take = min(left, spare)
            _add(out, u, take)
            left -= take
    return {name: format_quantity(q) for name, q in sorted(out.items())}


def new_pod_group(job: Mapping[str, Any], priority_classes: Mapping[str, int]) -> Obj:
    """The PodGroup createOrUpdatePodGroup creates for ``job``."""
    meta, spec = job["metadata"], job.get("spec") or {}
    pg_spec: Obj = {
        "minMember": int(spec.get("minAvailable") or 0),
        "minTaskMember": {t["name"]: min_task_member(t) for t in spec.get("tasks") or []},
        "queue": spec.get("queue") or apis.DEFAULT_QUEUE,
        "minResources": calc_pg_min_resources(job, priority_classes),
    }
    if spec.get("priorityClassName"):
        pg_spec["priorityClassName"] = spec["priorityClassName"]
    pg_meta: Obj = {
        "name": apis.pod_group_name(job),
        "namespace": meta["namespace"],
        "ownerReferences": [owner_ref(job)],
    }
    if meta.get("annotations"):
        pg_meta["annotations"] = dict(meta["annotations"])
    if meta.get("labels"):
        pg_meta["labels"] = dict(meta["labels"])
    return {
        "apiVersion": f"{apis.SCHEDULING_GROUP}/{apis.SCHEDULING_VERSION}",
        "kind": "PodGroup",
        "metadata": pg_meta,
        "spec": pg_spec,
    }


def updated_pod_group_spec(pg: Mapping[str, Any], wanted: Mapping[str, Any]) -> Obj | None:
    """shouldUpdateExistingPodGroup: the spec to write, or None when nothing changed."""
    spec = dict(pg.get("spec") or {})
    new = wanted["spec"]
    changed = False
    for key in ("priorityClassName", "minMember", "minResources", "minTaskMember"):
        if (spec.get(key) or None) != (new.get(key) or None):
            spec[key] = new.get(key)
            changed = True
    return spec if changed else None


# -- status ----------------------------------------------------------------------------------


def count_pods(pods: list[Mapping[str, Any]]) -> tuple[dict[str, int], dict[str, Obj]]:
    """classifyAndAddUpPodBaseOnPhase + calcPodStatus: per-phase counts and, per task,
    ``{"phase": {<phase>: n}}``."""
    counts = dict.fromkeys(("pending", "running", "succeeded", "failed", "unknown"), 0)
    per_task: dict[str, Obj] = {}
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase") or ""
        phase = phase if phase in PHASES else "Unknown"
        counts[phase.lower()] += 1
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        name = ann.get(apis.TASK_SPEC_KEY)
        if name is not None:
            task = per_task.setdefault(name, {"phase": {}})
            task["phase"][phase] = task["phase"].get(phase, 0) + 1
    return counts, per_task


def is_initiated(job: Mapping[str, Any]) -> bool:
    phase = ((job.get("status") or {}).get("state") or {}).get("phase") or ""
    return phase not in ("", apis.JOB_PENDING)


def append_job_condition(conditions: list[Obj], phase: str, when: str) -> list[Obj]:
    """appendJobCondition: one condition per phase, the newest last."""
    return [c for c in conditions if c.get("status") != phase] + [
        {"status": phase, "lastTransitionTime": when}
    ]


# -- the job cache's task checks ---------------------------------------------------------------


def task_spec(job: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    for task in ((job or {}).get("spec") or {}).get("tasks") or []:
        if task.get("name") == name:
            return task
    return None


def task_completed(task: Mapping[str, Any] | None, pods: list[Mapping[str, Any]]) -> bool:
    """jobCache.TaskCompleted: as many of the task's pods Succeeded as it has replicas."""
    replicas = int((task or {}).get("replicas") or 0)
    done = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Succeeded")
    return replicas > 0 and done >= replicas


def task_failed(task: Mapping[str, Any] | None, pods: list[Mapping[str, Any]]) -> bool:
    """jobCache.TaskFailed: the restarts of the task's Running and Pending pods' containers
    (init containers included) reached the task's ``maxRetry`` (0 means 3, -1 never)."""
    replicas = int((task or {}).get("replicas") or 0)
    max_retry = int((task or {}).get("maxRetry") or 0)
    if replicas == 0 or max_retry == -1:
        return False
    retried = 0
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") in ("Running", "Pending"):
            containers = status.get("initContainerStatuses") or []
            containers += status.get("containerStatuses") or []
            retried += sum(int(c.get("restartCount") or 0) for c in containers)
    return retried >= (max_retry or 3)


# -- policies --------------------------------------------------------------------------------


def _events(policy: Mapping[str, Any]) -> list[str]:
    events = list(policy.get("events") or [])
    if policy.get("event"):
        events.append(policy["event"])
    return events


def _timeout_seconds(policy: Mapping[str, Any]) -> float:
    raw = policy.get("timeout")
    return parse_duration(raw) if raw else 0.0


_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,  # µs
    "\u03bcs": 1e-6,  # μs
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"(\d*\.?\d*)([^\d.]*)")


def parse_duration(raw: str) -> float:
    """Go's ``time.ParseDuration`` in seconds (``90s``, ``1h30m``, ``-1.5h``, ``500ms``,
    ``0``), with its error texts."""
    text = raw[1:] if raw[:1] in ("-", "+") else raw
    if text == "0":
        return 0.0
    total, pos = 0.0, 0
    while pos < len(text) or not text:
        m = _DURATION_PART.match(text, pos)
        number, unit = m.groups() if m else ("", "")
        if number in ("", "."):
            raise ValueError(f'time: invalid duration "{raw}"')
        if not unit:
            raise ValueError(f'time: missing unit in duration "{raw}"')
        if unit not in _DURATION_UNITS:
            raise ValueError(f'time: unknown unit "{unit}" in duration "{raw}"')
        total += float(number) * _DURATION_UNITS[unit]
        pos = m.end() if m else len(text)
    return -total if raw.startswith("-") else total


def go_duration(seconds: float) -> str:
    """time.Duration.String(): ``1m30s``, ``10m0s``, ``1h0m0s``, ``500ms``, ``0s``."""
    ns = round(abs(seconds) * 1e9)
    sign = "-" if seconds < 0 else ""
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("\u00b5s", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _go_number(ns, size) + unit
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = _go_number(rest, 1_000_000_000) + "s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    if hours:
        text = f"{hours}h{text}"
    return sign + text


def _go_number(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = str(frac).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


# upstream's isInternalAction and GetActionType
INTERNAL_ACTIONS = frozenset(
    {apis.SYNC_JOB, apis.ENQUEUE_JOB, apis.SYNC_QUEUE, apis.OPEN_QUEUE, apis.CLOSE_QUEUE}
)
TASK_ACTION, POD_ACTION, PARTITION_ACTION, JOB_ACTION = "task", "pod", "partition", "job"


def action_type(action: str) -> str:
    """GetActionType: which delayed actions one executed action makes redundant."""
    return {
        apis.RESTART_TASK: TASK_ACTION,
        apis.RESTART_POD: POD_ACTION,
        apis.RESTART_PARTITION: PARTITION_ACTION,
    }.get(action, JOB_ACTION)


def apply_policies(job: Mapping[str, Any], request: Mapping[str, Any]) -> tuple[str, float]:
    """applyPolicies: (action, delay seconds) for ``request``."""
    if request.get("action"):
        return str(request["action"]), 0.0
    event = request.get("event") or ""
    if event in (apis.OUT_OF_SYNC_EVENT, apis.COMMAND_ISSUED_EVENT, apis.POD_RUNNING_EVENT):
        return apis.SYNC_JOB, 0.0
    meta, spec = job.get("metadata") or {}, job.get("spec") or {}
    if request.get("job_uid") and request["job_uid"] != meta.get("uid"):
        return apis.SYNC_JOB, 0.0
    if int(request.get("job_version") or 0) < int((job.get("status") or {}).get("version") or 0):
        return apis.SYNC_JOB, 0.0
    exit_code = request.get("exit_code")
    task_policies: list[Mapping[str, Any]] = []
    for task in spec.get("tasks") or []:
        if task.get("name") == request.get("task"):
            task_policies = list(task.get("policies") or [])
    for policies in (task_policies, list(spec.get("policies") or [])):
        for policy in policies:
            events = _events(policy)
            if events and event and (event in events or apis.ANY_EVENT in events):
                timeout = policy.get("timeout")
                if event != apis.POD_PENDING_EVENT or timeout:
                    return str(policy.get("action")), _timeout_seconds(policy)
            if policy.get("exitCode") is not None and policy["exitCode"] == exit_code:
                return str(policy.get("action")), _timeout_seconds(policy)
    return apis.SYNC_JOB, 0.0
