"""The scheduling framework's vocabulary: Status codes, CycleState, extension points.

Mirrors kubernetes v1.36.3 ``staging/src/k8s.io/kube-scheduler/framework/interface.go``
(``Code``: Success, Error, Unschedulable, UnschedulableAndUnresolvable, Wait, Skip,
Pending; ``Status``; ``NominatingInfo``; one small interface per extension point, from
``PreEnqueue`` to ``PostBind``, and ``EnqueueExtensions``) and ``cycle_state.go``,
``pkg/scheduler/framework/types.go`` (``QueuedPodInfo``), with the upstream method names
(``PreFilter``, ``Filter``, ``Score``, ``Permit`` ...) so a learner can read the two side
by side. Cluster events and queueing hints are in events.py.

A plugin is any object with a ``name`` and one or more of the methods below; the
framework finds out which extension points it serves by the methods it has (upstream:
which interfaces its type implements).

Lab difference: no ``context.Context`` (Python threads, no cancellation).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from gpulab.framework.events import ClusterEvent, ClusterEventWithHint
from gpulab.framework.snapshot import NodeInfo, PodInfo

Obj = Mapping[str, Any]

MAX_NODE_SCORE = 100
MIN_NODE_SCORE = 0
# Permit may not ask a pod to wait longer than this (runtime/framework.go maxTimeout)
MAX_PERMIT_TIMEOUT = 15 * 60.0


class Code(enum.IntEnum):
    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3
    WAIT = 4
    SKIP = 5
    PENDING = 6

    def __str__(self) -> str:
        # upstream's codes[]: "Success", "UnschedulableAndUnresolvable" ...
        return "".join(part.capitalize() for part in self.name.split("_"))


@dataclass(frozen=True)
class Status:
    """The result of running a plugin: a code, reasons, and the plugin that said so."""

    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str = ""

    @classmethod
    def of(cls, code: Code, *reasons: str) -> Status:
        return cls(code, tuple(r for r in reasons if r))

    def with_plugin(self, plugin: str) -> Status:
        return Status(self.code, self.reasons, plugin)

    def is_success(self) -> bool:
        return self.code == Code.SUCCESS

    def is_wait(self) -> bool:
        return self.code == Code.WAIT

    def is_skip(self) -> bool:
        return self.code == Code.SKIP

    def is_rejected(self) -> bool:
        """Unschedulable, UnschedulableAndUnresolvable or Pending."""
        return self.code in (
            Code.UNSCHEDULABLE,
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
            Code.PENDING,
        )

    @property
    def message(self) -> str:
        return ", ".join(self.reasons)

    def __str__(self) -> str:
        where = f"{self.plugin}: " if self.plugin else ""
        return f"{where}{self.code}" + (f" ({self.message})" if self.reasons else "")


SUCCESS = Status()


def unschedulable(*reasons: str) -> Status:
    return Status.of(Code.UNSCHEDULABLE, *reasons)


def unresolvable(*reasons: str) -> Status:
    return Status.of(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, *reasons)


def error(*reasons: str) -> Status:
    return Status.of(Code.ERROR, *reasons)


class CycleState:
    """Data plugins pass between extension points within one pod's scheduling attempt."""

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.skip_filter_plugins: set[str] = set()
        self.skip_score_plugins: set[str] = set()

    def read(self, key: str) -> Any:
        with self._lock:
            if key not in self._data:
                raise KeyError(f"{key!r} not found in the cycle state")
            return self._data[key]

    def get(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return self._data.get(key, default)

    def write(self, key: str, value: Any) -> None:
        with self._lock:
            self._data[key] = value


PODS_TO_ACTIVATE_KEY = "kubernetes.io/pods-to-activate"


@dataclass
class PodsToActivate:
    """Pods a plugin wants moved to activeQ at the end of this cycle (key -> pod)."""

    pods: dict[str, Obj] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


# -- what a scheduling attempt works with ---------------------------------------------------


@dataclass
class QueuedPodInfo:
    """A pod in the scheduling queue with its attempt bookkeeping (framework.QueuedPodInfo)."""

    pod_info: PodInfo
    timestamp: float  # when it was added (back) to the queue (the queue's clock)
    # when it first entered activeQ (the queue's clock: wall-clock seconds)
    initial_attempt_timestamp: float | None = None
    attempts: int = 0
    unschedulable_count: int = 0
    consecutive_errors_count: int = 0
    unschedulable_plugins: set[str] = field(default_factory=set)
    pending_plugins: set[str] = field(default_factory=set)
    backoff_expiration: float | None = None
    # the PreEnqueue plugin that keeps the pod out of activeQ, and the events it registered
    gating_plugin: str = ""
    gating_plugin_events: list[ClusterEvent] = field(default_factory=list)

    def gated(self) -> bool:
        return bool(self.gating_plugin)

    @property
    def pod(self) -> Obj:
        return self.pod_info.pod

    @property
    def uid(self) -> str:
        return self.pod_info.uid

    @property
    def key(self) -> str:
        return self.pod_info.key


@dataclass(frozen=True)
class PreFilterResult:
    """PreFilter may narrow the nodes worth filtering; ``None`` means all nodes."""

    node_names: frozenset[str] | None = None

    def all_nodes(self) -> bool:
        return self.node_names is None

    def merge(self, other: PreFilterResult | None) -> PreFilterResult:
        if other is None or other.all_nodes():
            return self
        if self.all_nodes():
            return other
        assert self.node_names is not None and other.node_names is not None
        return PreFilterResult(self.node_names & other.node_names)


@dataclass(frozen=True)
class PostFilterResult:
    """What PostFilter found (upstream: a node nominated by preemption)."""

    nominating_info: NominatingInfo | None = None


class NominatingMode(enum.Enum):
    NOOP = "Noop"  # leave status.nominatedNodeName as it is
    OVERRIDE = "Override"  # set it to nominated_node_name ("" clears it)


@dataclass(frozen=True)
class NominatingInfo:
    """What to write into the pod's ``status.nominatedNodeName``."""

    nominated_node_name: str
    mode: NominatingMode = NominatingMode.OVERRIDE


def nominating_mode(info: NominatingInfo | None) -> NominatingMode:
    """NominatingInfo.Mode(): a nil NominatingInfo is Noop."""
    return NominatingMode.NOOP if info is None else info.mode


CLEAR_NOMINATED_NODE = NominatingInfo("")


@dataclass
class NodeScore:
    name: str
    score: int


@dataclass
class NodePluginScores:
    """One node's weighted score from each Score plugin and their total."""

    name: str
    scores: dict[str, int] = field(default_factory=dict)
    total_score: int = 0


# -- extension points ---------------------------------------------------------------------


class Plugin(Protocol):
    name: str


@runtime_checkable
class PreEnqueuePlugin(Protocol):
    """Runs before a pod enters activeQ; a failure keeps it in unschedulablePods."""

    name: str

    def PreEnqueue(self, pod: Obj) -> Status: ...


@runtime_checkable
class QueueSortPlugin(Protocol):
    name: str

    def Less(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool: ...


@runtime_checkable
class PreFilterPlugin(Protocol):
    name: str

    def PreFilter(
        self, state: CycleState, pod: Obj, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status]: ...


@runtime_checkable
class FilterPlugin(Protocol):
    name: str

    def Filter(self, state: CycleState, pod: Obj, node: NodeInfo) -> Status: ...


@runtime_checkable
class PostFilterPlugin(Protocol):
    name: str

    def PostFilter(
        self, state: CycleState, pod: Obj, node_to_status: Mapping[str, Status]
    ) -> tuple[PostFilterResult | None, Status]: ...


@runtime_checkable
class PreScorePlugin(Protocol):
    name: str

    def PreScore(self, state: CycleState, pod: Obj, nodes: list[NodeInfo]) -> Status: ...


@runtime_checkable
class ScorePlugin(Protocol):
    name: str

    def Score(self, state: CycleState, pod: Obj, node: NodeInfo) -> tuple[int, Status]: ...


@runtime_checkable
class ScoreExtensions(Protocol):
    """A Score plugin that rescales its scores to 0..MAX_NODE_SCORE once all are known."""

    def NormalizeScore(self, state: CycleState, pod: Obj, scores: list[NodeScore]) -> Status: ...


@runtime_checkable
class ReservePlugin(Protocol):
    name: str

    def Reserve(self, state: CycleState, pod: Obj, node_name: str) -> Status: ...

    def Unreserve(self, state: CycleState, pod: Obj, node_name: str) -> None: ...


@runtime_checkable
class PermitPlugin(Protocol):
    name: str

    def Permit(self, state: CycleState, pod: Obj, node_name: str) -> tuple[Status, float]: ...


@runtime_checkable
class PreBindPlugin(Protocol):
    name: str

    def PreBind(self, state: CycleState, pod: Obj, node_name: str) -> Status: ...


@runtime_checkable
class BindPlugin(Protocol):
    name: str

    def Bind(self, state: CycleState, pod: Obj, node_name: str) -> Status: ...


@runtime_checkable
class PostBindPlugin(Protocol):
    name: str

    def PostBind(self, state: CycleState, pod: Obj, node_name: str) -> None: ...


@runtime_checkable
class EnqueueExtensions(Protocol):
    """Which cluster events may make a pod this plugin rejected schedulable, each with
    the hint that decides it for one pod."""

    name: str

    def EventsToRegister(self) -> list[ClusterEventWithHint]: ...


EXTENSION_POINTS: dict[str, type] = {
    "preEnqueue": PreEnqueuePlugin,
    "queueSort": QueueSortPlugin,
    "preFilter": PreFilterPlugin,
    "filter": FilterPlugin,
    "postFilter": PostFilterPlugin,
    "preScore": PreScorePlugin,
    "score": ScorePlugin,
    "reserve": ReservePlugin,
    "permit": PermitPlugin,
    "preBind": PreBindPlugin,
    "bind": BindPlugin,
    "postBind": PostBindPlugin,
}
"""KubeSchedulerConfiguration's extension-point keys -> the interface a plugin needs."""
