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
        (a pod waiting at Permit: status.nominatedNodeName = the node, the
        NominatedNodeNameForExpectation feature, beta and on since 1.35) ->
        WaitOnPermit -> RunPreBindPlugins -> RunBindPlugins -> Scheduled Event
        -> RunPostBindPlugins
      failures: Unreserve + ForgetPod, FailedScheduling Event, PodScheduled=False
        condition and nominatedNodeName cleared, back to the queue
        (handleSchedulingFailure; handleBindingCycleError sends the AssignedPodDelete
        event of a rejected pod only once it is back in the queue)

:class:`FitError` builds upstream's message exactly: "0/N nodes are available: <PreFilter
message>." or the sorted histogram of Filter reasons ("3 Insufficient nvidia.com/gpu,
1 node(s) had untolerated taint(s)."), then the PostFilter message.

The API sits behind :class:`SchedulerIO` (Events, the pod's status, the informer's copy
of a pod), so all of this runs against fakes in the unit tests.

Lab differences: nodes are filtered one after another, so the feasible nodes are scored
in evaluation order (upstream: in the order its parallel Filter finished them, which is
what the node-score heap breaks ties by); no extenders, preemption (DefaultPreemption),
opportunistic batching or pod-group (Workload API) cycles.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpulab.framework.cache import Cache
from gpulab.framework.events import EVENT_ASSIGNED_POD_DELETE
from gpulab.framework.interface import (
    CLEAR_NOMINATED_NODE,
    PODS_TO_ACTIVATE_KEY,
    Code,
    CycleState,
    NodePluginScores,
    NominatingInfo,
    NominatingMode,
    PodsToActivate,
    QueuedPodInfo,
    Status,
    error,
    nominating_mode,
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
        # a node nominated in an earlier cycle (status.nominatedNodeName) is tried first
        nominated = snapshot.get((pod.get("status") or {}).get("nominatedNodeName") or "")
        if nominated is not None:
            feasible = self._find_nodes_that_pass_filters(fwk, state, pod, diagnosis, [nominated])
            if feasible:
                return feasible, diagnosis
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
        percentage = fwk.profile.percentage_of_nodes_to_score
        if percentage is None:  # the profile's setting wins over the global one
            percentage = self.percentage_of_nodes_to_score
        wanted = num_feasible_nodes_to_find(len(nodes), percentage)
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
        """The head of upstream's node-score heap (container/heap Init, then Pop): the
        highest total; among equal totals, whichever the heap's sift-down leaves on top
        (upstream randomises ties only when an extender scores, which the lab has not)."""
        heap = list(scores)
        n = len(heap)
        for i in range(n // 2 - 1, -1, -1):
            while (left := 2 * i + 1) < n:
                j = left
                if left + 1 < n and heap[left + 1].total_score > heap[left].total_score:
                    j = left + 1
                if not heap[j].total_score > heap[i].total_score:
                    break
                heap[i], heap[j] = heap[j], heap[i]
                i = j
        return heap[0].name

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

    def patch_pod_status(
        self, pod: Obj, condition: Mapping[str, str] | None, nominated_node_name: str | None
    ) -> None:
        """Patch the pod's status subresource: the condition if given, and
        ``nominatedNodeName`` if not None ("" removes it)."""
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


@dataclass
class Failure:
    """Why an attempt failed: the status, the FitError behind a rejection (its plugins
    steer the queue), and what to do with the pod's nominatedNodeName."""

    status: Status
    fit_error: FitError | None = None
    nominating_info: NominatingInfo | None = CLEAR_NOMINATED_NODE


def _fit_failure(
    fit: FitError, nominating: NominatingInfo | None = CLEAR_NOMINATED_NODE
) -> Failure:
    return Failure(Status.of(Code.UNSCHEDULABLE, fit.message()), fit, nominating)


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
        try:
            host, failure = self.scheduling_cycle(fwk, state, qpi, pods_to_activate)
        except Exception as exc:  # a plugin bug: the pod goes back with backoff
            _log.exception("scheduling %s failed", pod_key(pod))
            host, failure = "", Failure(error(f"scheduling cycle failed: {exc}"))
        if failure is not None:
            self.handle_scheduling_failure(fwk, qpi, failure)
            return True
        t = threading.Thread(
            target=self._run_binding_cycle,
            args=(fwk, state, qpi, host),
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
    ) -> tuple[str, Failure | None]:
        """schedulingCycle: a host for the pod, assumed, reserved and permitted (or
        waiting); otherwise why not."""
        pod = qpi.pod
        snapshot = self.cache.UpdateSnapshot()
        fwk.set_snapshot(snapshot)
        try:
            result = self.algorithm.schedule_pod(fwk, state, pod, snapshot)
        except NoNodesAvailable as exc:
            return "", Failure(unresolvable(str(exc)))
        except _StatusError as exc:
            self._trace_filter(fwk, state, pod, snapshot, None)
            return "", Failure(exc.status)
        except FitError as fit:
            self._trace_filter(fwk, state, pod, snapshot, None)
            if not fwk.HasPostFilterPlugins():
                return "", _fit_failure(fit)
            pf_result, pf = fwk.RunPostFilterPlugins(state, pod, fit.diagnosis.node_to_status)
            fit.diagnosis.post_filter_msg = pf.message
            fwk.trace(
                "PostFilter",
                pod,
                _plugin_line(results_of(state).post_filter),
                warning=True,
                results=results_of(state).post_filter,
            )
            return "", _fit_failure(fit, pf_result.nominating_info if pf_result else None)
        self._trace_filter(fwk, state, pod, snapshot, result)
        assumed = _with_node(pod, result.suggested_host)
        try:
            self.cache.AssumePod(assumed)
        except ValueError as exc:
            return "", Failure(error(str(exc)))
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
                return "", _fit_failure(single_node_fit_error(pod, result.suggested_host, status))
            return "", Failure(status)
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
                return "", _fit_failure(single_node_fit_error(pod, result.suggested_host, status))
            return "", Failure(status)
        if pods_to_activate.pods:
            with pods_to_activate.lock:
                pods = dict(pods_to_activate.pods)
                pods_to_activate.pods.clear()
            self.queue.Activate(pods)
        return result.suggested_host, None

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
        line = filter_line(feasible, len(snapshot), rejected)
        fwk.trace("Filter", pod, line, warning=not feasible, results=results.filter)
        if result is not None and results.score:
            for node, note in sorted(results.score_notes):
                fwk.trace("Score", pod, note, node=node)
            line = score_line(result.suggested_host, results.score)
            fwk.trace("Score", pod, line, results=results.score)

    # ------------------------------------------------------------------ binding cycle

    def _run_binding_cycle(
        self, fwk: Framework, state: CycleState, qpi: QueuedPodInfo, host: str
    ) -> None:
        try:
            self.binding_cycle(fwk, state, qpi, host)
        except Exception as exc:
            _log.exception("binding %s failed", pod_key(qpi.pod))
            failure = Failure(error(f"binding cycle failed: {exc}"))
            self._handle_binding_cycle_error(fwk, state, qpi, host, failure)

    def binding_cycle(
        self, fwk: Framework, state: CycleState, qpi: QueuedPodInfo, host: str
    ) -> None:
        """bindingCycle, in its own thread: (nominatedNodeName) -> WaitOnPermit ->
        PreBind -> Bind -> PostBind."""
        assumed = _with_node(qpi.pod, host)
        waiting = fwk.WillWaitOnPermit(assumed)
        if waiting:
            # NominatedNodeNameForExpectation: tell the world (the cluster autoscaler,
            # kubectl get pod -o wide) where the waiting pod is about to be bound
            try:
                self._update_pod(assumed, None, NominatingInfo(host))
            except Exception as exc:  # not critical: binding goes on
                _log.warning("could not set the nominated node of %s: %s", pod_key(assumed), exc)
        status = fwk.WaitOnPermit(assumed)
        if waiting:
            fwk.trace(
                "WaitOnPermit",
                qpi.pod,
                "allowed" if status.is_success() else f"{status.plugin}: {status.message}",
                warning=not status.is_success(),
            )
        if not status.is_success():
            failure = Failure(status)
            if status.is_rejected():
                failure = _fit_failure(single_node_fit_error(qpi.pod, host, status))
            self._handle_binding_cycle_error(fwk, state, qpi, host, failure)
            return
        self.queue.Done(qpi.uid)
        status = fwk.RunPreBindPlugins(state, assumed, host)
        if results_of(state).pre_bind:
            fwk.trace("PreBind", qpi.pod, _plugin_line(results_of(state).pre_bind))
        if status.is_success():
            status = fwk.RunBindPlugins(state, assumed, host)
        if not status.is_success():
            fwk.trace("Bind", qpi.pod, f"failed: {status.message}", warning=True)
            self._handle_binding_cycle_error(fwk, state, qpi, host, Failure(status))
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
        self, fwk: Framework, state: CycleState, qpi: QueuedPodInfo, host: str, failure: Failure
    ) -> None:
        """handleBindingCycleError: unreserve and forget the pod - a freed assumed pod is
        an AssignedPodDelete event for the others. For a rejected pod that event is sent
        only after the pod is back in the queue, and not for the pod itself: otherwise the
        pod would see it as an in-flight event and go to backoffQ whatever its rejecting
        plugin registered."""
        assumed = _with_node(qpi.pod, host)
        self._unreserve_and_forget(fwk, state, assumed, host)
        failure.nominating_info = CLEAR_NOMINATED_NODE
        if not failure.status.is_rejected():
            self.queue.MoveAllToActiveOrBackoffQueue(EVENT_ASSIGNED_POD_DELETE, assumed, None)
            self.handle_scheduling_failure(fwk, qpi, failure)
            return
        self.handle_scheduling_failure(fwk, qpi, failure)
        uid = qpi.uid
        self.queue.MoveAllToActiveOrBackoffQueue(
            EVENT_ASSIGNED_POD_DELETE, assumed, None, pre_check=lambda p: pod_uid(p) != uid
        )

    # ------------------------------------------------------------------ failures

    def handle_scheduling_failure(
        self, fwk: Framework, qpi: QueuedPodInfo, failure: Failure
    ) -> None:
        """handleSchedulingFailure: back to the queue (the FitError's plugins decide
        which events can bring it back), a FailedScheduling Event, the PodScheduled=False
        condition and the nominatedNodeName the failure asks for."""
        status = failure.status
        qpi.unschedulable_plugins, qpi.pending_plugins = set(), set()
        if failure.fit_error is not None:
            qpi.unschedulable_plugins = set(failure.fit_error.diagnosis.unschedulable_plugins)
            qpi.pending_plugins = set(failure.fit_error.diagnosis.pending_plugins)
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
            self.queue.AddUnschedulableIfNotPresent(qpi)
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
        if current is not None:
            try:
                self._update_pod(current, condition, failure.nominating_info)
            except Exception as exc:  # the API may be away; the next attempt retries
                _log.warning("could not update the status of %s: %s", pod_key(pod), exc)

    def _update_pod(
        self, pod: Obj, condition: Mapping[str, str] | None, nominating: NominatingInfo | None
    ) -> None:
        """updatePod: patch what changed - the condition, and nominatedNodeName when the
        nominating info overrides it with another value."""
        current_nnn = (pod.get("status") or {}).get("nominatedNodeName") or ""
        nnn = None
        if (
            nominating is not None
            and nominating_mode(nominating) is NominatingMode.OVERRIDE
            and current_nnn != nominating.nominated_node_name
        ):
            nnn = nominating.nominated_node_name
        if condition is not None and not pod_condition_needs_update(pod, condition):
            condition = None
        if condition is None and nnn is None:
            return
        self.io.patch_pod_status(pod, condition, nnn)


def filter_line(feasible: list[str], total: int, rejected: dict[str, str]) -> str:
    """The Filter step's note: the nodes that fit, then each reason once with the nodes it
    rejected (kube-scheduler's FitError counts nodes per reason the same way; naming them
    one by one repeated the same reason for every node of a kind)."""
    line = f"{len(feasible)}/{total} nodes fit"
    if feasible:
        line += f" ({', '.join(feasible)})"
    nodes_by_reason: dict[str, list[str]] = {}
    for node, why in rejected.items():
        nodes_by_reason.setdefault(why, []).append(node)
    for why, nodes in nodes_by_reason.items():
        who = nodes[0] if len(nodes) == 1 else f"{len(nodes)} nodes ({', '.join(nodes)})"
        line += f"; {who}: {why}"
    return line


def score_line(host: str, scores: Mapping[str, Mapping[str, int]]) -> str:
    """The Score step: every node's total, and the plugins whose (weighted) scores differ
    between the winner and the runner-up - what decided.

    "gpu-t4-1 wins: gpu-t4-1=478, gpu-t4-0=473; against gpu-t4-0:
    NodeResourcesBalancedAllocation 78 vs 72, NodeResourcesFit 66 vs 67"

    Equal top totals are a tie, said first (a cut line still shows it), and how it was
    broken: selectHost takes the head of its score heap; without an extender's scores the
    heap has no random tie-breaker, so the order kube-scheduler's parallel Filter found
    the nodes decides - it may take another of the tied nodes than the lab.
    """
    totals = {n: sum(s.values()) for n, s in scores.items()}
    ranked = sorted(scores, key=lambda n: (n != host, -totals[n]))
    tied = [n for n in ranked[1:] if totals[n] == totals[host]]
    line = f"a tie at {totals[host]}; " if tied else ""
    line += f"{host} wins: " + ", ".join(f"{n}={totals[n]}" for n in ranked)
    if len(ranked) > 1:
        runner = ranked[1]
        diffs = [
            f"{plugin} {score} vs {scores[runner].get(plugin, 0)}"
            for plugin, score in scores[host].items()
            if score != scores[runner].get(plugin, 0)
        ]
        line += f"; against {runner}: " + (", ".join(diffs) or "the same per plugin")
    if tied:
        line += (
            f" (the tie is broken by the score heap's order: {host} is its head here; "
            "kube-scheduler's heap has no random tie-breaker without an extender, so the "
            f"order its parallel Filter found the nodes decides: it may take {' or '.join(tied)})"
        )
    return line


def _with_node(pod: Obj, node: str) -> dict[str, Any]:
    """The assumed pod: a copy with ``spec.nodeName`` set."""
    return {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node}}


def _plugin_line(results: Mapping[str, str]) -> str:
    return "; ".join(f"{plugin}: {result}" for plugin, result in results.items())
