"""The state walk: every Reconcile steps through all operand states in upstream's order.

Mirrors NVIDIA gpu-operator v26.7.0 ``controllers/state_manager.go`` (``init``'s
``addState`` list, ``step``, ``last``, ``isStateEnabled``) and the loop and the ending of
``controllers/clusterpolicy_controller.go`` ``Reconcile``: ``step()`` until ``last()``,
each state's controls run in order, a state is as ready as its least ready control; the
not-ready states are collected (``statesNotReady``), never stop the walk, and make the
ClusterPolicy ``notReady`` with a requeue after 5 s (``clusterPolicyNotReadyMessage``);
all ready makes it ``ready``. The order between operands on a node is enforced there, by
their init containers waiting for the validator's markers.

Pure: the controls are injected (``controls.py`` has the ones that talk to the API
server), so the walk is tested with fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulab.gpuoperator import api

# state_manager.go init(): the order of addState
STATES = (
    "pre-requisites",
    "state-operator-metrics",
    "state-driver",
    "state-container-toolkit",
    "state-operator-validation",
    "state-device-plugin",
    "state-mps-control-daemon",
    "state-dcgm",
    "state-dcgm-exporter",
    "gpu-feature-discovery",
    "state-mig-manager",
    "state-node-status-exporter",
    "state-vgpu-manager",
    "state-vgpu-device-manager",
    "state-sandbox-validation",
    "state-vfio-manager",
    "state-sandbox-device-plugin",
    "state-kata-device-plugin",
    "state-kata-manager",
    "state-cc-manager",
)

REQUEUE_NOT_READY = 5.0  # ctrl.Result{RequeueAfter: time.Second * 5}
REQUEUE_NO_NFD = 45.0  # no NFD label anywhere: poll for new nodes

# isStateEnabled: state -> (component whose IsEnabled decides, needs sandbox workloads)
_ENABLED_BY = {
    "state-driver": ("driver", False),
    "state-container-toolkit": ("toolkit", False),
    "state-device-plugin": ("devicePlugin", False),
    "state-mps-control-daemon": ("devicePlugin", False),
    "state-dcgm": ("dcgm", False),
    "state-dcgm-exporter": ("dcgmExporter", False),
    "state-mig-manager": ("migManager", False),
    "gpu-feature-discovery": ("gfd", False),
    "state-node-status-exporter": ("nodeStatusExporter", False),
    "state-vfio-manager": ("vfioManager", True),
    "state-vgpu-device-manager": ("vgpuDeviceManager", True),
    "state-vgpu-manager": ("vgpuManager", True),
}


def is_state_enabled(state: str, spec: Mapping[str, Any]) -> bool:
    """``isStateEnabled``."""
    sandbox = api.enabled(spec, "sandboxWorkloads")
    mode = str(api.component(spec, "sandboxWorkloads").get("mode") or "")
    if state == "pre-requisites":
        return not api.nri_plugin_enabled(spec)
    if state in ("state-operator-validation", "state-operator-metrics"):
        return True
    if state == "state-sandbox-validation":
        return sandbox
    if state == "state-sandbox-device-plugin":
        return sandbox and api.enabled(spec, "sandboxDevicePlugin") and mode == "kubevirt"
    if state == "state-kata-device-plugin":
        return sandbox and api.enabled(spec, "kataSandboxDevicePlugin") and mode == "kata"
    if state == "state-cc-manager":
        return sandbox and api.enabled(spec, "ccManager") and mode == "kata"
    if state == "state-kata-manager":
        return False  # deprecated upstream: never deployed
    key, needs_sandbox = _ENABLED_BY[state]
    return api.enabled(spec, key) and (sandbox or not needs_sandbox)


Control = Callable[["ClusterPolicyController"], str]
"""One object's control (``controlFunc``): apply or delete it, return its state."""


@dataclass
class ClusterPolicyController:
    """``ClusterPolicyController``: the states, each with its controls, and the cursor
    ``idx`` of the walk; ``singleton`` is the ClusterPolicy being reconciled."""

    state_names: list[str] = field(default_factory=list)
    controls: list[list[Control]] = field(default_factory=list)
    singleton: Mapping[str, Any] = field(default_factory=dict)
    idx: int = 0
    # the lab's trace: per state, why its DaemonSet is (not) ready, from its last step
    why: dict[str, str] = field(default_factory=dict)
    # what init() found on the nodes (discoverGPUNodes)
    has_nfd_labels: bool = False
    has_gpu_nodes: bool = False

    def add_state(self, name: str, controls: Sequence[Control]) -> None:
        """``addState``."""
        self.state_names.append(name)
        self.controls.append(list(controls))

    @property
    def spec(self) -> Mapping[str, Any]:
        return self.singleton.get("spec") or {}

    @property
    def state(self) -> str:
        """The state the controls being run belong to."""
        return self.state_names[self.idx]

    def state_enabled(self) -> bool:
        return is_state_enabled(self.state, self.spec)

    def step(self) -> str:
        """``step``: run the current state's controls, move to the next state; the state's
        status is ready unless a control says otherwise (the last such answer wins).
        An exception (an API error) propagates, as upstream's statusError does.
        (Lab: a state the lab ships no objects for is ``disabled`` when its component is,
        else ready.)"""
        self.why.pop(self.state, None)
        if not self.controls[self.idx]:
            enabled = self.state_enabled()
            self.idx += 1
            return api.READY if enabled else api.DISABLED
        result = api.READY
        for control in self.controls[self.idx]:
            status = control(self)
            if status != api.READY:
                result = status
        self.idx += 1
        return result

    def last(self) -> bool:
        return self.idx == len(self.controls)


@dataclass(frozen=True)
class Walk:
    """One pass over every state: each state's status, in order."""

    statuses: tuple[tuple[str, str], ...]

    @property
    def not_ready(self) -> list[str]:
        """``statesNotReady``."""
        return [name for name, status in self.statuses if status == api.NOT_READY]


def walk(ctrl: ClusterPolicyController, on_step: Callable[[str, str], None] | None = None) -> Walk:
    """Reconcile's ``for { step(); ...; if last() { break } }`` from the first state;
    ``on_step(state, status)`` is told each result as it comes (the trace)."""
    ctrl.idx = 0
    statuses = []
    while not ctrl.last():
        name = ctrl.state
        status = ctrl.step()
        statuses.append((name, status))
        if on_step is not None:
            on_step(name, status)
    return Walk(tuple(statuses))


def not_ready_message(states_not_ready: Sequence[str], reasons: Sequence[str] = ()) -> str:
    """``clusterPolicyNotReadyMessage``."""
    parts = ["ClusterPolicy is not ready"]
    if states_not_ready:
        parts.append(f"states not ready: [{' '.join(states_not_ready)}]")
    return "; ".join([*parts, *reasons])


@dataclass(frozen=True)
class Outcome:
    """How a pass ends: ``status.state``, the condition to set (type, reason, message) and
    when to look again (None: only on the next event)."""

    state: str
    condition: tuple[str, str, str]
    requeue_after: float | None


def outcome(result: Walk, has_nfd_labels: bool, has_gpu_nodes: bool) -> Outcome:
    """The end of ``Reconcile`` after the walk."""
    if result.not_ready:
        message = not_ready_message(result.not_ready)
        return Outcome(
            api.NOT_READY, (api.COND_ERROR, api.OPERAND_NOT_READY, message), REQUEUE_NOT_READY
        )
    if not has_nfd_labels:
        return Outcome(
            api.READY, (api.COND_READY, api.NFD_LABELS_MISSING, "No NFD labels found"),
            REQUEUE_NO_NFD,
        )  # fmt: skip
    if not has_gpu_nodes:
        message = "No GPU node found, watching for new nodes to join the cluster."
        return Outcome(api.READY, (api.COND_READY, api.NO_GPU_NODES, message), None)
    message = "ClusterPolicy is ready as all resources have been successfully reconciled"
    return Outcome(api.READY, (api.COND_READY, api.RECONCILED, message), None)


def conditions(
    current: Sequence[Mapping[str, Any]], kind: str, reason: str, message: str, now: str
) -> list[dict[str, Any]]:
    """``conditions.updateConditions`` with ``meta.SetStatusCondition``: ``Ready`` and
    ``Error`` set as a pair; a condition's lastTransitionTime changes only when its status
    does."""
    if kind == api.COND_READY:
        wanted = [
            (api.COND_READY, "True", reason, message),
            (api.COND_ERROR, "False", api.COND_READY, ""),
        ]
    else:
        wanted = [
            (api.COND_READY, "False", api.COND_ERROR, ""),
            (api.COND_ERROR, "True", reason, message),
        ]
    out = [dict(c) for c in current]
    for ctype, status, why, text in wanted:
        found = next((c for c in out if c.get("type") == ctype), None)
        if found is None:
            found = {"type": ctype}
            out.append(found)
        if found.get("status") != status:
            found["lastTransitionTime"] = now
        found.update(status=status, reason=why, message=text)
    return out
