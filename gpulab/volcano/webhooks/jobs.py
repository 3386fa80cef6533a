"""Admission of vcjobs: defaults on create, validation on create and update.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/webhooks/admission/jobs``:
- ``mutate/mutate_job.go`` (``/jobs/mutate``, CREATE): ``spec.queue`` defaults to
  ``default``, ``spec.schedulerName`` to ``volcano``, ``spec.maxRetry`` to 3, each task's
  name to ``default<i>``, ``minAvailable`` to its replicas, ``maxRetry`` to 3, a
  hostNetwork task's dnsPolicy to ClusterFirstWithHostNet; ``spec.minAvailable`` to the
  sum of the tasks' minAvailable; tensorflow / mpi / pytorch / ray plugins bring ``svc``
  (and mpi ``ssh``);
- ``validate/admit_job.go`` (``/jobs/validate``, CREATE and UPDATE) and ``util.go``:
  the messages, word for word - " job 'minAvailable' should not be greater than total
  replicas in tasks;", " duplicated task name <name>;", " unable to find job queue: ...;",
  " can only submit job to queue with state `Open`, queue `<q>` status is `<state>`;",
  " 'minAvailable' is greater than 'replicas' in task: ...;", policy checks, unknown job
  plugins; on update only ``minAvailable``, task ``replicas`` and ``priorityClassName``
  may change.

Lab differences: the pod template is not run through Kubernetes' PodTemplate validation
(the API server validates the pods when the controller creates them); no MPI master /
DAG / partition / topology-policy checks.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any

from gpulab.volcano import apis

Obj = dict[str, Any]
DEFAULT_MAX_RETRY = 3
JOB_PLUGINS = ("ssh", "env", "svc", "tensorflow", "mpi", "pytorch", "hcclrank", "ray")

# validate/util.go policyEventMap / policyActionMap: what users may name
VALID_EVENTS = (
    apis.ANY_EVENT,
    apis.POD_FAILED_EVENT,
    apis.POD_EVICTED_EVENT,
    apis.POD_PENDING_EVENT,
    apis.JOB_UNKNOWN_EVENT,
    apis.TASK_COMPLETED_EVENT,
    apis.TASK_FAILED_EVENT,
    apis.JOB_UPDATED_EVENT,
)
VALID_ACTIONS = (
    apis.ABORT_JOB,
    apis.RESTART_JOB,
    apis.RESTART_TASK,
    apis.RESTART_POD,
    apis.RESTART_PARTITION,
    apis.TERMINATE_JOB,
    apis.COMPLETE_JOB,
    apis.RESUME_JOB,
)
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


# -- mutate ----------------------------------------------------------------------------------


def mutate_patch(
    job: Mapping[str, Any], scheduler_name: str = apis.DEFAULT_SCHEDULER_NAME
) -> list[Obj]:
    """createPatch: the JSONPatch the mutating webhook answers for a new vcjob."""
    spec = job.get("spec") or {}
    patch: list[Obj] = []
    if not spec.get("queue"):
        patch.append({"op": "add", "path": "/spec/queue", "value": apis.DEFAULT_QUEUE})
    if not spec.get("schedulerName"):
        patch.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    if not spec.get("maxRetry"):
        patch.append({"op": "add", "path": "/spec/maxRetry", "value": DEFAULT_MAX_RETRY})
    tasks = copy.deepcopy(list(spec.get("tasks") or []))
    patched = False
    for i, task in enumerate(tasks):
        if not task.get("name"):
            task["name"] = f"{apis.DEFAULT_TASK_SPEC}{i}"
            patched = True
        pod_spec = (task.get("template") or {}).get("spec") or {}
        if pod_spec.get("hostNetwork") and not pod_spec.get("dnsPolicy"):
            pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
            patched = True
        if task.get("minAvailable") is None:
            task["minAvailable"] = int(task.get("replicas") or 0)
            patched = True
        if not task.get("maxRetry"):
            task["maxRetry"] = DEFAULT_MAX_RETRY
            patched = True
    if patched:
        patch.append({"op": "replace", "path": "/spec/tasks", "value": tasks})
    if not spec.get("minAvailable"):
        total = sum(
            int(t["minAvailable"])
            if t.get("minAvailable") is not None
            else int(t.get("replicas") or 0)
            for t in spec.get("tasks") or []
        )
        patch.append({"op": "add", "path": "/spec/minAvailable", "value": total})
    plugins = spec.get("plugins")
    if plugins is not None:
        merged = dict(plugins)
        if any(p in plugins for p in ("tensorflow", "mpi", "pytorch", "ray")):
            merged.setdefault("svc", [])
        if "mpi" in plugins:
            merged.setdefault("ssh", [])
        patch.append({"op": "replace", "path": "/spec/plugins", "value": merged})
    return patch


# -- validate --------------------------------------------------------------------------------


def _events(policy: Mapping[str, Any]) -> list[str]:
    events = list(
        dict.fromkeys(
            [*(policy.get("events") or []), *([policy["event"]] if policy.get("event") else [])]
        )
    )
    return events


def multierror(errors: list[str]) -> str:
    """hashicorp/go-multierror's Error() text."""
    head = "1 error occurred" if len(errors) == 1 else f"{len(errors)} errors occurred"
    return head + ":\n" + "".join(f"\t* {e}\n" for e in errors) + "\n"


def go_list(values: tuple[str, ...]) -> str:
    return "[" + " ".join(values) + "]"


def validate_policies(policies: list[Mapping[str, Any]], path: str) -> str:
    """validatePolicies + the caller's hint: "" when fine, else the message part."""
    seen_events: set[str] = set()
    seen_codes: set[int] = set()
    errors: list[str] = []
    for policy in policies:
        has_event = bool(policy.get("event") or policy.get("events"))
        if has_event and policy.get("exitCode") is not None:
            errors.append("must not specify event and exitCode simultaneously")
            break
        if not has_event and policy.get("exitCode") is None:
            errors.append("either event and exitCode should be specified")
            break
        if has_event:
            for event in _events(policy):
                action = policy.get("action")
                if event not in VALID_EVENTS:
                    errors.append(f'{path}: Invalid value: "{event}": invalid policy event')
                elif action not in VALID_ACTIONS:
                    errors.append(f'{path}: Invalid value: "{action}": invalid policy action')
                elif event in seen_events:
                    errors.append(f"duplicate event {event}  across different policy")
                else:
                    seen_events.add(event)
                    continue
                break
            if errors:
                break
        else:
            code = int(policy["exitCode"])
            if code == 0:
                errors.append("0 is not a valid error code")
                break
            if code in seen_codes:
                errors.append(f"duplicate exitCode {code}")
                break
            seen_codes.add(code)
    if apis.ANY_EVENT in seen_events and len(seen_events) > 1:
        errors.append("if there's * here, no other policy should be here")
    if not errors:
        return ""
    events, actions = go_list(VALID_EVENTS), go_list(VALID_ACTIONS)
    return f"{multierror(errors)} valid events are {events}, valid actions are {actions};"


def _qualified(name: str) -> bool:
    return len(name) <= 63 and bool(_QUALIFIED.match(name))


def validate_job_create(
    job: Mapping[str, Any], get_queue: Callable[[str], Mapping[str, Any] | None]
) -> str:
    """validateJobCreate: "" when admitted, else upstream's message (leading space and
    trailing semicolons as upstream builds it; the response trims it)."""
    meta, spec = job.get("metadata") or {}, job.get("spec") or {}
    tasks = list(spec.get("tasks") or [])
    if not tasks:
        return "No task specified in job spec"
    msg = ""
    names: set[str] = set()
    total = 0
    for index, task in enumerate(tasks):
        name = task.get("name") or ""
        replicas = int(task.get("replicas") or 0)
        if task.get("minAvailable") is not None and int(task["minAvailable"]) > replicas:
            job_name = meta.get("name")
            msg += f" 'minAvailable' is greater than 'replicas' in task: {name}, job: {job_name};"
        total += replicas
        if name in names:
            msg += f" duplicated task name {name};"
            break
        names.add(name)
        msg += validate_policies(list(task.get("policies") or []), "spec.tasks.policies")
        pod = apis.pod_name(str(meta.get("name")), name, index)
        if not _qualified(pod):
            msg += f"create pod with name {pod} validate failed;"
    if not _qualified(str(meta.get("name") or "")):
        msg += f"create job with name {meta.get('name')} validate failed"
    if total < int(spec.get("minAvailable") or 0):
        msg += " job 'minAvailable' should not be greater than total replicas in tasks;"
    msg += validate_policies(list(spec.get("policies") or []), "spec.policies")
    for plugin in spec.get("plugins") or {}:
        if plugin not in JOB_PLUGINS:
            msg += f" unable to find job plugin: {plugin};"
    queue_name = str(spec.get("queue") or "")
    queue = get_queue(queue_name)
    if queue is None:
        msg += f' unable to find job queue: queue.scheduling.volcano.sh "{queue_name}" not found;'
    else:
        state = (queue.get("status") or {}).get("state") or ""
        if state != apis.QUEUE_OPEN:
            msg += (
                " can only submit job to queue with state `Open`, "
                f"queue `{queue_name}` status is `{state}`;"
            )
        if queue_name == apis.ROOT_QUEUE:
            msg += " can not submit job to root queue;"
    return msg


def validate_job_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """validateJobUpdate: "" when allowed, else the error."""
    total = 0
    for task in (new.get("spec") or {}).get("tasks") or []:
        replicas = int(task.get("replicas") or 0)
        if replicas < 0:
            return f"'replicas' must be >= 0 in task: {task.get('name')}"
        if task.get("minAvailable") is not None:
            if int(task["minAvailable"]) < 0:
                return f"'minAvailable' must be >= 0 in task: {task.get('name')}"
            if int(task["minAvailable"]) > replicas:
                return f"'minAvailable' must be <= 'replicas' in task: {task.get('name')}"
        total += replicas
    new_spec, old_spec = copy.deepcopy(new.get("spec") or {}), copy.deepcopy(old.get("spec") or {})
    if int(new_spec.get("minAvailable") or 0) > total:
        return "job 'minAvailable' must not be greater than total replicas"
    if int(new_spec.get("minAvailable") or 0) < 0:
        return "job 'minAvailable' must be >= 0"
    if len(old_spec.get("tasks") or []) != len(new_spec.get("tasks") or []):
        return "job updates may not add or remove tasks"
    for key in ("minAvailable", "priorityClassName"):
        new_spec.pop(key, None)
        old_spec.pop(key, None)
    for n, o in zip(new_spec.get("tasks") or [], old_spec.get("tasks") or [], strict=True):
        for key in ("replicas", "minAvailable"):
            n.pop(key, None)
            o.pop(key, None)
    if new_spec != old_spec:
        return (
            "job updates may not change fields other than `minAvailable`, "
            "`tasks[*].replicas under spec` and `PriorityClassName`"
        )
    return ""
