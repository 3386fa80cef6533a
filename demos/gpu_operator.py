"""Demo `gpu-operator`: NVIDIA gpu-operator v26.7.0's call chain, live.

    ClusterPolicy created → Reconcile → labelGPUNodes (nvidia.com/gpu.present,
    nvidia.com/gpu.deploy.<operand>) → step() through every state in order, each applying
    its DaemonSet → pods start on the GPU nodes, their init containers waiting for the
    validator's markers (driver-ready, toolkit-ready ...) → device plugin Register /
    ListAndWatch → status.state ready
    dcgm-exporter /metrics (DCGM field names, read from NVML)
    the MIG manager's config, built from the GPUs' MIG profiles: ConfigMap <node>-mig-config
    nvidia.com/mig.config=all-1g.10gb → MIG manager: state pending → GPU clients paused →
    nvmlDeviceSetMigMode / nvmlDeviceCreateGpuInstance / nvmlGpuInstanceCreateComputeInstance
    → clients back → success → nvidia.com/mig-1g.10gb; dcgm-exporter now reports each MIG
    device (GPU_I_PROFILE, GPU_I_ID), no whole-GPU row
    an unknown MIG config → failed, with the reason
    devicePlugin.enabled: false → the DaemonSet is deleted → the GPUs leave allocatable

Every step is read back from the Events the operator and its operands write as they run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import threading
from typing import Any

import httpx
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from rich.markup import escape
from rich.table import Table

from demos.common import DemoFailed, LiveTrace, chapter, console, ensure_backend, ok, say
from gpulab import trace
from gpulab.fakegpu import profiles
from gpulab.fakegpu.render import BOARDS
from gpulab.gpuoperator import api as cp
from gpulab.gpuoperator import migparted
from gpulab.gpuoperator import nodelabels as nl
from gpulab.gpuoperator.migmanager import node_configmap_name
from gpulab.informer import NODES, Handlers, Informer, ListWatch
from gpulab.wait import wait_for
from harness.apply import MANIFESTS
from harness.backends import Backend
from harness.spec import ClusterSpec

NAMESPACE = "gpu-operator"
POLICY_FILE = MANIFESTS / "gpu-operator/samples/clusterpolicy.yaml"
MIG_NODE = "gpu-a100"
MIG_NODE_CONFIGMAP = node_configmap_name(MIG_NODE)
MIG_CONFIG = "all-1g.10gb"
BAD_MIG_CONFIG = "all-bogus"
DEVICE_PLUGIN_DS = "nvidia-device-plugin-daemonset"
OPERATOR = "gpu-operator"  # the operator's Deployment (label app.kubernetes.io/name)
GPU = "nvidia.com/gpu"
# whose steps the narration shows (the pod runner's container Events are left out)
STORYTELLERS = {
    "gpu-operator", "nvidia-validator", "device-plugin", "node-agent", "nvidia-mig-manager",
    "gpu-feature-discovery", "kube-controller-manager",
}  # fmt: skip
READY_TIMEOUT = 120.0


@dataclasses.dataclass
class OperatorTrace(LiveTrace):
    """The operator's namespace, plus its ClusterPolicy's and the GPU nodes' Events; not
    the Events of the pods in ``stale`` (the operator pod the demo restarts: on a cold
    cluster its start is only seconds old)."""

    stale: frozenset[str] = frozenset()

    def _wanted(self, ev: trace.TraceEvent, namespace: str) -> bool:
        if ev.time < self._since - dt.timedelta(seconds=2) or ev.component not in STORYTELLERS:
            return False
        if ev.regarding in {f"Pod {NAMESPACE}/{pod}" for pod in self.stale}:
            return False
        if namespace == self.namespace:
            return True
        return ev.regarding.startswith(f"{cp.KIND} ") or any(
            ev.regarding == f"Node {n}" for n in self.nodes
        )

    def state_table(self, policy: str) -> Table:
        """The last status each state reported (the operator's `step` Events)."""
        last: dict[str, str] = {}
        for ev in self.seen:
            if ev.step == "step" and ev.regarding == f"{cp.KIND} {policy}":
                state, _, status = ev.note.partition(": ")
                last[state] = status.partition(" (")[0]  # "(DaemonSet ...: why)" left out
        table = Table(title=f"ClusterPolicy {policy}: the states of the last Reconcile")
        table.add_column("state (in upstream's order)")
        table.add_column("status")
        from gpulab.gpuoperator.states import STATES

        for state in STATES:
            status = last.get(state, "-")
            colour = {"ready": "green", "disabled": "dim", "notReady": "red"}.get(status, "")
            table.add_row(state, f"[{colour}]{status}[/{colour}]" if colour else status)
        return table


class NodeLabels:
    """Every value a node's label took, in order (a watch sees each transition)."""

    def __init__(self, api: client.ApiClient, node: str, keys: tuple[str, ...]) -> None:
        self.keys = keys
        self.seen: dict[str, list[str]] = {k: [] for k in keys}
        self._lock = threading.Lock()
        self.informer = Informer(
            ListWatch(api, NODES, field_selector=f"metadata.name={node}"),
            Handlers(on_add=self._record, on_update=lambda _o, n: self._record(n)),
        )

    def _record(self, node: dict[str, Any]) -> None:
        labels = (node.get("metadata") or {}).get("labels") or {}
        with self._lock:
            for k in self.keys:
                value = labels.get(k, "")
                if not self.seen[k] or self.seen[k][-1] != value:
                    self.seen[k].append(value)

    def since(self, key: str, mark: int) -> list[str]:
        with self._lock:
            return list(self.seen[key][mark:])

    def mark(self, key: str) -> int:
        with self._lock:
            return len(self.seen[key])


def _allocatable(core: client.CoreV1Api, node: str) -> dict[str, str]:
    return dict(core.read_node(node).status.allocatable or {})


def _capacity(core: client.CoreV1Api, node: str) -> dict[str, str]:
    return dict(core.read_node(node).status.capacity or {})


def _policy(custom: client.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    try:
        return custom.get_cluster_custom_object(cp.GROUP, cp.VERSION, "clusterpolicies", name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def expected_mig_devices(node_profile: str, config_yaml: str, config: str) -> dict[str, int]:
    """What the node should advertise after ``config`` of the MIG manager's config file:
    the rows for the node's boards (the same device filters the MIG manager applies)."""
    profile = profiles.load(node_profile)
    gpus = [
        migparted.Gpu(
            g.index, g.model.name, BOARDS[g.model.name].pci_device_id, g.model.mig_capable
        )
        for g in profile.gpus
    ]
    out: dict[str, int] = {}
    for target in migparted.layout(
        migparted.select(migparted.parse_spec(config_yaml), config), gpus
    ).values():
        for name, count in target.devices.items():
            out[f"nvidia.com/mig-{name}"] = out.get(f"nvidia.com/mig-{name}", 0) + count
    return out


def _generated_config(core: client.CoreV1Api) -> str:
    """The MIG manager's config for MIG_NODE: it builds it from the GPUs at its start."""

    def read() -> str | None:
        try:
            cm = core.read_namespaced_config_map(MIG_NODE_CONFIGMAP, NAMESPACE)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return (cm.data or {}).get("config.yaml")

    return wait_for(read, 60, f"ConfigMap {NAMESPACE}/{MIG_NODE_CONFIGMAP}", 0.5)


def reset(api: client.ApiClient, gpu_nodes: list[str]) -> None:
    """A demo run on a running cluster starts where a fresh one does: no ClusterPolicy (its
    operands garbage-collected with it) and no operator or MIG labels on the nodes."""
    custom = client.CustomObjectsApi(api)
    apps = client.AppsV1Api(api)
    policies = custom.list_cluster_custom_object(cp.GROUP, cp.VERSION, "clusterpolicies")["items"]
    if not policies:
        return
    say("a ClusterPolicy from an earlier run exists: deleting it (its operands go with it)")
    for p in policies:
        custom.delete_cluster_custom_object(
            cp.GROUP, cp.VERSION, "clusterpolicies", p["metadata"]["name"]
        )
    wait_for(
        lambda: not apps.list_namespaced_daemon_set(NAMESPACE).items,
        90,
        "the operands' DaemonSets to be garbage-collected",
    )
    core = client.CoreV1Api(api)
    for name in gpu_nodes:
        labels = core.read_node(name).metadata.labels or {}
        stale = {
            k: None
            for k in labels
            if k.startswith(nl.DEPLOY_PREFIX) or k.startswith(nl.MIG_CONFIG_LABEL)
        }
        if stale:
            core.patch_node(name, {"metadata": {"labels": stale}})


def run(args: argparse.Namespace) -> int:
    backend, spec = ensure_backend(args, addons=("gpu-operator",))
    api = backend.api()
    core = client.CoreV1Api(api)
    gpu_nodes = [n.name for n in spec.nodes if n.profile]
    if MIG_NODE not in gpu_nodes:
        raise DemoFailed(
            f"this demo needs the node {MIG_NODE} (harness/clusters/gpu-operator.yaml)"
        )
    chapter(
        "Chapter - the NVIDIA GPU Operator (gpu-operator v26.7.0, mig-parted v0.15.0)",
        "One ClusterPolicy, and the operator deploys the whole GPU stack on every GPU node:\n"
        "driver, container toolkit, validator, device plugin, GPU feature discovery,\n"
        "dcgm-exporter and the MIG manager. Its Reconcile walks every state in a fixed order\n"
        "on every pass; the order on a node comes from the operands' init containers, which\n"
        "wait for the validator's markers. (Lab: the driver and the toolkit are simulated\n"
        "pods - there is no kernel module: the driver renders the node's NVML shim.)",
    )
    reset(api, gpu_nodes)
    stale = frozenset(p.metadata.name for p in backend.component_pods(OPERATOR, None, NAMESPACE))
    with OperatorTrace(
        api, NAMESPACE, also=("default",), nodes=tuple(gpu_nodes), stale=stale
    ) as live:
        _start(backend, live)
        _before(core, spec)
        policy = _create_policy(api, core, spec, live)
        _metrics(backend)
        _mig(api, core, spec, live)
        _mig_metrics(backend)
        _bad_mig_config(api, core, live)
        _disable_device_plugin(api, core, spec, policy)
    diagram = getattr(args, "diagram", None)
    if diagram:
        from pathlib import Path

        live.write_diagram(Path(diagram))
    return 0


def _start(backend: Backend, live: OperatorTrace) -> None:
    """The operator's main, on screen: its pod restarted (a rollout restart would do the
    same), it builds the manager, sets up both controllers and starts them."""
    say("restart the gpu-operator pod, to see main: ctrl.NewManager -> "
        "NewClusterPolicyReconciler(mgr).SetupWithManager(mgr) -> mgr.Start")  # fmt: skip
    backend.restart(OPERATOR, namespace=NAMESPACE)
    live.expect({"NewManager", "SetupWithManager", "Start"}, timeout=30)
    ok("the operator's caches synced and its controllers run; nothing to reconcile yet")


def _before(core: client.CoreV1Api, spec: ClusterSpec) -> None:
    table = Table(title="GPU nodes before the ClusterPolicy")
    for col in ("node", "NFD: NVIDIA PCI device", "GPU profile", GPU + " allocatable"):
        table.add_column(col)
    for n in spec.nodes:
        if not n.profile:
            continue
        node = core.read_node(n.name)
        labels = node.metadata.labels or {}
        table.add_row(
            n.name,
            labels.get("feature.node.kubernetes.io/pci-10de.present", "-"),
            labels.get("gpulab.io/gpu-profile", "-"),
            (node.status.allocatable or {}).get(GPU, "0"),
        )
    console.print(table)
    say("no device plugin runs on them yet: kubelet knows no GPU")


def _create_policy(
    api: client.ApiClient, core: client.CoreV1Api, spec: ClusterSpec, live: OperatorTrace
) -> str:
    custom = client.CustomObjectsApi(api)
    body = yaml.safe_load(POLICY_FILE.read_text())
    name = body["metadata"]["name"]
    say(f"create ClusterPolicy {name} ({POLICY_FILE.relative_to(MANIFESTS.parent)}: the Helm "
        "chart's defaults, mig.strategy mixed)")  # fmt: skip
    custom.create_cluster_custom_object(cp.GROUP, cp.VERSION, "clusterpolicies", body)
    want = {n.name: str(len(profiles.load(n.profile).gpus)) for n in spec.nodes if n.profile}

    def ready() -> bool:
        policy = _policy(custom, name) or {}
        advertised = all(_allocatable(core, n).get(GPU) == v for n, v in want.items())
        return (policy.get("status") or {}).get("state") == cp.READY and advertised

    wait_for(ready, READY_TIMEOUT, f"ClusterPolicy {name} ready and the GPUs advertised", 0.5)
    # the operator posts its Events in the background: the table and the tick sum them up
    wait_for(
        lambda: any(
            ev.step == "Reconcile" and ev.note.startswith(f"status.state {cp.READY}")
            for ev in list(live.seen)
        ),
        30,
        "the operator's Reconcile step saying ready",
    )
    console.print(live.state_table(name))
    say(
        "(the chapter's order Driver -> Toolkit -> DevicePlugin -> MIG Manager -> DCGM -> GFD -> "
        "Validator is not v26.7.0's: the table's is, validation right after the toolkit, the "
        "MIG manager after GFD; every pass walks all states, none waits for the one before)"
    )
    ok(f"ClusterPolicy {name}: status.state ready; "
       + ", ".join(f"{n} advertises {GPU}: {v}" for n, v in want.items()))  # fmt: skip
    say("(the chapter: a node is usable only when all components are Ready. Here the GPUs "
        "entered allocatable at the device plugin's Register, once its init container saw the "
        "validator's toolkit-ready marker; dcgm-exporter, GFD and the MIG manager are not "
        "waited for)")  # fmt: skip
    return name


def _metrics(backend: Backend) -> None:
    say("GET /metrics from the nvidia-dcgm-exporter Service (port gpu-metrics)")
    text = backend.service_get(NAMESPACE, "nvidia-dcgm-exporter", "gpu-metrics", "/metrics")
    shown = [
        line
        for line in text.splitlines()
        if line.startswith(
            ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_XID_ERRORS")
        )
        and 'gpu="0"' in line
    ]
    if not shown or 'modelName="' not in shown[0] or 'Hostname="' not in shown[0]:
        raise DemoFailed(f"dcgm-exporter answered without the expected metrics:\n{text[:500]}")
    for line in shown:
        console.print(f"    {line}")
    ok("DCGM field names, one series per GPU, labelled gpu, UUID, modelName, Hostname "
       "(lab: read from NVML through the shim, not from DCGM)")  # fmt: skip


def _mig(
    api: client.ApiClient, core: client.CoreV1Api, spec: ClusterSpec, live: OperatorTrace
) -> None:
    node_spec = next(n for n in spec.nodes if n.name == MIG_NODE)
    text = _generated_config(core)
    names = list(migparted.parse_spec(text).mig_configs)
    say(f"the MIG manager on {MIG_NODE} built its mig-parted config from the GPUs' own MIG "
        f"profiles: ConfigMap {NAMESPACE}/{MIG_NODE_CONFIGMAP}")  # fmt: skip
    console.print(f"    {', '.join(names)}")
    console.print(
        f"    (the operator's {cp.MIG_PARTED_DEFAULT_CONFIGMAP} is only its fallback, for GPUs "
        "NVML lists no MIG profile of)"
    )
    want = expected_mig_devices(node_spec.profile or "", text, MIG_CONFIG)
    keys = (nl.MIG_CONFIG_STATE_LABEL, nl.DEPLOY_PREFIX + "device-plugin")
    labels = NodeLabels(api, MIG_NODE, keys)
    labels.informer.start()
    try:
        wait_for(labels.informer.has_synced, 10, "the node watch")
        mark = labels.mark(nl.MIG_CONFIG_STATE_LABEL)
        say(f"label {MIG_NODE} {nl.MIG_CONFIG_LABEL}={MIG_CONFIG} (what a cluster admin does)")
        core.patch_node(MIG_NODE, {"metadata": {"labels": {nl.MIG_CONFIG_LABEL: MIG_CONFIG}}})
        wait_for(
            lambda: (
                labels.since(nl.MIG_CONFIG_STATE_LABEL, mark)[-1:] == ["success"]
                and all(_allocatable(core, MIG_NODE).get(r) == str(v) for r, v in want.items())
            ),
            READY_TIMEOUT,
            f"{MIG_NODE} to advertise {want}",
            0.5,
        )
        states = labels.since(nl.MIG_CONFIG_STATE_LABEL, mark)
        plugin = labels.since(nl.DEPLOY_PREFIX + "device-plugin", 0)
    finally:
        labels.informer.stop()
    if states != ["pending", "success"] or "paused-for-mig-change" not in plugin:
        raise DemoFailed(
            f"expected pending → success with the plugin paused, saw {states}, {plugin}"
        )
    ok(f"{nl.MIG_CONFIG_STATE_LABEL}: {' → '.join(states)}; the device plugin's deploy label went "
       f"{' → '.join(plugin[-3:])}")  # fmt: skip
    alloc, cap = _allocatable(core, MIG_NODE), _capacity(core, MIG_NODE)
    ok(f"{MIG_NODE} advertises " + ", ".join(f"{r}: {v}" for r, v in want.items())
       + f"; {GPU}: allocatable {alloc.get(GPU, '0')}, capacity {cap.get(GPU, '0')}")  # fmt: skip
    console.print(
        f"    kubelet keeps {GPU} in capacity at 0 allocatable for its endpointStopGracePeriod "
        "(5 min) after the full-GPU plugin went, then drops it"
    )


def _mig_metrics(backend: Backend) -> None:
    """dcgm-exporter on the MIG node (-d f): one row per MIG device, none per GPU. The
    Service balances scrapes over the nodes' exporters; each answer names its Hostname."""
    say(f"GET /metrics from the nvidia-dcgm-exporter Service until {MIG_NODE}'s exporter "
        "answers (restarted after the MIG change)")  # fmt: skip
    host = f'Hostname="{MIG_NODE}"'

    def from_mig_node() -> list[str] | None:
        try:
            text = backend.service_get(NAMESPACE, "nvidia-dcgm-exporter", "gpu-metrics", "/metrics")
        except (httpx.HTTPError, ApiException):
            return None  # no exporter Ready behind the Service yet
        rows = [x for x in text.splitlines() if x.startswith("DCGM_") and host in x]
        return rows if any("GPU_I_ID" in r for r in rows) else None

    rows = wait_for(from_mig_node, READY_TIMEOUT, f"{MIG_NODE}'s dcgm-exporter", 0.5)
    whole = [r for r in rows if "GPU_I_ID" not in r]
    if whole:
        raise DemoFailed(f"{MIG_NODE} has MIG devices but dcgm-exporter reports whole GPUs:\n"
                         + "\n".join(whole[:3]))  # fmt: skip
    for line in [r for r in rows if r.startswith("DCGM_FI_DEV_FB_FREE") and 'gpu="0"' in r]:
        console.print(f"    {line}")
    ok(f"{len(rows)} rows from {MIG_NODE}, every one a MIG device's (GPU_I_PROFILE, GPU_I_ID): "
       "a GPU with MIG devices is seen only through them")  # fmt: skip


def _bad_mig_config(api: client.ApiClient, core: client.CoreV1Api, live: OperatorTrace) -> None:
    before = _allocatable(core, MIG_NODE)
    say(f"label {MIG_NODE} {nl.MIG_CONFIG_LABEL}={BAD_MIG_CONFIG} (no such config in "
        f"{MIG_NODE_CONFIGMAP})")  # fmt: skip
    since = dt.datetime.now(dt.UTC)
    core.patch_node(MIG_NODE, {"metadata": {"labels": {nl.MIG_CONFIG_LABEL: BAD_MIG_CONFIG}}})

    def failure() -> trace.TraceEvent | None:
        return next(
            (
                ev
                for ev in list(live.seen)
                if ev.component == "nvidia-mig-manager" and ev.step == "setState"
                and ev.warning and ev.time >= since - dt.timedelta(seconds=1)
            ),
            None,
        )  # fmt: skip

    ev = wait_for(failure, 60, "the MIG manager's failed state")
    labels = core.read_node(MIG_NODE).metadata.labels or {}
    if labels.get(nl.MIG_CONFIG_STATE_LABEL) != "failed":
        raise DemoFailed(f"{nl.MIG_CONFIG_STATE_LABEL} is {labels.get(nl.MIG_CONFIG_STATE_LABEL)}")
    if (
        labels.get(nl.DEPLOY_PREFIX + "device-plugin") != "true"
        or _allocatable(core, MIG_NODE) != before
    ):
        raise DemoFailed("a failed MIG config changed the node")
    ok(f"{nl.MIG_CONFIG_STATE_LABEL}=failed; the reason is in the Event: {escape(ev.note)}")
    ok("nothing else changed: the clients were never paused and the MIG layout is intact")


def _disable_device_plugin(
    api: client.ApiClient, core: client.CoreV1Api, spec: ClusterSpec, policy: str
) -> None:
    custom = client.CustomObjectsApi(api)
    apps = client.AppsV1Api(api)
    say(f"patch ClusterPolicy {policy}: spec.devicePlugin.enabled false")
    custom.patch_cluster_custom_object(
        cp.GROUP,
        cp.VERSION,
        "clusterpolicies",
        policy,
        {"spec": {"devicePlugin": {"enabled": False}}},
    )

    def gone() -> bool:
        try:
            apps.read_namespaced_daemon_set(DEVICE_PLUGIN_DS, NAMESPACE)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, 60, f"the {DEVICE_PLUGIN_DS} DaemonSet to be deleted", 0.5)
    ok(f"state-device-plugin is disabled: the operator deleted {DEVICE_PLUGIN_DS}")
    gpu_nodes = [n.name for n in spec.nodes if n.profile]

    def no_gpus_allocatable() -> bool:
        return all(
            all(v == "0" for r, v in _allocatable(core, n).items() if r.startswith("nvidia.com/"))
            for n in gpu_nodes
        )

    wait_for(no_gpus_allocatable, 60, "the GPUs to leave allocatable", 0.5)
    for n in gpu_nodes:
        cap = {r: v for r, v in _capacity(core, n).items() if r.startswith("nvidia.com/")}
        ok(f"{n}: every nvidia.com resource at 0 allocatable (capacity {cap} until kubelet's "
           "5-minute endpointStopGracePeriod ends)")  # fmt: skip
    wait_for(
        lambda: ((_policy(custom, policy) or {}).get("status") or {}).get("state") == cp.READY,
        60,
        f"ClusterPolicy {policy} ready again",
    )
    ok(f"ClusterPolicy {policy} is ready again with the device plugin disabled")
