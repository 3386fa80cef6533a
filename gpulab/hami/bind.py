"""Bind, top-down: read the pod and node → take the node lock → mark allocating → Binding.

Mirrors Project-HAMi/HAMi v2.10.0 ``Scheduler.Bind``, ``acquireNodeLocks``,
``lockAllDevices`` / ``releaseAllDevices`` (``pkg/scheduler/scheduler.go``), NVIDIA
``LockNode`` / ``ReleaseNodeLock`` (``pkg/device/nvidia/device.go``) and the Bind half of
``pkg/scheduler/event.go``.

One request, in order:
1. the pod and the node from the informers' caches (a missing pod gives back what Filter
   reserved for it);
2. ``hami.io/mutex.lock`` on the node (``nodelock.lock_node``), for pods whose containers
   ask for NVIDIA devices. Contention fails the Bind at once — kube-scheduler retries the
   pod later — except for PodGroup members (label ``scheduling.x-k8s.io/pod-group``), which
   wait up to ``--node-lock-retry-timeout`` (28s);
3. ``hami.io/bind-phase: allocating`` and ``hami.io/bind-time`` on the pod (the devices
   were written by Filter);
4. the Binding. The lock stays: the device plugin releases it after the pod's last
   Allocate (``PodAllocationTrySuccess``). Any failure releases this pod's lock here and
   records ``BindingFailed``; success records ``BindingSucceed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.hami import annotations as ann
from gpulab.hami import events as ev
from gpulab.hami import nodelock
from gpulab.hami.cluster import ClusterError
from gpulab.hami.config import go_duration_string
from gpulab.hami.device import container_lists, container_request
from gpulab.hami.scheduler import Scheduler, meta
from gpulab.trace import ObjectRef
from gpulab.wait import retry_call

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
_LOCK_POLL = 0.1  # acquireNodeLocks waits 100 ms between tries
FILTER_WRITE_WAIT = 10.0  # seconds Bind waits for Filter's annotation write (experiment)


class BadArgs(ValueError):
    """The body is not an ExtenderBindingArgs."""


def bind(s: Scheduler, args: Any) -> dict[str, str]:
    """``Scheduler.Bind``: {"Error": ""} when bound, else the reason."""
    try:
        ns, name, uid, node = decode_args(args)
    except BadArgs as exc:
        return {"Error": str(exc)}
    ref = ObjectRef("Pod", name, ns, uid or None)
    assert s.listers is not None, "Bind before the informers synced"
    pod = s.listers.pod(ns, name)
    if pod is None:
        with s.lock:
            s.take_pod(uid)  # cleanupStalePodAllocation
        return {"Error": f'pod "{name}" not found'}
    if s.listers.node(node) is None:
        s.events.hami(ref, ev.BINDING_FAILED, f"failed to get node {node}", warning=True)
        with s.lock:
            s.take_pod(str(meta(pod).get("uid", "")))
        return {"Error": f'node "{node}" not found'}

    written = s.pending.pop(str(meta(pod).get("uid", "")), None)
    if written is not None:  # --gpulab-async-filter-patch: Filter's write must land first
        try:
            written.result(timeout=FILTER_WRITE_WAIT)
        except Exception as exc:  # a failed write, or none within the wait
            reason = str(exc) or f"Filter's annotations not written within {FILTER_WRITE_WAIT:g}s"
            with s.lock:
                s.take_pod(str(meta(pod).get("uid", "")))
            s.events.hami(ref, ev.BINDING_FAILED, reason, warning=True)
            s.events.step("Bind", ref, f"binding to {node} failed: {reason}", warning=True)
            return {"Error": reason}
    locks = needs_lock(s, pod)
    try:
        if locks:
            acquire_node_lock(s, node, pod)
            s.events.step(
                "LockNode",
                ref,
                f"{nodelock.NODE_LOCK_KEY} taken on {node}; held until the device plugin's "
                "Allocate releases it",
                node=node,
            )
        s.cluster.patch_pod_annotations(
            ns,
            name,
            {
                ann.BIND_PHASE: ann.BIND_ALLOCATING,
                ann.BIND_TIME: str(int(s.clock().timestamp())),
            },
        )
        s.cluster.create_binding(ns, name, uid, node)
    except ClusterError as exc:
        if locks:
            _release(s, node, ns, name)
        s.events.hami(ref, ev.BINDING_FAILED, str(exc), warning=True)
        s.events.step("Bind", ref, f"binding to {node} failed: {exc}", warning=True, node=node)
        return {"Error": str(exc)}
    s.events.hami(
        ref,
        ev.BINDING_SUCCEED,
        f"Successfully binding node [{node}] to {ns}/{name}",
        warning=False,
    )
    s.events.step("Bind", ref, f"bound to {node}", node=node)
    return {"Error": ""}


def needs_lock(s: Scheduler, pod: Mapping[str, Any]) -> bool:
    """NVIDIA ``LockNode`` only locks for pods whose (app) containers ask for devices."""
    _, app = container_lists(pod)
    return any(container_request(c, s.cfg.nvidia).nums > 0 for c in app)


def pod_group_member(pod: Mapping[str, Any]) -> bool:
    """``IsPodGroupMember``: the Coscheduling label, or ``spec.schedulingGroup``."""
    if (meta(pod).get("labels") or {}).get(POD_GROUP_LABEL):
        return True
    group = (pod.get("spec") or {}).get("schedulingGroup") or {}
    return bool(group.get("podGroupName"))


def acquire_node_lock(s: Scheduler, node: str, pod: Mapping[str, Any]) -> None:
    """``acquireNodeLocks``: one try, or retries every 100 ms for PodGroup members."""
    m = meta(pod)
    ns, name = str(m.get("namespace", "default")), str(m.get("name", ""))

    def take() -> None:
        nodelock.lock_node(
            s.cluster, node, ns, name, now=s.clock(), timeout=s.cfg.node_lock_timeout
        )

    wait = s.cfg.node_lock_retry_timeout.total_seconds()
    if not (pod_group_member(pod) or s.cfg.lock_retry_all) or wait <= 0:
        take()
        return
    try:
        retry_call(
            take,
            lambda exc: isinstance(exc, nodelock.NodeLockContention),
            timeout=wait,
            initial=_LOCK_POLL,
            maximum=_LOCK_POLL,
            stop=s.stop,
        )
    except nodelock.NodeLockContention as exc:
        waited = go_duration_string(s.cfg.node_lock_retry_timeout)
        raise nodelock.NodeLockContention(
            f"timed out after {waited} waiting for node {node} to be unlocked: "
            f"{nodelock.CONTENTION}"
        ) from exc


def _release(s: Scheduler, node: str, ns: str, name: str) -> None:
    """``releaseAllDevices``: this pod's lock only (owner checked)."""
    try:
        nodelock.release_node_lock(s.cluster, node, ns, name)
    except ClusterError as exc:
        s.events.log.step(
            "ReleaseNodeLock", ObjectRef("Node", node), f"could not release: {exc}", warning=True
        )


def decode_args(args: Any) -> tuple[str, str, str, str]:
    """ExtenderBindingArgs → (namespace, name, uid, node)."""
    if not isinstance(args, Mapping):
        raise BadArgs("json: cannot unmarshal into Go value of type v1.ExtenderBindingArgs")
    keys = {k.lower(): v for k, v in args.items() if isinstance(k, str)}
    raw = [keys.get(k) for k in ("podnamespace", "podname", "poduid", "node")]
    values = [v if v is not None else "" for v in raw]
    if not all(isinstance(v, str) for v in values):
        raise BadArgs("json: cannot unmarshal ExtenderBindingArgs field into a string")
    ns, name, uid, node = values
    return ns, name, uid, node
