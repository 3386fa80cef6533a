"""An in-memory API server for the Kueue controller tests: it stores objects with
resourceVersions (409 on a stale write), enforces the pod-template rules the real API
server applies to Jobs and Pods (422), and delivers every change to the manager as its
informers would: synchronously, or held back until released (``hold``/``release``), as
a watch delivers an event some time after the write."""

from __future__ import annotations

import copy
import io
import itertools
import json
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException

from gpulab.informer import JOBS, PODS, Resource, key_of
from gpulab.kueue.config import Configuration
from gpulab.kueue.controllers.client import RESOURCE_CLAIM_TEMPLATES
from gpulab.kueue.controllers.manager import WATCHED, Manager
from gpulab.trace import Tracer

Obj = dict[str, Any]
_SCHEDULING = ("nodeSelector", "tolerations", "affinity", "schedulingGates")


def merge(target: Obj, patch: Obj) -> None:
    """RFC 7386 JSON merge patch."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


def _unprocessable(message: str) -> ApiException:
    exc = ApiException(status=422, reason="Unprocessable Entity")
    exc.body = json.dumps({"message": message})
    return exc


def _without(template: Obj, spec_keys: tuple[str, ...]) -> Obj:
    t = copy.deepcopy(template)
    t.pop("metadata", None)
    for k in spec_keys:
        (t.get("spec") or {}).pop(k, None)
    return t


def check_job_update(old: Obj, new: Obj) -> None:
    """ValidateJobUpdate: the pod template is immutable, except the scheduling
    directives, labels and annotations of a suspended Job without a startTime (or with
    its Suspended condition) and without active pods (v1.36,
    MutableSchedulingDirectivesForSuspendedJobs)."""
    a, b = old["spec"].get("template"), new["spec"].get("template")
    if a == b:
        return
    status = old.get("status") or {}
    stopped = not status.get("startTime") or any(
        c.get("type") == "Suspended" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    mutable = old["spec"].get("suspend") and stopped and not status.get("active")
    if not mutable or _without(a, _SCHEDULING) != _without(b, _SCHEDULING):
        raise _unprocessable("spec.template: Invalid value: field is immutable")


def check_pod_update(old: Obj, new: Obj) -> None:
    """ValidatePodUpdate: only a gated pod's nodeSelector may be added to, gates only
    removed; the rest of the spec is immutable (labels, annotations, finalizers are not)."""
    a, b = old.get("spec") or {}, new.get("spec") or {}
    if _without({"spec": a}, _SCHEDULING) != _without({"spec": b}, _SCHEDULING):
        raise _unprocessable("spec: Forbidden: pod updates may not change fields other than ...")
    if a.get("nodeSelector") != b.get("nodeSelector"):
        gated = bool(a.get("schedulingGates"))
        kept = all(
            b.get("nodeSelector", {}).get(k) == v for k, v in (a.get("nodeSelector") or {}).items()
        )
        if not gated or not kept:
            raise _unprocessable("spec.nodeSelector: Invalid value: only additions to a gated pod")
    old_gates = [g["name"] for g in a.get("schedulingGates") or []]
    new_gates = [g["name"] for g in b.get("schedulingGates") or []]
    if any(g not in old_gates for g in new_gates):
        raise _unprocessable("spec.schedulingGates: Forbidden: only deletion is allowed")


class FakeKube:
    """What the manager calls on KubeClient."""

    def __init__(self) -> None:
        # what the manager watches, and what it only reads
        self.objects: dict[str, dict[str, Obj]] = {
            r.plural: {} for r in [*(r for r, _ in WATCHED), RESOURCE_CLAIM_TEMPLATES]
        }
        self.held: list[tuple[Resource, str, Obj]] | None = None  # events not delivered yet
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)
        self.manager: Manager | None = None
        self.conflicts_left = 0  # fail the next N status writes with 409
        self.job_errors_left = 0  # fail the next N Job patches with 500 (a webhook unreachable)
        self.rejected: list[str] = []  # 422s the controllers provoked
        self.writes = 0
        self.clock = 1_000_000.0

    # -- delivery ---------------------------------------------------------------------------

    def hold(self) -> None:
        """From now on keep the watch events until ``release``."""
        self.held = []

    def release(self) -> None:
        held, self.held = self.held or [], None
        for res, type_, obj in held:
            self._deliver(res, type_, obj)

    def _deliver(self, res: Resource, type_: str, obj: Obj) -> None:
        if self.manager is None or res.plural not in self.manager.stores:
            return
        if self.held is not None:
            self.held.append((res, type_, copy.deepcopy(obj)))
            return
        store = self.manager.store(res)
        old = store.apply(type_, copy.deepcopy(obj))
        h = self.manager.handlers(res)
        if type_ == "DELETED" and h.on_delete:
            h.on_delete(copy.deepcopy(obj))
        elif old is None and h.on_add:
            h.on_add(copy.deepcopy(obj))
        elif old is not None and type_ != "DELETED" and h.on_update:
            h.on_update(old, copy.deepcopy(obj))

    def attach(self, manager: Manager) -> None:
        self.manager = manager
        for res, _sel in WATCHED:
            for obj in list(self.objects[res.plural].values()):
                self._deliver(res, "ADDED", obj)

    def _save(self, res: Resource, obj: Obj, type_: str) -> Obj:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[res.plural][key_of(obj)] = obj
        self.writes += 1
        self._deliver(res, type_, obj)
        return copy.deepcopy(obj)

    def _current(self, res: Resource, obj: Obj) -> Obj:
        current = self.objects[res.plural].get(key_of(obj))
        if current is None:
            raise ApiException(status=404, reason="Not Found")
        return current

    # -- the API --------------------------------------------------------------------------------

    def add(self, res: Resource, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta.setdefault("uid", f"uid-{next(self._uid)}")
        seconds = int(self.clock) % 60
        meta.setdefault("creationTimestamp", f"2026-01-01T00:{seconds // 60:02d}:{seconds:02d}Z")
        meta.setdefault("generation", 1)
        obj.setdefault("apiVersion", res.api_version)
        obj.setdefault("kind", res.kind)
        if key_of(obj) in self.objects[res.plural]:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._save(res, obj, "ADDED")

    create = add

    def get(self, res: Resource, namespace: str | None, name: str) -> Obj:
        key = f"{namespace}/{name}" if namespace else name
        if key not in self.objects[res.plural]:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.objects[res.plural][key])

    def patch(self, res: Resource, obj: Obj, body: Obj) -> Obj:
        current = self._current(res, obj)
        if res is JOBS and self.job_errors_left > 0:
            self.job_errors_left -= 1
            raise ApiException(status=500, reason="Internal Server Error")
        new = copy.deepcopy(current)
        merge(new, body)
        self._check(res, current, new)
        return self._save(res, new, "MODIFIED")

    def patch_status(self, res: Resource, obj: Obj, body: Obj) -> Obj:
        current = self._current(res, obj)
        new = copy.deepcopy(current)
        merge(new, {"status": body.get("status") or {}})
        return self._save(res, new, "MODIFIED")

    def replace_status(self, res: Resource, obj: Obj) -> Obj:
        current = self._current(res, obj)
        if (
            self.conflicts_left > 0
            or obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]
        ):
            self.conflicts_left = max(0, self.conflicts_left - 1)
            raise ApiException(status=409, reason="Conflict")
        new = copy.deepcopy(current)
        new["status"] = copy.deepcopy(obj.get("status") or {})
        return self._save(res, new, "MODIFIED")

    def update(self, res: Resource, obj: Obj) -> Obj:
        current = self._current(res, obj)
        if obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        new = copy.deepcopy(obj)
        new["status"] = copy.deepcopy(current.get("status"))
        self._check(res, current, new)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            del self.objects[res.plural][key_of(new)]
            self._deliver(res, "DELETED", new)
            return new
        return self._save(res, new, "MODIFIED")

    def delete(self, res: Resource, obj: Obj) -> None:
        current = self.objects[res.plural].get(key_of(obj))
        if current is None:
            return
        if current["metadata"].get("finalizers"):
            current = copy.deepcopy(current)
            current["metadata"]["deletionTimestamp"] = "2026-01-01T01:00:00Z"
            self._save(res, current, "MODIFIED")
            return
        del self.objects[res.plural][key_of(obj)]
        self._deliver(res, "DELETED", current)

    def _check(self, res: Resource, old: Obj, new: Obj) -> None:
        try:
            if res == JOBS:
                check_job_update(old, new)
            elif res == PODS:
                check_pod_update(old, new)
        except ApiException as exc:
            self.rejected.append(json.loads(exc.body)["message"])
            raise

    # -- helpers for tests ----------------------------------------------------------------------

    def obj(self, res: Resource, key: str) -> Obj:
        return copy.deepcopy(self.objects[res.plural][key])

    def all(self, res: Resource) -> list[Obj]:
        return [copy.deepcopy(o) for o in self.objects[res.plural].values()]


def new_manager(
    kube: FakeKube, config: Configuration | None = None, clock: Callable[[], float] | None = None
) -> tuple[Manager, io.StringIO]:
    log = io.StringIO()
    m = Manager(
        kube,  # type: ignore[arg-type]
        Tracer("kueue-controller", stream=log),
        config,
        clock=clock or (lambda: kube.clock),
        batch_period=0,
    )
    kube.attach(m)
    return m, log


def settle(m: Manager, rounds: int = 50) -> None:
    """Run the work queues and scheduling cycles until nothing is left to do."""
    queues = [
        (m.workload_q, m.workloads.reconcile),
        (m.job_q, m.jobs.reconcile),
        (m.status_q, m.statuses.reconcile),
        (m.requeue_q, m._requeue),
        (m.check_q, m.checks.reconcile),
    ]
    for _ in range(rounds):
        busy = False
        for q, fn in queues:
            while (key := q.get(timeout=0)) is not None:
                busy = True
                try:
                    fn(key)
                except ApiException:
                    q.add(key)  # run_worker retries a failed Reconcile (after a back-off)
                finally:
                    q.done(key)
        heads = m.queues.heads()
        if heads:
            writes = m.kube.writes  # type: ignore[attr-defined]
            m.scheduler.schedule(heads)
            busy = busy or m.kube.writes != writes  # type: ignore[attr-defined]
        if not busy:
            return
    raise AssertionError("the controllers did not settle")


def trace(log: io.StringIO) -> list[dict[str, Any]]:
    """The trace lines the manager wrote (step, object, message, ...)."""
    return [json.loads(line) for line in log.getvalue().splitlines()]


def steps(log: io.StringIO) -> list[str]:
    return [line["step"] for line in trace(log)]
