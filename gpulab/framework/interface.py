"""The scheduling framework's vocabulary: Status codes, CycleState, extension points.

Mirrors kubernetes v1.36.3 ``staging/src/k8s.io/kube-scheduler/framework/interface.go``
(``Code``: Success, Error, Unschedulable, UnschedulableAndUnresolvable, Wait, Skip,
Pending; ``Status``; one small interface per extension point) and ``cycle_state.go``,
``types.go`` (``ClusterEvent``, ``ActionType``, ``QueuedPodInfo``), with the upstream
method names (``PreFilter``, ``Filter``, ``Score``, ``Permit`` ...) so a learner can read
the two side by side.

A plugin is any object with a ``name`` and one or more of the methods below; the
framework finds out which extension points it serves by the methods it has (upstream:
which interfaces its type implements).

Lab differences: no ``context.Context`` (Python threads, no cancellation); a
QueueingHint function is not supported (every event a plugin registers for requeues the
pods it rejected, as upstream's default hint ``Queue`` does).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

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
    initial_attempt_timestamp: float | None = None  # first Pop, wall-clock seconds
    attempts: int = 0
    unschedulable_count: int = 0
    consecutive_errors_count: int = 0
    unschedulable_plugins: set[str] = field(default_factory=set)
    pending_plugins: set[str] = field(default_factory=set)
    backoff_expiration: float | None = None

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
    """What PostFilter found (upstream: a nominated node after preemption)."""

    nominated_node_name: str = ""


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


# -- cluster events (what may make an unschedulable pod schedulable) -------------------------


class ActionType(enum.IntFlag):
    ADD = 1
    DELETE = 2
    UPDATE_NODE_ALLOCATABLE = 4
    UPDATE_NODE_LABEL = 8
    UPDATE_NODE_TAINT = 16
    UPDATE_NODE_CONDITION = 32
    UPDATE_NODE_ANNOTATION = 64
    UPDATE_POD_LABEL = 128
    UPDATE_POD_SCALE_DOWN = 256
    UPDATE_POD_TOLERATION = 512
    UPDATE_POD_OTHER = 1024
    UPDATE = (
        UPDATE_NODE_ALLOCATABLE
        | UPDATE_NODE_LABEL
        | UPDATE_NODE_TAINT
        | UPDATE_NODE_CONDITION
        | UPDATE_NODE_ANNOTATION
        | UPDATE_POD_LABEL
        | UPDATE_POD_SCALE_DOWN
        | UPDATE_POD_TOLERATION
        | UPDATE_POD_OTHER
    )
    ALL = ADD | DELETE | UPDATE


# EventResource names as upstream spells them; custom resources are
# "<plural>.<version>.<group>", e.g. "podgroups.v1alpha1.scheduling.x-k8s.io".
POD = "Pod"
ASSIGNED_POD = "AssignedPod"
UNSCHEDULED_POD = "UnschedulablePod"
NODE = "Node"
WILDCARD = "*"


@dataclass(frozen=True)
class ClusterEvent:
    resource: str
    action_type: ActionType
    label: str = ""

    def matches(self, incoming: ClusterEvent) -> bool:
        """MatchClusterEvents: this registered event covers ``incoming``. ``Pod`` covers
        assigned and unscheduled pods alike."""
        if self.resource == WILDCARD or incoming.resource == WILDCARD:
            return True
        same = self.resource == incoming.resource or (
            self.resource == POD and incoming.resource in (ASSIGNED_POD, UNSCHEDULED_POD)
        )
        return same and bool(self.action_type & incoming.action_type)

    def __str__(self) -> str:
        return self.label or f"{self.resource}{self.action_type!r}"


EVENT_ASSIGNED_POD_ADD = ClusterEvent(ASSIGNED_POD, ActionType.ADD, "AssignedPodAdd")
EVENT_ASSIGNED_POD_DELETE = ClusterEvent(ASSIGNED_POD, ActionType.DELETE, "AssignedPodDelete")


def node_update_events(old: Obj, new: Obj) -> list[ClusterEvent]:
    """framework.NodeSchedulingPropertiesChange: what changed on a node, as events."""
    out: list[ClusterEvent] = []
    old_status, new_status = old.get("status") or {}, new.get("status") or {}
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    checks = (
        (
            old_spec.get("unschedulable") != new_spec.get("unschedulable")
            or old_spec.get("taints") != new_spec.get("taints"),
            ActionType.UPDATE_NODE_TAINT,
            "NodeTaintChange",
        ),
        (
            old_status.get("allocatable") != new_status.get("allocatable"),
            ActionType.UPDATE_NODE_ALLOCATABLE,
            "NodeAllocatableChange",
        ),
        (
            old_meta.get("labels") != new_meta.get("labels"),
            ActionType.UPDATE_NODE_LABEL,
            "NodeLabelChange",
        ),
        (
            old_status.get("conditions") != new_status.get("conditions"),
            ActionType.UPDATE_NODE_CONDITION,
            "NodeConditionChange",
        ),
        (
            old_meta.get("annotations") != new_meta.get("annotations"),
            ActionType.UPDATE_NODE_ANNOTATION,
            "NodeAnnotationChange",
        ),
    )
    for changed, action, label in checks:
        if changed:
            out.append(ClusterEvent(NODE, action, label))
    return out


# -- extension points ---------------------------------------------------------------------


class Plugin(Protocol):
    name: str


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
    """Which cluster events may make a pod this plugin rejected schedulable."""

    def EventsToRegister(self) -> list[ClusterEvent]: ...


EXTENSION_POINTS: dict[str, type] = {
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
