"""scheduleOne: one pod through the scheduling cycle, then its binding cycle apart.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/schedule_one.go``:

    ScheduleOne -> NextPod (queue Pop) -> frameworkForPod -> skipPodSchedule
      schedulingCycle (synchronous, one pod at a time):
        UpdateSnapshot -> schedulePod:
          findNodesThatFitPod: RunPreFilterPlugins -> RunFilterPlugins per node
          prioritizeNodes: RunPreScorePlugins -> RunScorePlugins (+ NormalizeScore, weights)
          selectHost
        (no node fits: RunPostFilterPlugins, FitError "0/N nodes are available: ...")
        assume (cache.AssumePod) -> RunReservePluginsReserve -> RunPermitPlugins
          (Wait: AddWaitingPod)
      bindingCycle (its own thread, like upstream's goroutine):
        WaitOnPermit -> RunPreBindPlugins -> RunBindPlugins -> Scheduled Event
        -> RunPostBindPlugins
      failures: Unreserve + ForgetPod, FailedScheduling Event, PodScheduled=False
        condition, back to the queue (handleSchedulingFailure)

:class:`FitError` builds upstream's message exactly: "0/N nodes are available: <PreFilter
message>." or the sorted histogram of Filter reasons ("3 Insufficient nvidia.com/gpu,
1 node(s) had untolerated taint(s)."), then the PostFilter message.

The API sits behind :class:`SchedulerIO` (Events, the pod's condition, the informer's
copy of a pod), so all of this runs against fakes in the unit tests.

Lab differences: nodes are filtered one after another; no extenders, nominated nodes,
preemption (DefaultPreemption) or pod-group (Workload API) cycles; ties between the best
nodes go to the first one evaluated (upstream breaks ties through a heap order).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpulab.framework.cache import Cache
from gpulab.framework.interface import (
    EVENT_ASSIGNED_POD_DELETE,
    PODS_TO_ACTIVATE_KEY,
    Code,
    CycleState,
    NodePluginScores,
    PodsToActivate,
    QueuedPodInfo,
    Status,
    error,
    unresolvable,
)
from gpulab.framework.queue import SchedulingQueue
from gpulab.framework.runtime import Framework, results_of
from gpulab.framework.snapshot import NodeInfo, PodInfo, Snapshot, pod_key, pod_uid

_log = logging.getLogger(__name__)

Obj = Mapping[str, Any]

NO_NODE_AVAILABLE_MSG = "0/{} nodes are available"
ERR_NO_NODES_AVAILABLE = "no nodes available to schedule pods"
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5
NOTE_LENGTH_LIMIT = 1024  # validation.NoteLengthLimit


@dataclass
class Diagnosis:
    """Why nodes were rejected: status per node, plus a status for nodes not listed."""

    node_to_status: dict[str, Status] = field(default_factory=dict)
    absent_nodes_status: Status = field(
        default_factory=lambda: Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE)
    )
    unschedulable_plugins: set[str] = field(default_factory=set)
    pending_plugins: set[str] = field(default_factory=set)
    pre_filter_msg: str = ""
    post_filter_msg: str = ""

    def add_plugin_status(self, status: Status) -> None:
        if not status.plugin:
            return
        if status.code == Code.PENDING:
            self.pending_plugins.add(status.plugin)
        elif status.is_rejected():
            self.unschedulable_plugins.add(status.plugin)


@dataclass
class FitError(Exception):
    """No node fits the pod (framework.FitError)."""

    pod: Obj
    num_all_nodes: int
    diagnosis: Diagnosis

    def __str__(self) -> str:
        return self.message()

    def message(self) -> str:
        msg = NO_NODE_AVAILABLE_MSG.format(self.num_all_nodes) + ":"
        d = self.diagnosis
        if d.pre_filter_msg:
            msg += f" {d.pre_filter_msg}."
        else:
            reasons: Counter[str] = Counter()
            for status in d.node_to_status.values():
                reasons.update(status.reasons)
            absent = self.num_all_nodes - len(d.node_to_status)
            if absent > 0:
                for reason in d.absent_nodes_status.reasons:
                    reasons[reason] += absent
            histogram = sorted(f"{n} {reason}" for reason, n in reasons.items())
            if histogram:
                msg += f" {', '.join(histogram)}."
        if d.post_filter_msg:
            msg += f" {d.post_filter_msg}"
        return msg


def single_node_fit_error(pod: Obj, node: str, status: Status) -> FitError:
    """What a rejection at Reserve or Permit looks like: one node, its status."""
    diagnosis = Diagnosis(node_to_status={node: status})
    diagnosis.add_plugin_status(status)
    return FitError(pod, 1, diagnosis)


@dataclass(frozen=True)
class ScheduleResult:
    suggested_host: str
    evaluated_nodes: int
    feasible_nodes: int


class NoNodesAvailable(Exception):
    pass


def num_feasible_nodes_to_find(num_all: int, percentage: int | None) -> int:
    """How many feasible nodes are enough before scoring (all, below 100 nodes)."""
    if num_all < MIN_FEASIBLE_NODES_TO_FIND:
        return num_all
    pct = percentage or 0
    if pct == 0:
        pct = max(50 - num_all // 125, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    return max(num_all * pct // 100, MIN_FEASIBLE_NODES_TO_FIND)


# -- the scheduling algorithm (pure given a Framework and a Snapshot) -----------------------


@dataclass
class Algorithm:
    """findNodesThatFitPod / prioritizeNodes / selectHost over one snapshot."""

    percentage_of_nodes_to_score: int | None = None
    next_start_node_index: int = 0

    def find_nodes_that_fit_pod(
        self, fwk: Framework, state: CycleState, pod: Obj, snapshot: Snapshot
    ) -> tuple[list[NodeInfo], Diagnosis]:
        diagnosis = Diagnosis()
        all_nodes = snapshot.list()
        pre_result, status, with_nodes = fwk.RunPreFilterPlugins(state, pod)
        diagnosis.unschedulable_plugins |= with_nodes
        if not status.is_success():
            if not status.is_rejected():
                raise _StatusError(status)
            diagnosis.absent_nodes_status = status
            diagnosis.pre_filter_msg = status.message
            diagnosis.add_plugin_status(status)
            return [], diagnosis
        nodes = all_nodes
        if pre_result is not None and not pre_result.all_nodes():
            wanted = pre_result.node_names or frozenset()
            nodes = [n for n in all_nodes if n.name in wanted]
            diagnosis.absent_nodes_status = unresolvable(
                f"node(s) didn't satisfy plugin(s) {sorted(with_nodes)}"
            )
        feasible = self._find_nodes_that_pass_filters(fwk, state, pod, diagnosis, nodes)
        if all_nodes:
            processed = len(feasible) + len(diagnosis.node_to_status)
            self.next_start_node_index = (self.next_start_node_index + processed) % len(all_nodes)
        return feasible, diagnosis

    def _find_nodes_that_pass_filters(
        self,
        fwk: Framework,
        state: CycleState,
        pod: Obj,
        diagnosis: Diagnosis,
        nodes: list[NodeInfo],
    ) -> list[NodeInfo]:
        if not nodes:
            return []
        wanted = num_feasible_nodes_to_find(len(nodes), self.percentage_of_nodes_to_score)
        if not fwk.HasScorePlugins():
            wanted = 1
        start = self.next_start_node_index % len(nodes)
        ordered = nodes[start:] + nodes[:start]
        if not fwk.HasFilterPlugins():
            return ordered[:wanted]
        feasible: list[NodeInfo] = []
        for node in ordered:
            status = fwk.RunFilterPlugins(state, pod, node)
            if status.code == Code.ERROR:
                raise _StatusError(status)
            if status.is_success():
                feasible.append(node)
                if len(feasible) >= wanted:
                    break
            else:
                diagnosis.node_to_status[node.name] = status
                diagnosis.add_plugin_status(status)
        return feasible

    @staticmethod
    def prioritize_nodes(
        fwk: Framework, state: CycleState, pod: Obj, nodes: list[NodeInfo]
    ) -> list[NodePluginScores]:
        if not fwk.HasScorePlugins():
            return [NodePluginScores(n.name, total_score=1) for n in nodes]
        status = fwk.RunPreScorePlugins(state, pod, nodes)
        if not status.is_success():
            raise _StatusError(status)
        scores, status = fwk.RunScorePlugins(state, pod, nodes)
        if not status.is_success():
            raise _StatusError(status)
        return scores

    @staticmethod
    def select_host(scores: list[NodePluginScores]) -> str:
        """The highest total; on a tie the first evaluated."""
        best = scores[0]
        for s in scores[1:]:
            if s.total_score > best.total_score:
                best = s
        return best.name

    def schedule_pod(
        self, fwk: Framework, state: CycleState, pod: Obj, snapshot: Snapshot
    ) -> ScheduleResult:
        """schedulePod: a node for ``pod``, or FitError / NoNodesAvailable."""
        if len(snapshot) == 0:
            raise NoNodesAvailable(ERR_NO_NODES_AVAILABLE)
        feasible, diagnosis = self.find_nodes_that_fit_pod(fwk, state, pod, snapshot)
        if not feasible:
            raise FitError(pod, len(snapshot), diagnosis)
        evaluated = len(feasible) + len(diagnosis.node_to_status)
        if len(feasible) == 1:
            return ScheduleResult(feasible[0].name, evaluated, 1)
        scores = self.prioritize_nodes(fwk, state, pod, feasible)
        return ScheduleResult(self.select_host(scores), evaluated, len(feasible))


class _StatusError(Exception):
    def __init__(self, status: Status) -> None:
        super().__init__(status.message)
        self.status = status


# -- the scheduler around it ----------------------------------------------------------------


class SchedulerIO(Protocol):
    """What the scheduler needs from the API server."""

    def current_pod(self, pod: Obj) -> Obj | None:
        """The informer's copy of ``pod`` (None if it is gone)."""
        ...

    def record_event(
        self, fwk: Framework, pod: Obj, reason: str, action: str, note: str, warning: bool
    ) -> None:
        """An Event as the profile's recorder writes it (reportingController = the
        scheduler name)."""
        ...

    def update_pod_condition(self, pod: Obj, condition: Mapping[str, str]) -> None:
        """Patch the pod's PodScheduled condition (status subresource)."""
        ...


POD_SCHEDULED = "PodScheduled"
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_SCHEDULER_ERROR = "SchedulerError"


def pod_condition_needs_update(pod: Obj, condition: Mapping[str, str]) -> bool:
    """podutil.UpdatePodCondition: only a change of status, reason or message counts."""
    for existing in (pod.get("status") or {}).get("conditions") or []:
        if existing.get("type") == condition["type"]:
            return any(existing.get(k) != condition[k] for k in ("status", "reason", "message"))
    return True


class Scheduler:
    """The profiles' frameworks, the queue and the cache, and the loop that drives them."""

    def __init__(
        self,
        profiles: Mapping[str, Framework],
        queue: SchedulingQueue,
        cache: Cache,
        io: SchedulerIO,
        percentage_of_nodes_to_score: int | None = None,
    ) -> None:
        self.profiles = dict(profiles)
        self.queue = queue
        self.cache = cache
        self.io = io
        self.algorithm = Algorithm(percentage_of_nodes_to_score)
        self.binding_threads: list[threading.Thread] = []

    def framework_for_pod(self, pod: Obj) -> Framework | None:
        return self.profiles.get((pod.get("spec") or {}).get("schedulerName") or "")

    def ScheduleOne(self, timeout: float | None = None) -> bool:
        """Take the next pod and run its scheduling cycle; False if the queue gave none."""
        qpi = self.queue.Pop(timeout)
        if qpi is None:
            return False
        pod = qpi.pod
        fwk = self.framework_for_pod(pod)
        if fwk is None:
            _log.error("no profile for scheduler name of pod %s", pod_key(pod))
            self.queue.Done(qpi.uid)
            return True
        if self._skip_pod_schedule(fwk, pod):
            self.queue.Done(qpi.uid)
            return True
        state = CycleState()
        pods_to_activate = PodsToActivate()
        state.write(PODS_TO_ACTIVATE_KEY, pods_to_activate)
        cycle = self.queue.SchedulingCycle()
        try:
            host, status = self.scheduling_cycle(fwk, state, qpi, pods_to_activate)
        except Exception as exc:  # a plugin bug: the pod goes back with backoff
            _log.exception("scheduling %s failed", pod_key(pod))
            host, status = "", error(f"scheduling cycle failed: {exc}")
        if not status.is_success():
            self.handle_scheduling_failure(fwk, qpi, status, cycle)
            return True
        t = threading.Thread(
            target=self._run_binding_cycle,
            args=(fwk, state, qpi, host, cycle),
            name=f"bind-{pod_key(pod)}",
            daemon=True,
        )
        self.binding_threads = [b for b in self.binding_threads if b.is_alive()] + [t]
        t.start()
        return True

    def _skip_pod_schedule(self, fwk: Framework, pod: Obj) -> bool:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            self.io.record_event(
                fwk,
                pod,
                "FailedScheduling",
                "Scheduling",
                f"skip schedule deleting pod: {meta.get('namespace')}/{meta.get('name')}",
                True,
            )
            return True
        return self.cache.IsAssumedPod(pod)

    # ------------------------------------------------------------------ scheduling cycle

    def scheduling_cycle(
        self,
        fwk: Framework,
        state: CycleState,
        qpi: QueuedPodInfo,
        pods_to_activate: PodsToActivate,
    ) -> tuple[str, Status]:
        """schedulingCycle: a host for the pod, assumed, reserved and permitted (or
        waiting); otherwise the failure status (a FitError travels as its message and
        in ``qpi``'s rejector plugins)."""
        pod = qpi.pod
        snapshot = self.cache.UpdateSnapshot()
        fwk.set_snapshot(snapshot)
        try:
            result = self.algorithm.schedule_pod(fwk, state, pod, snapshot)
        except NoNodesAvailable as exc:
            return "", unresolvable(str(exc))
        except _StatusError as exc:
            self._trace_filter(fwk, state, pod, snapshot, None)
            return "", exc.status
        except FitError as fit:
            self._trace_filter(fwk, state, pod, snapshot, None)
            if fwk.HasPostFilterPlugins():
                _, pf = fwk.RunPostFilterPlugins(state, pod, fit.diagnosis.node_to_status)
                fit.diagnosis.post_filter_msg = pf.message
                fwk.trace(
                    "PostFilter",
                    pod,
                    _plugin_line(results_of(state).post_filter),
                    warning=True,
                    results=results_of(state).post_filter,
                )
            return "", self._fit_status(qpi, fit)
        self._trace_filter(fwk, state, pod, snapshot, result)
        assumed = _with_node(pod, result.suggested_host)
        try:
            self.cache.AssumePod(assumed)
        except ValueError as exc:
            return "", error(str(exc))
        status = fwk.RunReservePluginsReserve(state, assumed, result.suggested_host)
        fwk.trace(
            "Reserve",
            pod,
            f"assumed on {result.suggested_host}"
            + (f"; {_plugin_line(results_of(state).reserve)}" if results_of(state).reserve else ""),
            node=result.suggested_host,
        )
        if not status.is_success():
            self._unreserve_and_forget(fwk, state, assumed, result.suggested_host)
            if status.is_rejected():
                fit = single_node_fit_error(pod, result.suggested_host, status)
                return "", self._fit_status(qpi, fit)
            return "", status
        waits, status = fwk.RunPermitPlugins(state, assumed, result.suggested_host)
        permits = results_of(state).permit
        if permits:
            fwk.trace(
                "Permit", pod, _plugin_line(permits), warning=status.is_rejected(), results=permits
            )
        if status.is_wait():
            fwk.AddWaitingPod(assumed, waits)
        elif not status.is_success():
            self._unreserve_and_forget(fwk, state, assumed, result.suggested_host)
            if status.is_rejected():
                fit = single_node_fit_error(pod, result.suggested_host, status)
                return "", self._fit_status(qpi, fit)
            return "", status
        if pods_to_activate.pods:
            with pods_to_activate.lock:
                pods = dict(pods_to_activate.pods)
                pods_to_activate.pods.clear()
            self.queue.Activate(pods)
        return result.suggested_host, Status()

    def _fit_status(self, qpi: QueuedPodInfo, fit: FitError) -> Status:
        qpi.unschedulable_plugins = set(fit.diagnosis.unschedulable_plugins)
        qpi.pending_plugins = set(fit.diagnosis.pending_plugins)
        return Status.of(Code.UNSCHEDULABLE, fit.message())

    def _unreserve_and_forget(self, fwk: Framework, state: CycleState, pod: Obj, node: str) -> None:
        fwk.RunReservePluginsUnreserve(state, pod, node)
        self.cache.ForgetPod(pod)

    def _trace_filter(
        self,
        fwk: Framework,
        state: CycleState,
        pod: Obj,
        snapshot: Snapshot,
        result: ScheduleResult | None,
    ) -> None:
        results = results_of(state)
        if results.pre_filter:
            fwk.trace(
                "PreFilter", pod, _plugin_line(results.pre_filter), results=results.pre_filter
            )
        if not results.filter:
            return
        feasible = [n for n, r in results.filter.items() if all(v == "passed" for v in r.values())]
        rejected = {
            n: next(f"{p}: {v}" for p, v in r.items() if v != "passed")
            for n, r in results.filter.items()
            if n not in feasible
        }
        line = f"{len(feasible)}/{len(snapshot)} nodes fit"
        if feasible:
            line += f" ({', '.join(feasible)})"
        if rejected:
            line += "; " + "; ".join(f"{n}: {why}" for n, why in rejected.items())
        fwk.trace("Filter", pod, line, warning=not feasible, results=results.filter)
        if result is not None and results.score:
            ranked = sorted(results.score.items(), key=lambda kv: -sum(kv[1].values()))
            fwk.trace(
                "Score",
                pod,
                f"{result.suggested_host} wins: "
                + ", ".join(f"{n}={sum(s.values())}" for n, s in ranked),
                results=results.score,
            )

    # ------------------------------------------------------------------ binding cycle

    def _run_binding_cycle(
        self, fwk: Framework, state: CycleState, qpi: QueuedPodInfo, host: str, cycle: int
    ) -> None:
        try:
            self.binding_cycle(fwk, state, qpi, host, cycle)
        except Exception as exc:
            _log.exception("binding %s failed", pod_key(qpi.pod))
            status = error(f"binding cycle failed: {exc}")
            self._handle_binding_cycle_error(fwk, state, qpi, host, status, cycle)

    def binding_cycle(
        self, fwk: Framework, state: CycleState, qpi: QueuedPodInfo, host: str, cycle: int
    ) -> None:
        """bindingCycle, in its own thread: WaitOnPermit -> PreBind -> Bind -> PostBind."""
        assumed = _with_node(qpi.pod, host)
        waiting = fwk.GetWaitingPod(pod_uid(assumed)) is not None
        status = fwk.WaitOnPermit(assumed)
        if waiting:
            fwk.trace(
                "WaitOnPermit",
                qpi.pod,
                "allowed" if status.is_success() else f"{status.plugin}: {status.message}",
                warning=not status.is_success(),
            )
        if not status.is_success():
            if status.is_rejected():
                status = self._fit_status(qpi, single_node_fit_error(qpi.pod, host, status))
            self._handle_binding_cycle_error(fwk, state, qpi, host, status, cycle)
            return
        self.queue.Done(qpi.uid)
        status = fwk.RunPreBindPlugins(state, assumed, host)
        if results_of(state).pre_bind:
            fwk.trace("PreBind", qpi.pod, _plugin_line(results_of(state).pre_bind))
        if status.is_success():
            status = fwk.RunBindPlugins(state, assumed, host)
        if not status.is_success():
            fwk.trace("Bind", qpi.pod, f"failed: {status.message}", warning=True)
            self._handle_binding_cycle_error(fwk, state, qpi, host, status, cycle)
            return
        fwk.trace("Bind", qpi.pod, f"{_plugin_line(results_of(state).bind)} -> {host}", node=host)
        meta = qpi.pod.get("metadata") or {}
        self.io.record_event(
            fwk,
            qpi.pod,
            "Scheduled",
            "Binding",
            f"Successfully assigned {meta.get('namespace')}/{meta.get('name')} to {host}",
            False,
        )
        fwk.RunPostBindPlugins(state, assumed, host)
        pods_to_activate: PodsToActivate = state.get(PODS_TO_ACTIVATE_KEY)
        if pods_to_activate and pods_to_activate.pods:
            self.queue.Activate(dict(pods_to_activate.pods))

    def _handle_binding_cycle_error(
        self,
        fwk: Framework,
        state: CycleState,
        qpi: QueuedPodInfo,
        host: str,
        status: Status,
        cycle: int,
    ) -> None:
        """Unreserve and forget the pod; the freed resources may help the others."""
        assumed = _with_node(qpi.pod, host)
        self._unreserve_and_forget(fwk, state, assumed, host)
        uid = pod_uid(qpi.pod)
        self.queue.MoveAllToActiveOrBackoffQueue(
            EVENT_ASSIGNED_POD_DELETE, pre_check=lambda p: pod_uid(p) != uid
        )
        self.handle_scheduling_failure(fwk, qpi, status, cycle)

    # ------------------------------------------------------------------ failures

    def handle_scheduling_failure(
        self, fwk: Framework, qpi: QueuedPodInfo, status: Status, cycle: int
    ) -> None:
        """handleSchedulingFailure: back to the queue, a FailedScheduling Event and the
        PodScheduled=False condition."""
        if not status.is_rejected():
            qpi.unschedulable_plugins = set()
            qpi.pending_plugins = set()
        reason = REASON_UNSCHEDULABLE if status.is_rejected() else REASON_SCHEDULER_ERROR
        current = self.io.current_pod(qpi.pod)
        pod = qpi.pod
        if current is None:
            self.queue.Done(qpi.uid)
        elif (current.get("spec") or {}).get("nodeName"):
            self.queue.Done(qpi.uid)  # bound meanwhile (by us, or someone else)
        elif pod_uid(current) != qpi.uid:
            self.queue.Done(qpi.uid)  # recreated under the same name
            return
        else:
            qpi.pod_info = PodInfo.of(current)
            pod = current
            self.queue.AddUnschedulableIfNotPresent(qpi, cycle)
        message = status.message
        if len(message) > NOTE_LENGTH_LIMIT:
            message = message[: NOTE_LENGTH_LIMIT - 4] + " ..."
        self.io.record_event(fwk, pod, "FailedScheduling", "Scheduling", message, True)
        condition = {
            "type": POD_SCHEDULED,
            "status": "False",
            "reason": reason,
            "message": status.message,
        }
        if current is not None and pod_condition_needs_update(current, condition):
            try:
                self.io.update_pod_condition(current, condition)
            except Exception as exc:  # the API may be away; the next attempt retries
                _log.warning("could not update the condition of %s: %s", pod_key(pod), exc)


def _with_node(pod: Obj, node: str) -> dict[str, Any]:
    """The assumed pod: a copy with ``spec.nodeName`` set."""
    return {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node}}


def _plugin_line(results: Mapping[str, str]) -> str:
    return "; ".join(f"{plugin}: {result}" for plugin, result in results.items())
