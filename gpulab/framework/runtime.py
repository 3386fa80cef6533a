"""The framework runtime: plugins built from a profile, run per extension point.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/runtime/framework.go``
(``NewFramework``, ``fillEnqueueExtensions``, ``expandMultiPointPlugins``,
``RunPreFilterPlugins`` ... ``RunPostBindPlugins``, ``RunPermitPlugins`` /
``AddWaitingPod`` / ``WillWaitOnPermit`` / ``WaitOnPermit``) and ``waiting_pods_map.go``
(``waitingPod``: one timer per Permit plugin that said Wait; ``Allow`` by every one of
them lets the pod go on, ``Reject`` or a timeout - "rejected due to timeout after waiting
1m0s at plugin X", Go's duration format - stops it).

The Framework is also the plugins' ``Handle``: the current snapshot, the waiting pods,
the cluster's objects (``informer(resource)`` stores, filled by the scheduler), the
binder and the tracer.

What each plugin said is kept in the cycle state's :class:`PluginResults` (as
kube-scheduler-simulator's debuggable scheduler records it), from which the scheduler
writes its trace steps and the Binding's result annotations.

Lab differences: plugins run one after another (upstream filters and scores nodes in
parallel); no metrics; PreFilter extensions (AddPod/RemovePod, used by preemption),
nominated pods in Filter and PreBindPreFlight are not implemented (no preemption, no
PreBind plugin).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpulab.framework.config import MULTI_POINT, PluginSet, Profile
from gpulab.framework.interface import (
    EXTENSION_POINTS,
    MAX_NODE_SCORE,
    MAX_PERMIT_TIMEOUT,
    MIN_NODE_SCORE,
    SUCCESS,
    Code,
    CycleState,
    EnqueueExtensions,
    FilterPlugin,
    NodePluginScores,
    NodeScore,
    NominatingMode,
    PermitPlugin,
    PostFilterResult,
    PreEnqueuePlugin,
    PreFilterPlugin,
    PreFilterResult,
    QueuedPodInfo,
    QueueSortPlugin,
    ReservePlugin,
    ScoreExtensions,
    Status,
    error,
    nominating_mode,
    unresolvable,
)
from gpulab.framework.queue import DefaultEnqueueExtension
from gpulab.framework.snapshot import NodeInfo, Snapshot, pod_key, pod_uid
from gpulab.informer import Handlers, Resource, Store
from gpulab.kube import own_pod
from gpulab.trace import ObjectRef, Tracer

Obj = Mapping[str, Any]


class Binder(Protocol):
    """Creates the Binding (pods/<name>/binding); see gpulab/framework/binding.py."""

    def bind(self, pod: Obj, node: str, annotations: Mapping[str, str]) -> None: ...


class Informers(Protocol):
    """The cluster's objects as the scheduler's informers hold them."""

    def store(self, resource: Resource, handlers: Handlers | None = None) -> Store:
        """The store of ``resource``, watched from now on, calling ``handlers`` too
        (plugins call this in New)."""
        ...


PluginFactory = Callable[[Mapping[str, Any], "Framework"], Any]
Registry = Mapping[str, PluginFactory]


class FrameworkError(ValueError):
    """A profile names a plugin that does not exist or cannot serve where it is enabled."""


# -- what plugins said, per extension point (kube-scheduler-simulator's result store) -----

PASSED = "passed"
RESULTS_KEY = "gpulab.io/plugin-results"


@dataclass
class PluginResults:
    pre_filter: dict[str, str] = field(default_factory=dict)
    filter: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> plugin -> result
    post_filter: dict[str, str] = field(default_factory=dict)
    score: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> plugin -> final
    # (node, note): how a plugin reached a node's score, told as Score steps after the
    # Filter step (scoring runs before the scheduler traces Filter)
    score_notes: list[tuple[str, str]] = field(default_factory=list)
    reserve: dict[str, str] = field(default_factory=dict)
    permit: dict[str, str] = field(default_factory=dict)
    pre_bind: dict[str, str] = field(default_factory=dict)
    bind: dict[str, str] = field(default_factory=dict)


def results_of(state: CycleState) -> PluginResults:
    results = state.get(RESULTS_KEY)
    if results is None:
        results = PluginResults()
        state.write(RESULTS_KEY, results)
    return results


# shouldHaveEnqueueExtensions: the plugins that can reject a pod
_MAY_REJECT = (PreEnqueuePlugin, PreFilterPlugin, FilterPlugin, ReservePlugin, PermitPlugin)


def go_duration(seconds: float) -> str:
    """Go's time.Duration.String(): "10s", "1m0s", "1.5s", "500ms", "0s"."""
    ns = round(abs(seconds) * 1e9)
    sign = "-" if seconds < 0 and ns else ""
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _decimal(ns, size) + unit
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    out = f"{hours}h" if hours else ""
    if hours or minutes:
        out += f"{minutes}m"
    return sign + out + _decimal(rest, 1_000_000_000) + "s"


def _decimal(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}." + f"{frac:0{digits}d}".rstrip("0")


def _describe(status: Status) -> str:
    if status.is_success():
        return "success"
    return f"{status.code}" + (f": {status.message}" if status.reasons else "")


# -- waiting pods (waiting_pods_map.go) ---------------------------------------------------


class WaitingPod:
    """A pod that passed Reserve and waits for every Permit plugin that asked it to."""

    def __init__(self, pod: Obj, plugin_timeouts: Mapping[str, float]) -> None:
        self.pod = pod
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._status: Status | None = None
        self._pending: dict[str, threading.Timer] = {}
        with self._lock:
            for plugin, timeout in plugin_timeouts.items():
                timer = threading.Timer(
                    timeout,
                    self.Reject,
                    (
                        plugin,
                        f"rejected due to timeout after waiting {go_duration(timeout)} "
                        f"at plugin {plugin}",
                    ),
                )
                timer.daemon = True
                self._pending[plugin] = timer
                timer.start()

    @property
    def uid(self) -> str:
        return pod_uid(self.pod)

    def GetPendingPlugins(self) -> list[str]:
        with self._lock:
            return list(self._pending)

    def Allow(self, plugin: str) -> None:
        """``plugin`` lets the pod go; once every waiting plugin has, it is permitted."""
        with self._lock:
            timer = self._pending.pop(plugin, None)
            if timer is not None:
                timer.cancel()
            if self._pending or self._status is not None:
                return
            self._status = SUCCESS
        self._done.set()

    def Reject(self, plugin: str, message: str) -> bool:
        """Stop waiting: the pod is unschedulable. False if it was decided already."""
        with self._lock:
            for timer in self._pending.values():
                timer.cancel()
            if self._status is not None:
                return False
            self._status = Status.of(Code.UNSCHEDULABLE, message).with_plugin(plugin)
        self._done.set()
        return True

    def wait(self) -> Status:
        self._done.wait()
        assert self._status is not None
        return self._status


class WaitingPodsMap:
    def __init__(self) -> None:
        self._pods: dict[str, WaitingPod] = {}
        self._lock = threading.Lock()

    def add(self, wp: WaitingPod) -> None:
        with self._lock:
            self._pods[wp.uid] = wp

    def remove(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)

    def get(self, uid: str) -> WaitingPod | None:
        with self._lock:
            return self._pods.get(uid)

    def list(self) -> list[WaitingPod]:
        with self._lock:
            return list(self._pods.values())


# -- the framework --------------------------------------------------------------------------


class Framework:
    """One profile's plugins, in the order its configuration gives, and their Handle."""

    def __init__(
        self,
        profile: Profile,
        registry: Registry,
        *,
        informers: Informers | None = None,
        binder: Binder | None = None,
        tracer: Tracer | None = None,
        waiting_pods: WaitingPodsMap | None = None,
    ) -> None:
        self.profile = profile
        self.profile_name = profile.scheduler_name
        self.informers = informers
        self.binder = binder
        self.tracer = tracer or Tracer(profile.scheduler_name)
        self.waiting_pods = waiting_pods or WaitingPodsMap()
        self._snapshot = Snapshot()
        self.plugins: dict[str, Any] = {}
        self.points: dict[str, list[Any]] = {}
        self.score_weights: dict[str, int] = {}
        self._build(registry)

    # ------------------------------------------------------------------ construction

    def _build(self, registry: Registry) -> None:
        wanted: list[str] = []
        for plugin_set in self.profile.plugins.values():
            wanted += [p.name for p in plugin_set.enabled if p.name not in wanted]
        for name in wanted:
            if name not in registry:
                raise FrameworkError(
                    f"profile {self.profile_name}: plugin {name!r} does not exist; "
                    f"known plugins: {', '.join(sorted(registry))}"
                )
            self.plugins[name] = registry[name](self.profile.plugin_config.get(name, {}), self)
        unused = set(self.profile.plugin_config) - set(self.plugins)
        if unused:
            raise FrameworkError(
                f"profile {self.profile_name}: pluginConfig for {sorted(unused)}, "
                "which is not enabled"
            )
        multi = self.profile.plugins[MULTI_POINT]
        for point, interface in EXTENSION_POINTS.items():
            self.points[point] = self._expand(point, interface, multi)
        self._score_weights(multi)
        if len(self.points["queueSort"]) != 1:
            raise FrameworkError(
                f"profile {self.profile_name}: exactly one queueSort plugin must be "
                f"enabled, got {[p.name for p in self.points['queueSort']]}"
            )
        if not self.points["bind"]:
            raise FrameworkError(f"profile {self.profile_name}: at least one bind plugin needed")

    def _expand(self, point: str, interface: type, multi: PluginSet) -> list[Any]:
        """expandMultiPointPlugins: explicit overrides first, then multiPoint plugins that
        implement this point, then the rest of the explicit ones."""
        specific = self.profile.plugins[point]
        for ref in specific.enabled:
            if not isinstance(self.plugins[ref.name], interface):
                raise FrameworkError(
                    f"profile {self.profile_name}: plugin {ref.name} does not extend {point}"
                )
        enabled = [ref.name for ref in specific.enabled]
        if "*" in specific.disabled:
            return [self.plugins[n] for n in enabled]
        multipoint: list[str] = []
        overrides: set[str] = set()
        for ref in multi.enabled:
            if not isinstance(self.plugins[ref.name], interface):
                continue
            if ref.name in specific.disabled:
                continue
            if ref.name in enabled:
                overrides.add(ref.name)
                continue
            if ref.name in multipoint:
                raise FrameworkError(f"plugin {ref.name!r} already registered as {point}")
            multipoint.append(ref.name)
        order = [n for n in enabled if n in overrides]
        order += multipoint
        order += [n for n in enabled if n not in overrides]
        return [self.plugins[n] for n in order]

    def _score_weights(self, multi: PluginSet) -> None:
        weights = {ref.name: ref.weight for ref in multi.enabled}
        weights.update({ref.name: ref.weight for ref in self.profile.plugins["score"].enabled})
        for plugin in self.points["score"]:
            self.score_weights[plugin.name] = weights.get(plugin.name) or 1

    # ------------------------------------------------------------------ the Handle

    def snapshot(self) -> Snapshot:
        """SnapshotSharedLister: the NodeInfos of the current scheduling cycle."""
        return self._snapshot

    def set_snapshot(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def informer(
        self,
        resource: Resource,
        on_add: Callable[[Obj], None] | None = None,
        on_update: Callable[[Obj, Obj], None] | None = None,
        on_delete: Callable[[Obj], None] | None = None,
    ) -> Store:
        """The cluster's ``resource`` objects; the handlers are called on every change."""
        if self.informers is None:
            raise FrameworkError(f"no informers: cannot watch {resource.plural}")
        handlers = None
        if on_add or on_update or on_delete:
            handlers = Handlers(on_add, on_update, on_delete)
        return self.informers.store(resource, handlers)

    def IterateOverWaitingPods(self, callback: Callable[[WaitingPod], None]) -> None:
        for wp in self.waiting_pods.list():
            callback(wp)

    def GetWaitingPod(self, uid: str) -> WaitingPod | None:
        return self.waiting_pods.get(uid)

    def RejectWaitingPod(self, uid: str) -> bool:
        wp = self.waiting_pods.get(uid)
        return wp.Reject("", "removed") if wp else False

    def QueueSortFunc(self) -> Callable[[QueuedPodInfo, QueuedPodInfo], bool]:
        plugin: QueueSortPlugin = self.points["queueSort"][0]
        return plugin.Less

    def EnqueueExtensions(self) -> list[EnqueueExtensions]:
        """fillEnqueueExtensions: the events each PreEnqueue, PreFilter, Filter, Reserve or
        Permit plugin registered; such a plugin without EventsToRegister registers every
        event."""
        out: list[EnqueueExtensions] = []
        for plugin in self.plugins.values():
            if not isinstance(plugin, _MAY_REJECT):
                continue
            if isinstance(plugin, EnqueueExtensions):
                out.append(plugin)
            else:
                out.append(DefaultEnqueueExtension(plugin.name))
        return out

    def PreEnqueuePlugins(self) -> list[PreEnqueuePlugin]:
        return list(self.points["preEnqueue"])

    def HasFilterPlugins(self) -> bool:
        return bool(self.points["filter"])

    def HasPostFilterPlugins(self) -> bool:
        return bool(self.points["postFilter"])

    def HasScorePlugins(self) -> bool:
        return bool(self.points["score"])

    # ------------------------------------------------------------------ scheduling cycle

    def RunPreFilterPlugins(
        self, state: CycleState, pod: Obj
    ) -> tuple[PreFilterResult | None, Status, set[str]]:
        """Run PreFilter; an Unschedulable one lets the others run (preemption may need
        their state), UnschedulableAndUnresolvable or Error stops at once."""
        results = results_of(state)
        nodes = self._snapshot.list()
        merged: PreFilterResult | None = None
        with_nodes: set[str] = set()
        returned = SUCCESS
        for plugin in self.points["preFilter"]:
            result, status = plugin.PreFilter(state, pod, nodes)
            results.pre_filter[plugin.name] = _describe(status)
            if status.is_skip():
                state.skip_filter_plugins.add(plugin.name)
                continue
            if not status.is_success():
                status = status.with_plugin(plugin.name)
                if status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                    return None, status, set()
                if status.code == Code.UNSCHEDULABLE:
                    returned = status
                    continue
                return (
                    None,
                    error(
                        f"running PreFilter plugin {plugin.name!r}: {status.message}"
                    ).with_plugin(plugin.name),
                    set(),
                )
            if result is not None and not result.all_nodes():
                with_nodes.add(plugin.name)
            merged = result if merged is None else merged.merge(result)
            if merged is not None and not merged.all_nodes() and not merged.node_names:
                names = sorted(with_nodes)
                msg = (
                    f"node(s) didn't satisfy plugin {names[0]}"
                    if len(names) == 1
                    else f"node(s) didn't satisfy plugin(s) {names} simultaneously"
                )
                return merged, unresolvable(msg), with_nodes
        return merged, returned, with_nodes

    def RunFilterPlugins(self, state: CycleState, pod: Obj, node: NodeInfo) -> Status:
        """Filter plugins for one node, in order, until one says no."""
        per_plugin = results_of(state).filter.setdefault(node.name, {})
        for plugin in self.points["filter"]:
            if plugin.name in state.skip_filter_plugins:
                continue
            status = plugin.Filter(state, pod, node)
            if not status.is_success():
                if not status.is_rejected():
                    status = error(f"running {plugin.name!r} filter plugin: {status.message}")
                per_plugin[plugin.name] = status.message
                return status.with_plugin(plugin.name)
            per_plugin[plugin.name] = PASSED
        return SUCCESS

    def RunPostFilterPlugins(
        self, state: CycleState, pod: Obj, node_to_status: Mapping[str, Status]
    ) -> tuple[PostFilterResult | None, Status]:
        """Until one succeeds (or is unresolvable/errors); the others' reasons are joined."""
        results = results_of(state)
        reasons: list[str] = []
        rejector = ""
        result: PostFilterResult | None = None
        for plugin in self.points["postFilter"]:
            r, status = plugin.PostFilter(state, pod, node_to_status)
            results.post_filter[plugin.name] = _describe(status)
            if status.is_success():
                return r, status
            if status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                return r, status.with_plugin(plugin.name)
            if not status.is_rejected():
                return None, error(status.message).with_plugin(plugin.name)
            if r is not None and nominating_mode(r.nominating_info) is not NominatingMode.NOOP:
                result = r
            reasons += status.reasons
            rejector = rejector or plugin.name
        return result, Status.of(Code.UNSCHEDULABLE, *reasons).with_plugin(rejector)

    def RunPreScorePlugins(self, state: CycleState, pod: Obj, nodes: list[NodeInfo]) -> Status:
        for plugin in self.points["preScore"]:
            status = plugin.PreScore(state, pod, nodes)
            if status.is_skip():
                state.skip_score_plugins.add(plugin.name)
                continue
            if not status.is_success():
                return error(f"running PreScore plugin {plugin.name!r}: {status.message}")
        return SUCCESS

    def RunScorePlugins(
        self, state: CycleState, pod: Obj, nodes: list[NodeInfo]
    ) -> tuple[list[NodePluginScores], Status]:
        """Score every node with every plugin, NormalizeScore, then apply the weights."""
        plugins = [p for p in self.points["score"] if p.name not in state.skip_score_plugins]
        by_plugin: dict[str, list[NodeScore]] = {}
        for plugin in plugins:
            scores = []
            for node in nodes:
                score, status = plugin.Score(state, pod, node)
                if not status.is_success():
                    return [], error(f"plugin {plugin.name!r} failed with: {status.message}")
                scores.append(NodeScore(node.name, score))
            by_plugin[plugin.name] = scores
        for plugin in plugins:
            if isinstance(plugin, ScoreExtensions):
                status = plugin.NormalizeScore(state, pod, by_plugin[plugin.name])
                if not status.is_success():
                    return [], error(f"plugin {plugin.name!r} failed with: {status.message}")
        results = results_of(state)
        out = []
        for i, node in enumerate(nodes):
            total = NodePluginScores(node.name)
            for plugin in plugins:
                score = by_plugin[plugin.name][i].score
                if not MIN_NODE_SCORE <= score <= MAX_NODE_SCORE:
                    return [], error(
                        f"plugin {plugin.name!r} returns an invalid score {score}, it should "
                        f"in the range of [{MIN_NODE_SCORE}, {MAX_NODE_SCORE}] after normalizing"
                    )
                weighted = score * self.score_weights[plugin.name]
                total.scores[plugin.name] = weighted
                total.total_score += weighted
            results.score[node.name] = dict(total.scores)
            out.append(total)
        return out, SUCCESS

    def RunReservePluginsReserve(self, state: CycleState, pod: Obj, node: str) -> Status:
        results = results_of(state)
        for plugin in self.points["reserve"]:
            status = plugin.Reserve(state, pod, node)
            results.reserve[plugin.name] = _describe(status)
            if not status.is_success():
                if status.is_rejected():
                    return status.with_plugin(plugin.name)
                return error(f"running Reserve plugin {plugin.name!r}: {status.message}")
        return SUCCESS

    def RunReservePluginsUnreserve(self, state: CycleState, pod: Obj, node: str) -> None:
        """Unreserve in the reverse order of Reserve."""
        for plugin in reversed(self.points["reserve"]):
            plugin.Unreserve(state, pod, node)

    def RunPermitPlugins(
        self, state: CycleState, pod: Obj, node: str
    ) -> tuple[dict[str, float], Status]:
        """Success, a rejection, or Wait with each waiting plugin's timeout (at most 15 min)."""
        results = results_of(state)
        waits: dict[str, float] = {}
        for plugin in self.points["permit"]:
            status, timeout = plugin.Permit(state, pod, node)
            results.permit[plugin.name] = _describe(status) + (
                f" ({go_duration(timeout)})" if status.is_wait() else ""
            )
            if status.is_success():
                continue
            if status.is_rejected():
                return {}, status.with_plugin(plugin.name)
            if status.is_wait():
                waits[plugin.name] = min(timeout, MAX_PERMIT_TIMEOUT)
                continue
            return {}, error(
                f"running Permit plugin {plugin.name!r}: {status.message}"
            ).with_plugin(plugin.name)
        if waits:
            return waits, Status.of(
                Code.WAIT, "one or more plugins asked to wait and no plugin rejected pod"
            )
        return {}, SUCCESS

    def WillWaitOnPermit(self, pod: Obj) -> bool:
        return self.waiting_pods.get(pod_uid(pod)) is not None

    def AddWaitingPod(self, pod: Obj, waits: Mapping[str, float]) -> WaitingPod:
        wp = WaitingPod(pod, waits)
        self.waiting_pods.add(wp)
        return wp

    # ------------------------------------------------------------------ binding cycle

    def WaitOnPermit(self, pod: Obj) -> Status:
        """Block until a waiting pod is allowed or rejected (no-op if it is not waiting)."""
        wp = self.waiting_pods.get(pod_uid(pod))
        if wp is None:
            return SUCCESS
        try:
            status = wp.wait()
        finally:
            self.waiting_pods.remove(wp.uid)
        if status.is_success() or status.is_rejected():
            return status
        return error(f"waiting on permit for pod: {status.message}").with_plugin(status.plugin)

    def RunPreBindPlugins(self, state: CycleState, pod: Obj, node: str) -> Status:
        results = results_of(state)
        for plugin in self.points["preBind"]:
            status = plugin.PreBind(state, pod, node)
            results.pre_bind[plugin.name] = _describe(status)
            if status.is_skip():
                continue
            if not status.is_success():
                if status.is_rejected():
                    return status.with_plugin(plugin.name)
                return error(f"running PreBind plugin {plugin.name!r}: {status.message}")
        return SUCCESS

    def RunBindPlugins(self, state: CycleState, pod: Obj, node: str) -> Status:
        """The first Bind plugin that does not Skip binds the pod."""
        results = results_of(state)
        status = Status.of(Code.SKIP)
        for plugin in self.points["bind"]:
            status = plugin.Bind(state, pod, node)
            results.bind[plugin.name] = _describe(status)
            if status.is_skip():
                continue
            if not status.is_success():
                if status.is_rejected():
                    return status.with_plugin(plugin.name)
                return error(f"running Bind plugin {plugin.name!r}: {status.message}")
            return status
        return status

    def RunPostBindPlugins(self, state: CycleState, pod: Obj, node: str) -> None:
        for plugin in self.points["postBind"]:
            plugin.PostBind(state, pod, node)

    # ------------------------------------------------------------------ helpers

    def trace_start(self, step: str, message: str) -> None:
        """A start-up step of the scheduler process (a plugin's New, the informers' sync),
        as an Event on the scheduler's own pod where its manifest names it (POD_NAME)."""
        pod = own_pod()
        ref = ObjectRef("Pod", pod[1], pod[0]) if pod else None
        self.tracer.step(step, ref, message, profile=self.profile_name)

    def trace(
        self, step: str, pod: Obj, message: str, warning: bool = False, **detail: Any
    ) -> None:
        """One call-chain step about ``pod`` (an Event + a JSON line)."""
        self.tracer.step(
            step,
            ObjectRef.of({"kind": "Pod", **pod}),
            message,
            warning=warning,
            pod=pod_key(pod),
            **detail,
        )
