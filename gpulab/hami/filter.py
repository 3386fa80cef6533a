"""Filter, top-down: decode → fit on every candidate node → pick one → record.

Mirrors Project-HAMi/HAMi v2.10.0 ``Scheduler.Filter`` and ``filterSimulation``
(``pkg/scheduler/scheduler.go``), ``calcScore`` / ``recordFilteringFailures``
(``pkg/scheduler/score.go``), ``genSuccessMsg`` and the Filter half of
``pkg/scheduler/event.go``. The decisions are the pure functions of ``score.py``.

One request, in order:
1. decode the ExtenderArgs (an unreadable body is a 200 with ``Error``, as upstream);
2. the pod's requests, one per container, init containers first; none → pass through;
3. ``args.Nodes`` given (not nodeCacheCapable) → ``filterSimulation``: fit on the nodes'
   registrations with nothing used, pick, change nothing;
4. the pod's policies and weights (an unknown one is an ``Error``, see below);
5. give back what an earlier Filter reserved for this pod, fit on every candidate node
   (``fit_node``; results are reused while a node's usage is unchanged), pick one node
   (binpack: fullest, spread: emptiest) and reserve its cards at once;
6. none fits → ``FilteringFailed`` Events and ``FailedNodes``;
7. patch the pod: ``hami.io/vgpu-node``, ``hami.io/vgpu-time``, the devices in both
   ``vgpu-devices-to-allocate`` and ``vgpu-devices-allocated`` (one slot per container,
   init containers first), and the lab's ``gpulab.io/filter-result``;
8. ``FilteringSucceed`` and the lab's ``Filter`` step; answer exactly one node.

Lab differences, named: an unknown ``hami.io/gpu-scheduler-policy`` or
``node-scheduler-policy`` value is reported as the Filter's ``Error`` (upstream falls back
to spread/binpack silently); a pod no node fits loses a stale ``hami.io/vgpu-node``
assignment from an earlier Filter (upstream leaves it, and its next update re-charges it);
``gpulab.io/filter-result`` (the per-node table `gpulab explain pod` prints) is the lab's;
for a pod no node fits it is written at the first failure and not rewritten at retries.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from gpulab.hami import annotations as ann
from gpulab.hami import events as ev
from gpulab.hami.cluster import ClusterError
from gpulab.hami.device import (
    ContainerRequest,
    RequestError,
    annotations,
    container_lists,
    pod_requests,
    wants_devices,
)
from gpulab.hami.nodes import cards_of
from gpulab.hami.pods import PodInfo, collapse_init_usage
from gpulab.hami.scheduler import Scheduler, meta, node_devices, pod_ref
from gpulab.hami.score import (
    NODE_UNREGISTERED,
    SPREAD,
    FitOptions,
    NodeResult,
    PolicyError,
    fit_node,
    options_for,
    parse_reason,
    pick_node,
)

_log = logging.getLogger(__name__)

FILTER_RESULT = "gpulab.io/filter-result"
RECORD_ROWS = 20  # nodes listed in the filter-result annotation; the rest are summarised


class BadArgs(ValueError):
    """The body is not an ExtenderArgs (Go's json.Decode would fail)."""


def result(
    names: list[str] | None = None,
    failed: dict[str, str] | None = None,
    error: str = "",
    nodes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """ExtenderFilterResult with Go's field names; nil fields are JSON null."""
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": None,
        "Error": error,
    }


def filter(s: Scheduler, args: Any) -> dict[str, Any]:
    """``Scheduler.Filter``: exactly one node, or why none fits."""
    try:
        pod, names, nodes = decode_args(args)
        reqs = pod_requests(pod, s.cfg.nvidia)
        annos = annotations(pod)
    except (BadArgs, RequestError) as exc:
        return result(error=str(exc))
    if not wants_devices(reqs):
        return result(names=names)
    if nodes is not None:
        return simulate(s, pod, reqs, annos, nodes)
    ref = pod_ref(pod)
    names = names or []  # neither names nor nodes: nothing can fit
    try:
        opts = options_for(annos, s.cfg.node_policy, s.cfg.gpu_policy)
    except PolicyError as exc:
        message = f"calcScore failed {exc} for pod {ref.name}"
        s.events.hami(ref, ev.FILTERING_FAILED, message, warning=True)
        s.events.step("Filter", ref, message, warning=True)
        return result(error=message)
    n_init = len(container_lists(pod)[0])
    uid = str(meta(pod).get("uid", ""))
    with s.lock:
        s.take_pod(uid)
        namespace = ref.namespace or "default"
        shape = fit_shape(s, reqs, n_init, opts, namespace)
        results = [fit_on(s, n, reqs, n_init, opts, namespace, shape) for n in names]
        chosen = pick_node(results, opts.node_policy)
        if chosen is not None:
            shares = collapse_init_usage(chosen.devices, n_init)
            mig = ann.mig_allocations(chosen.devices)
            s.add_pod(
                PodInfo(
                    uid, ref.namespace or "default", ref.name, chosen.node, shares, pod=pod,
                    mig=mig,
                )
            )  # fmt: skip
    failed = {r.node: r.reason for r in results if not r.fit}
    record = filter_record(results, chosen, opts, s.clock().isoformat(timespec="seconds"))
    if chosen is None:
        _no_fit(s, pod, ref, names, results, record)
        return result(failed=failed)

    encoded = ann.encode_pod_devices(chosen.devices)
    allocation = {
        ann.ASSIGNED_NODE: chosen.node,
        ann.ASSIGNED_TIME: str(int(s.clock().timestamp())),
        ann.DEVICES_TO_ALLOCATE: encoded,
        ann.DEVICES_ALLOCATED: encoded,
        FILTER_RESULT: record,
    }
    mig = ann.mig_allocations(chosen.devices)
    if mig:  # PatchAnnotations: the MIG reservations beside the devices
        allocation[ann.MIG_ALLOCATIONS] = ann.dump_mig_allocations(mig)
    if s.cfg.async_filter_patch:
        _write_later(s, uid, ref, allocation)
    else:
        try:
            s.cluster.patch_pod_annotations(ref.namespace or "default", ref.name, allocation)
        except ClusterError as exc:
            _not_recorded(s, uid, ref, exc)
            return result(error=str(exc))

    fits = success_order([r for r in results if r.fit], opts.node_policy)
    success = (
        f"find fit node({chosen.node}), {len(names) - len(fits)} nodes not fit, {len(fits)} "
        f"nodes fit({','.join(f'{r.node}:{r.score:.2f}' for r in fits)})"
    )
    s.events.hami(ref, ev.FILTERING_SUCCEED, success, warning=False)
    s.events.step(
        "Filter",
        ref,
        f"{chosen.node} chosen ({opts.node_policy} nodes, {opts.gpu_policy} GPUs): "
        f"{len(fits)} of {len(results)} nodes fit{tie_note(fits)}; "
        f"GPUs {grants_line(chosen.devices)}",
        node=chosen.node,
        best={r.node: r.score for r in fits[-5:]},
    )
    return result(names=[chosen.node])


def _not_recorded(s: Scheduler, uid: str, ref: Any, exc: Exception) -> None:
    """The decision could not be written: give the cards back."""
    with s.lock:
        s.take_pod(uid)
    s.events.hami(ref, ev.FILTERING_FAILED, str(exc), warning=True)
    s.events.step("Filter", ref, f"could not record the decision: {exc}", warning=True)


def _write_later(s: Scheduler, uid: str, ref: Any, allocation: dict[str, str | None]) -> None:
    """Lab experiment ``--gpulab-async-filter-patch``: answer kube-scheduler now and write
    the pod's annotations meanwhile; Bind waits for the write (upstream writes first)."""

    def write() -> None:
        s.cluster.patch_pod_annotations(ref.namespace or "default", ref.name, allocation)

    future = s.write_later(uid, write)

    def done(f: Any) -> None:
        exc = f.exception()
        if exc is not None and s.pending.get(uid, f) is f:  # no newer Filter meanwhile
            _not_recorded(s, uid, ref, exc)

    future.add_done_callback(done)


def fit_shape(
    s: Scheduler,
    reqs: tuple[ContainerRequest, ...],
    n_init: int,
    opts: FitOptions,
    namespace: str,
) -> int:
    """What a node's Fit result depends on besides the node's usage: the request, its
    policies and, when the namespace has a quota, the quota's state. As a small number
    (``NodeManager.shape``), hashed once per Filter, not once per node. Caller holds the
    lock."""
    quota_key = s.quotas.key(namespace)
    return s.nodes.shape((reqs, n_init, opts, namespace if quota_key else None, quota_key))


def fit_on(
    s: Scheduler,
    name: str,
    reqs: tuple[ContainerRequest, ...],
    n_init: int,
    opts: FitOptions,
    namespace: str,
    shape: int | None = None,
) -> NodeResult:
    """``scoreNode`` on one candidate, reusing the node's result for the same ``shape``
    (``fit_shape``) while its usage is unchanged. Caller holds the lock."""
    entry = s.nodes.get(name)
    if entry is None:
        return NodeResult(name, fit=False, reason=NODE_UNREGISTERED)
    if shape is None:
        shape = fit_shape(s, reqs, n_init, opts, namespace)
    cached = entry.results.get(shape)
    if cached is not None:
        return cached
    quota = None
    if s.quotas.limited(namespace):

        def quota(mem: int, cores: int) -> bool:
            return s.quotas.fits(namespace, mem, cores)

    found = fit_node(name, entry.cards, reqs, n_init, opts, entry.extras, quota)
    s.nodes.remember(entry, shape, found)
    return found


def simulate(
    s: Scheduler,
    pod: Mapping[str, Any],
    reqs: tuple[ContainerRequest, ...],
    annos: Mapping[str, str],
    nodes: list[dict[str, Any]],
) -> dict[str, Any]:
    """``filterSimulation`` (kube-scheduler sent Node objects, not only names): fit on each
    node's registration as if nothing were used on it, pick, and reserve nothing."""
    try:
        opts = options_for(annos, s.cfg.node_policy, s.cfg.gpu_policy)
    except PolicyError as exc:
        return result(error=f"calcScore failed {exc} for pod {meta(pod).get('name', '')}")
    n_init = len(container_lists(pod)[0])
    failed: dict[str, str] = {}
    results = []
    for node in nodes:
        name = str(meta(node).get("name", ""))
        try:
            devices, extras = node_devices(node)
        except ann.AnnotationError:
            failed[name] = NODE_UNREGISTERED
            continue
        results.append(fit_node(name, cards_of(devices), reqs, n_init, opts, extras))
    failed.update({r.node: r.reason for r in results if not r.fit})
    best = pick_node(results, opts.node_policy)
    if best is None:
        return result(failed=failed)
    items = [n for n in nodes if meta(n).get("name") == best.node][:1]
    return result(nodes={"items": items}, failed=failed)


def _no_fit(
    s: Scheduler,
    pod: Mapping[str, Any],
    ref: Any,
    names: Sequence[str],
    results: Sequence[NodeResult],
    record: str,
) -> None:
    """``recordFilteringFailures`` + the Filter's own FilteringFailed; drop a stale
    assignment so it holds no cards on its next update (lab)."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for r in results:
        if not r.fit:
            for reason in parse_reason(r.reason):
                by_reason[reason].append(r.node)
    for reason, nodes in sorted(by_reason.items()):
        note = f"{len(nodes)} nodes {reason}({','.join(sorted(nodes))})"
        s.events.hami(ref, ev.FILTERING_FAILED, note, warning=True)
    message = f"no available node, {len(names)} nodes do not meet"
    s.events.hami(ref, ev.FILTERING_FAILED, message, warning=True)
    # by node name: kube-scheduler's candidate order varies per retry, the note must not
    # (a repeated note is one Event series)
    reasons = "; ".join(
        f"{r.node}: {r.reason}" for r in sorted(results, key=lambda r: r.node) if not r.fit
    )
    s.events.step(
        "Filter", ref, f"no node fits: {reasons or 'no candidate nodes'}"[:1000], warning=True
    )
    annos = meta(pod).get("annotations") or {}
    assigned = (ann.ASSIGNED_NODE, ann.DEVICES_TO_ALLOCATE, ann.DEVICES_ALLOCATED,
                ann.MIG_ALLOCATIONS)  # fmt: skip
    stale = set(assigned) & set(annos)
    if not stale and _failure_recorded(annos.get(FILTER_RESULT)):
        # the first failure is on record; rewriting it at every retry would count as a pod
        # update and send the pod straight back to Filter
        return
    patch: dict[str, str | None] = {FILTER_RESULT: record, **dict.fromkeys(stale)}
    try:
        s.cluster.patch_pod_annotations(ref.namespace or "default", ref.name, patch)
    except ClusterError as exc:
        _log.warning("could not annotate pod %s: %s", ref, exc)


# -- wire format and records ---------------------------------------------------------------


def _keys(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Go's encoding/json matches field names case-insensitively; so do we."""
    return {k.lower(): v for k, v in obj.items() if isinstance(k, str)}


def decode_args(args: Any) -> tuple[dict[str, Any], list[str] | None, list[dict[str, Any]] | None]:
    """ExtenderArgs → (pod, NodeNames, Node objects or None)."""
    if not isinstance(args, Mapping):
        raise BadArgs("json: cannot unmarshal into Go value of type v1.ExtenderArgs")
    keys = _keys(args)
    pod = keys.get("pod")
    if pod is None:
        raise BadArgs("extender args missing pod")
    if not isinstance(pod, Mapping) or not isinstance(pod.get("metadata", {}), Mapping):
        raise BadArgs("json: cannot unmarshal ExtenderArgs.Pod into Go value of type v1.Pod")
    m = pod.get("metadata") or {}
    for key in ("name", "namespace", "uid"):
        if not isinstance(m.get(key, ""), str):
            raise BadArgs(f"json: cannot unmarshal ExtenderArgs.Pod.metadata.{key} into a string")
    names = keys.get("nodenames")
    if names is not None and (
        not isinstance(names, list) or not all(isinstance(n, str) for n in names)
    ):
        raise BadArgs(
            "json: cannot unmarshal ExtenderArgs.NodeNames into Go value of type []string"
        )
    nodes_obj = keys.get("nodes")
    nodes: list[dict[str, Any]] | None = None
    if nodes_obj is not None:
        items = nodes_obj.get("items") if isinstance(nodes_obj, Mapping) else None
        if not isinstance(items, list) or not all(
            isinstance(n, Mapping) and isinstance(meta(n).get("name", ""), str) for n in items
        ):
            raise BadArgs(
                "json: cannot unmarshal ExtenderArgs.Nodes into Go value of type v1.NodeList"
            )
        nodes = [dict(n) for n in items]
    return dict(pod), list(names) if names is not None else None, nodes


def filter_record(
    results: Sequence[NodeResult], chosen: NodeResult | None, opts: FitOptions, when: str
) -> str:
    """The ``gpulab.io/filter-result`` annotation `gpulab explain pod` prints: the chosen
    node, the best others and the failures, at most RECORD_ROWS rows plus a summary."""
    fits = sorted((r for r in results if r.fit and r is not chosen), key=lambda r: r.node)
    unfit = sorted((r for r in results if not r.fit), key=lambda r: r.node)
    rows = ([chosen] if chosen else []) + fits + unfit
    summary: dict[str, int] = defaultdict(int)
    for r in results:
        summary[r.reason or "fit"] += 1
    return json.dumps(
        {
            "time": when,
            "nodePolicy": opts.node_policy,
            "gpuPolicy": opts.gpu_policy,
            "chosen": chosen.node if chosen else None,
            "nodes": [
                {
                    "node": r.node,
                    "fit": r.fit,
                    "reason": r.reason,
                    "score": r.score,
                    "devices": [[g.uuid for g in ctr] for ctr in r.devices],
                }
                for r in rows[:RECORD_ROWS]
            ],
            "omitted": max(0, len(rows) - RECORD_ROWS),
            "summary": dict(sorted(summary.items())),
        },
        separators=(",", ":"),
    )


def success_order(fits: list[NodeResult], node_policy: str) -> list[NodeResult]:
    """``sort.Sort(nodeScores)`` order: the chosen node (``pick_node``) comes last."""
    by_name = sorted(fits, key=lambda r: r.node, reverse=True)
    sign = -1.0 if node_policy == SPREAD else 1.0
    return sorted(by_name, key=lambda r: sign * (r.score or 0.0))


def tie_note(ordered: Sequence[NodeResult]) -> str:
    """Why the last of ``success_order`` won when its score is no better than others'
    (every score 0.00 on idle GPUs): Go's sort leaves ties in no set order; the lab
    takes the first node by name."""
    if len(ordered) < 2 or ordered[-2].score != ordered[-1].score:
        return ""
    tied = sum(1 for r in ordered if r.score == ordered[-1].score)
    return (
        f", {tied} tie at score {ordered[-1].score or 0.0:.2f}: the first by name wins "
        "(upstream's sort leaves ties in no set order)"
    )


def _failure_recorded(old: str | None) -> bool:
    """The pod's filter-result already says no node fit."""
    if old is None:
        return False
    try:
        return json.loads(old).get("chosen", "") is None
    except (json.JSONDecodeError, AttributeError):
        return False


def grants_line(devices: Sequence[Sequence[ann.ContainerDevice]]) -> str:
    return "; ".join(
        ", ".join(f"{g.uuid} {g.usedmem}MiB {g.usedcores}%" for g in ctr) or "-" for ctr in devices
    )
