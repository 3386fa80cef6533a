"""Causal order for the live call-chain trace (the demos' LiveTrace).

Events reach a reader in the order their watches deliver them, not in the order they
happened: each component posts its Events from a background thread (gpulab.trace.Tracer),
kube-scheduler's and the Job controller's broadcasters post theirs when they get to it,
and Pod phases come through a watch of their own. Printed on arrival, a pod's Running
precedes its Bind and timestamps go backwards. The Narrator holds each line for a short
window and then lets it out sorted:

- by the Event's own time (microseconds for events.k8s.io ``eventTime``, whole seconds
  for core/v1 ``lastTimestamp``);
- within one object and one whole second, by its call chain's order of steps (``CHAINS``):
  whole-second times cannot order two steps of the same second, and a component may record
  a step just after the step it caused (the device plugin's ``Register`` returns after
  kubelet started ``ListAndWatch``).

A line that arrives after a later line was already printed is told as late, not slipped in
silently. Pure: the caller passes the clock and prints what it gets back.

Known limit: two attempts at one pod within one second (Coscheduling activating a waiting
sibling at once) are one group, so their steps merge in chain order (PreFilter, PreFilter,
Filter, FailedScheduling ...).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
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
    "Job": ("handleJobWithNoWorkload", "startJob", "SuccessfulCreate", "Completed"),
}
_RANKS = {kind: {step: i for i, step in enumerate(steps)} for kind, steps in CHAINS.items()}

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


def causal_order(events: Sequence[TraceEvent]) -> list[TraceEvent]:
    """``events`` by time (ties: as given); within one object and one whole second the steps
    of its call chain are put in the chain's order, in the places those steps took."""
    ordered = sorted(events, key=lambda ev: ev.time)
    places: dict[tuple[int, str], list[int]] = defaultdict(list)
    for i, ev in enumerate(ordered):
        if rank(ev) is not None:
            places[(whole_second(ev), ev.regarding)].append(i)
    result = list(ordered)
    for where in places.values():
        steps = sorted((ordered[i] for i in where), key=lambda ev: rank(ev) or 0)
        for i, ev in zip(where, steps, strict=True):
            result[i] = ev
    return result


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
    if printed.regarding == ev.regarding and None not in (rank(printed), rank(ev)):
        return (rank(printed) or 0) > (rank(ev) or 0)
    precise = printed.time.microsecond and ev.time.microsecond
    return bool(precise) and printed.time > ev.time
