"""Causal order for the live call-chain trace (the demos' LiveTrace).

Events reach a reader in the order their watches deliver them, not in the order they
happened: each component posts its Events from a background thread (gpulab.trace.Tracer),
kube-scheduler's and the Job controller's broadcasters post theirs when they get to it,
and Pod phases come through a watch of their own. Printed on arrival, a pod's Running
precedes its Bind and timestamps go backwards. The Narrator holds each line for a short
window and then lets it out sorted:

- by the Event's own time (microseconds for events.k8s.io ``eventTime``, whole seconds
  for core/v1 ``lastTimestamp``);
- a step of one object close in time to steps of its call chain that it caused (``CHAINS``)
  is put back before them: whole-second times cannot order two steps of the same second,
  and a component may record a step just after the step it caused (kube-scheduler's
  ``Scheduled`` after the pod was seen Running). Close is within ``WINDOW`` for precise
  times, within the whole second otherwise; a step that starts a round (a retry, a
  restart: ``ROUND_STARTS``) is never moved, so a plugin restarted within a second is told
  as two rounds, not one merged chain.

A line that arrives after a later line was already printed is told as late, not slipped in
silently. Pure: the caller passes the clock and prints what it gets back.

Known limit: a second attempt's steps after its PreFilter may still be moved before the
first attempt's late steps if all are within ``WINDOW``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulab.trace import TraceEvent

# Seconds a line waits for earlier ones still in flight. Components post their Events
# within tens of milliseconds; a busy 2-core laptop running a whole cluster stretches that
# to about a second. Longer and the narration stops feeling live.
HOLD = 1.2

# Each kind's call chain in upstream order, the step names the lab's components and
# upstream's (kube-scheduler, kubelet, the Job controller) write. Steps missing here keep
# the place their time gives them.
CHAINS: dict[str, tuple[str, ...]] = {
    "Pod": (
        "Webhook",  # HAMi's /webhook admits the pod before it exists
        "Pod Pending",
        "startJob",  # Kueue ungates a pod it admitted
        "PreFilter",
        "Filter",
        "FilteringFailed",  # HAMi's reasons follow the lab's Filter step they report
        "FilteringSucceed",
        "PostFilter",
        "FailedScheduling",
        "Score",
        "Reserve",
        "Permit",
        "WaitOnPermit",
        "PreBind",
        "LockNode",
        "Bind",
        "Binding",
        "BindingFailed",
        "BindingSucceed",
        "Scheduled",
        "Allocate",
        "ReleaseNodeLock",
        "Pulled",
        "Created",
        "Started",
        "Pod Running",
        "Killing",
        "Pod Succeeded",
        "Pod Failed",
    ),
    "Node": (  # device plugin (and the node agent as kubelet's device manager)
        "loadConfig",
        "Start",
        "ResetIdleGPUs",
        "Serve",
        "Register",
        "GetDevicePluginOptions",
        "CheckHealth",
        "ListAndWatch",
        "GetCapacity",
        "RegisterInAnnotation",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ),
    # the Job controller's Suspended (at creation) and Resumed (once Kueue unsuspended it)
    "Job": (
        "Suspended",
        "handleJobWithNoWorkload",
        "startJob",
        "Resumed",
        "SuccessfulCreate",
        "Completed",
    ),
    # Kueue: queued, then a scheduling cycle's decision (the cache first, then the
    # status); a victim's IssuePreemptions and its requeue keep the places their times give
    "Workload": (
        "handleJobWithNoWorkload",  # created, then seen by the queue manager
        "AddOrUpdateWorkload",
        "requeueAndUpdate",
        "assumeWorkload",
        "admit",
        "SyncAdmittedCondition",
    ),
}
_RANKS = {kind: {step: i for i, step in enumerate(steps)} for kind, steps in CHAINS.items()}
# Steps that begin a new round of their object's chain (a scheduling retry, a plugin's
# restart, a Workload queued again after eviction): never moved before the steps of the
# round they follow.
ROUND_STARTS = frozenset({"PreFilter", "loadConfig", "AddOrUpdateWorkload"})
# Seconds by which a component may record a step after the steps it caused (the device
# plugin's Register returns after kubelet called GetDevicePluginOptions and ListAndWatch;
# kube-scheduler records Scheduled after the pod is bound and seen Running).
WINDOW = 0.5

# what the pod lines name as their writer: kwok plays the kubelet on the local backend;
# kind's nodes (and an existing cluster's) run the real one
KWOK_KUBELET = "kwok (kubelet)"
KUBELET = "kubelet"


def rank(ev: TraceEvent) -> int | None:
    """The step's place in its object's call chain; None for a step the chain does not know."""
    kind = ev.regarding.partition(" ")[0]
    return _RANKS.get(kind, {}).get(ev.step)


def whole_second(ev: TraceEvent) -> int:
    return math.floor(ev.time.timestamp())


def close(a: TraceEvent, b: TraceEvent) -> bool:
    """Whether ``a`` and ``b`` are near enough in time that their order may be the
    recording's, not the call's: within ``WINDOW`` where both times are precise, within
    one whole second where one is a core/v1 Event's."""
    if a.time.microsecond and b.time.microsecond:
        return abs((b.time - a.time).total_seconds()) < WINDOW
    return whole_second(a) == whole_second(b)


def causal_order(events: Sequence[TraceEvent]) -> list[TraceEvent]:
    """``events`` by time (ties: as given); a step recorded after a step of its object's
    call chain that it caused is put back before it, if the two are ``close``. A step
    that starts a round (``ROUND_STARTS``: a retry, a restart) stays where its time is,
    and so does a step next to an unknown step of its object."""
    result: list[TraceEvent] = []
    for ev in sorted((e for e in events if e.time.microsecond), key=lambda ev: ev.time):
        at, r = len(result), rank(ev)
        if r is not None and ev.step not in ROUND_STARTS:
            for i in range(len(result) - 1, -1, -1):
                before = result[i]
                if not close(before, ev):
                    break
                if before.regarding != ev.regarding:
                    continue
                earlier = rank(before)
                if earlier is None or earlier <= r:
                    break
                at = i
        result.insert(at, ev)
    for ev in sorted((e for e in events if not e.time.microsecond), key=lambda ev: ev.time):
        _place_whole_second(result, ev)
    return result


def _place_whole_second(result: list[TraceEvent], ev: TraceEvent) -> None:
    """A core/v1 Event (whole-second time) goes at the start of its second, after the
    ones placed there before it, unless steps of its object's chain that come before it
    happened in that second: then right after the last of them (the Job controller's
    SuccessfulCreate after Kueue's startJob that let it create the pod)."""
    second, r = whole_second(ev), rank(ev)
    at = next(
        (
            i
            for i, e in enumerate(result)
            if whole_second(e) > second or (whole_second(e) == second and e.time.microsecond)
        ),
        len(result),
    )
    if r is not None:
        for i, e in enumerate(result):
            earlier = rank(e)
            same = e.regarding == ev.regarding and whole_second(e) == second
            if same and earlier is not None and earlier < r:
                at = max(at, i + 1)
    result.insert(at, ev)


def pod_phase_event(
    pod: Mapping[str, Any], seen: dt.datetime, writer: str = KWOK_KUBELET
) -> TraceEvent:
    """A pod's phase, from the pod watch, as a step of its story (``Pod Running``).

    Dated when the watch delivered it: a pod's status carries whole-second times at best,
    and none for some phases, while a watch delivers a change within milliseconds.
    """
    meta = pod["metadata"]
    node = (pod.get("spec") or {}).get("nodeName")
    return TraceEvent(
        time=seen,
        component=writer,
        step=f"Pod {(pod.get('status') or {}).get('phase')}",
        regarding=f"Pod {meta.get('namespace')}/{meta['name']}",
        note=f"on {node}" if node else "",
        warning=False,
    )


@dataclass(frozen=True)
class Told:
    """A line to print, and whether a line that happened after it was printed before."""

    event: TraceEvent
    late: bool = False


@dataclass
class Narrator:
    """Holds trace lines for ``hold`` seconds, then lets them out in causal order.

    ``now`` is a monotonic clock reading (time.monotonic()), passed in by the caller.
    """

    hold: float = HOLD
    _held: list[tuple[float, TraceEvent]] = field(default_factory=list)
    # the latest whole second printed, and the lines printed in it (to tell a late one)
    _second: int | None = None
    _last: list[TraceEvent] = field(default_factory=list)

    def add(self, ev: TraceEvent, now: float) -> None:
        self._held.append((now, ev))

    def due(self, now: float) -> list[Told]:
        """The lines to print now: in causal order, every held line up to the last one that
        waited its full ``hold`` (earlier lines go with it: holding them longer cannot put
        them after it)."""
        ordered = causal_order([ev for _, ev in self._held])
        ripe = {id(ev) for arrived, ev in self._held if now - arrived >= self.hold}
        cut = max((i + 1 for i, ev in enumerate(ordered) if id(ev) in ripe), default=0)
        return self._tell(ordered[:cut])

    def drain(self) -> list[Told]:
        """Every held line, in causal order (before a tick or when the story ends)."""
        return self._tell(causal_order([ev for _, ev in self._held]))

    def _tell(self, events: list[TraceEvent]) -> list[Told]:
        gone = {id(ev) for ev in events}
        self._held = [(t, ev) for t, ev in self._held if id(ev) not in gone]
        told = [Told(ev, self._late(ev)) for ev in events]
        for ev in events:
            second = whole_second(ev)
            if self._second is None or second > self._second:
                self._second, self._last = second, [ev]
            elif second == self._second:
                self._last.append(ev)
        return told

    def _late(self, ev: TraceEvent) -> bool:
        """Whether a line printed before ``ev`` (in an earlier batch) comes after it."""
        if self._second is None or whole_second(ev) > self._second:
            return False
        if whole_second(ev) < self._second:
            return True
        return any(_after(printed, ev) for printed in self._last)


def _after(printed: TraceEvent, ev: TraceEvent) -> bool:
    """Whether ``printed`` happened after ``ev``, within one second: by the call chain's
    order for steps of one object, else by time, but only where both times have their
    sub-second part (a core/v1 Event's whole second cannot be placed against a line timed
    to the microsecond, so it is not called late for that)."""
    chained = printed.regarding == ev.regarding and None not in (rank(printed), rank(ev))
    if chained and ev.step not in ROUND_STARTS and close(printed, ev):
        return (rank(printed) or 0) > (rank(ev) or 0)
    precise = printed.time.microsecond and ev.time.microsecond
    return bool(precise) and printed.time > ev.time
