"""A vcjob's state machine: what each phase does with each action.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/controllers/job/state``: ``NewState`` picks the
state by ``status.state.phase``; each state's ``Execute(action)`` is one of

- SyncJob (create missing pods, count them) then an update of the phase:
  Pending -> Running once minAvailable pods run (or finished); Running -> Completed /
  Failed when all pods finished (``minSuccess``, task ``minAvailable`` of Succeeded),
  back to Pending when too many pods are Pending; Restarting -> Pending once enough pods
  are gone, Failed after ``maxRetry`` restarts;
- KillJob (delete the pods except those in the retained phases; the PodGroup goes too)
  then an update: RestartJob -> Restarting (retryCount + 1), AbortJob -> Aborting ->
  Aborted, CompleteJob -> Completing -> Completed, TerminateJob -> Terminating ->
  Terminated once no pod is alive; a finished job kills what is left;
- KillTarget (RestartTask / RestartPod: the task's or the pod's pods only) -> Restarting.

Pure: a Step says what to do and how to update the status afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpulab.volcano import apis

Obj = dict[str, Any]
Update = Callable[[Mapping[str, Any], Obj], bool]

SYNC, KILL, KILL_TARGET = "sync", "kill", "kill_target"
RETAIN_NONE: frozenset[str] = frozenset()
RETAIN_SOFT = frozenset({"Succeeded", "Failed"})  # PodRetainPhaseSoft


@dataclass(frozen=True)
class Step:
    kind: str
    update: Update | None = None
    retain: frozenset[str] = RETAIN_NONE


def total_tasks(job: Mapping[str, Any]) -> int:
    return sum(int(t.get("replicas") or 0) for t in (job.get("spec") or {}).get("tasks") or [])


def total_task_min_available(job: Mapping[str, Any]) -> int:
    total = 0
    for t in (job.get("spec") or {}).get("tasks") or []:
        total += int(
            t["minAvailable"] if t.get("minAvailable") is not None else t.get("replicas") or 0
        )
    return total


def _to(phase: str, retry: bool = False) -> Update:
    def update(_job: Mapping[str, Any], status: Obj) -> bool:
        status.setdefault("state", {})["phase"] = phase
        if retry:
            status["retryCount"] = int(status.get("retryCount") or 0) + 1
        return True

    return update


def _set(status: Obj, phase: str) -> bool:
    status.setdefault("state", {})["phase"] = phase
    return True


def _n(status: Mapping[str, Any], key: str) -> int:
    return int(status.get(key) or 0)


def pending_update(job: Mapping[str, Any], status: Obj) -> bool:
    min_available = int((job.get("spec") or {}).get("minAvailable") or 0)
    if min_available <= _n(status, "running") + _n(status, "succeeded") + _n(status, "failed"):
        return _set(status, apis.JOB_RUNNING)
    return False


def running_update(job: Mapping[str, Any], status: Obj) -> bool:
    spec = job.get("spec") or {}
    replicas = total_tasks(job)
    if replicas == 0:
        return False
    min_success = spec.get("minSuccess")
    succeeded, failed = _n(status, "succeeded"), _n(status, "failed")
    if min_success is not None and succeeded >= int(min_success):
        return _set(status, apis.JOB_COMPLETED)
    min_available = int(spec.get("minAvailable") or 0)
    if succeeded + failed == replicas:
        if min_available >= total_task_min_available(job):
            for task in spec.get("tasks") or []:
                if task.get("minAvailable") is None:
                    continue
                counts = (status.get("taskStatusCount") or {}).get(task["name"])
                if counts is not None and counts["phase"].get("Succeeded", 0) < int(
                    task["minAvailable"]
                ):
                    return _set(status, apis.JOB_FAILED)
        if min_success is not None and succeeded < int(min_success):
            return _set(status, apis.JOB_FAILED)
        return _set(status, apis.JOB_COMPLETED if succeeded >= min_available else apis.JOB_FAILED)
    if _n(status, "pending") > replicas - min_available:
        return _set(status, apis.JOB_PENDING)
    return False


def restarting_update(job: Mapping[str, Any], status: Obj) -> bool:
    spec = job.get("spec") or {}
    if _n(status, "retryCount") >= int(spec.get("maxRetry") or 0):
        return _set(status, apis.JOB_FAILED)
    if total_tasks(job) - _n(status, "terminating") >= _n(status, "minAvailable"):
        return _set(status, apis.JOB_PENDING)
    return False


def _when_quiet(phase: str) -> Update:
    """Aborting / Completing / Terminating: the end phase once no pod is alive."""

    def update(_job: Mapping[str, Any], status: Obj) -> bool:
        if _n(status, "terminating") or _n(status, "pending") or _n(status, "running"):
            return False
        return _set(status, phase)

    return update


def next_step(phase: str, action: str) -> Step:
    """NewState(job).Execute(action)."""
    restart_target = (apis.RESTART_TASK, apis.RESTART_POD, apis.RESTART_PARTITION)
    if phase in ("", apis.JOB_PENDING, apis.JOB_RUNNING):
        if action == apis.RESTART_JOB:
            return Step(KILL, _to(apis.JOB_RESTARTING, retry=True))
        if action in restart_target:
            return Step(KILL_TARGET, _to(apis.JOB_RESTARTING, retry=True))
        if action == apis.ABORT_JOB:
            return Step(KILL, _to(apis.JOB_ABORTING), RETAIN_SOFT)
        if action == apis.COMPLETE_JOB:
            return Step(KILL, _to(apis.JOB_COMPLETING), RETAIN_SOFT)
        if action == apis.TERMINATE_JOB:
            return Step(KILL, _to(apis.JOB_TERMINATING), RETAIN_SOFT)
        return Step(SYNC, running_update if phase == apis.JOB_RUNNING else pending_update)
    if phase == apis.JOB_RESTARTING:
        if action == apis.SYNC_JOB:
            return Step(SYNC, restarting_update)
        if action in restart_target:
            return Step(KILL_TARGET, restarting_update)
        return Step(KILL, restarting_update)
    if phase in (apis.JOB_ABORTING, apis.JOB_ABORTED):
        if action == apis.RESUME_JOB:
            return Step(KILL, _to(apis.JOB_RESTARTING, retry=True), RETAIN_SOFT)
        if phase == apis.JOB_ABORTED:
            return Step(KILL, None, RETAIN_SOFT)
        return Step(KILL, _when_quiet(apis.JOB_ABORTED), RETAIN_SOFT)
    if phase == apis.JOB_COMPLETING:
        return Step(KILL, _when_quiet(apis.JOB_COMPLETED), RETAIN_SOFT)
    if phase == apis.JOB_TERMINATING:
        return Step(KILL, _when_quiet(apis.JOB_TERMINATED), RETAIN_SOFT)
    return Step(KILL, None, RETAIN_SOFT)  # Completed, Terminated, Failed
