"""Addon ``device-plugin``: the NVIDIA device plugin DaemonSet (``manifests/device-plugin/``)
on every node labelled ``nvidia.com/gpu.present=true``, on every backend.

On kind the pods register with the node's real kubelet; on the local backend the pod
runner runs them (harness/podrunner) and each GPU node's node agent plays kubelet's device
manager on the node's device-plugins directory. Either way the node then advertises what
ListAndWatch reports.

Per-node settings follow upstream's per-node config model: a spec node's ``devicePlugin:``
settings select a named config through the node label ``nvidia.com/device-plugin.config``
(harness/spec.py), the ConfigMap ``nvidia-device-plugin-configs`` holds the configs
(upstream's config file format; the spec's combinations the shipped ones lack are added
here), and the DaemonSet's ``config-manager --oneshot`` init container links the selected
one for the plugin's ``--config-file``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kubernetes import client

from gpulab.deviceplugin.config import Config, render, time_slicing
from gpulab.deviceplugin.hami import NodeConfig, plugin_resource
from gpulab.deviceplugin.rm import build_resources, parse_mig_minors
from gpulab.fakegpu import inventory, profiles
from gpulab.fakegpu import render as fakegpu_render
from gpulab.wait import WaitTimeout, wait_for
from harness.apply import FIELD_MANAGER, MANIFESTS, load_documents
from harness.backends import SYSTEM_NAMESPACE, Backend
from harness.errors import HarnessError
from harness.spec import DevicePluginConfig, NodeSpec, device_plugin_config_name

Progress = Callable[[str], None]
CONFIGMAP = "nvidia-device-plugin-configs"
COMPONENT = "gpulab-device-plugin"  # the DaemonSet's app.kubernetes.io/name
ADVERTISE_TIMEOUT = 120.0


# ---------------------------------------------------------------- pure


def plugin_config(settings: DevicePluginConfig) -> Config:
    """What NVIDIA's device plugin runs with on such a node (its config file)."""
    return Config(mig_strategy=settings.mig_strategy, time_slicing=time_slicing(settings.replicas))


def extra_configs(nodes: Iterable[NodeSpec]) -> dict[str, str]:
    """Configs the spec's nodes select that the shipped ConfigMap lacks."""
    shipped = next(
        d
        for d in load_documents([MANIFESTS / "device-plugin"])
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == CONFIGMAP
    )
    have = set(shipped.get("data") or {})
    out = {}
    for node in nodes:
        name = device_plugin_config_name(node.device_plugin)
        if node.profile and not node.device_plugin.hami and name not in have:
            out[name] = render(plugin_config(node.device_plugin))
    return dict(sorted(out.items()))


def expected_resources(node: NodeSpec) -> dict[str, int]:
    """What the node should advertise once its plugin has registered: the device plugin's
    own resource builder over what NVML will report for the node's profile (pure)."""
    if not node.profile:
        return {}
    profile = profiles.load(node.profile)
    gpus = inventory.gpu_infos(profile, node.name)
    if node.device_plugin.hami:  # HAMi's plugin: deviceSplitCount IDs per GPU, in any mode
        resources = [plugin_resource(gpus, NodeConfig())]
    else:
        resources = build_resources(
            gpus,
            plugin_config(node.device_plugin),
            parse_mig_minors(fakegpu_render.mig_minors(profile)),
        )
    return {r.name: len(r.devices) for r in resources}


# ---------------------------------------------------------------- deploy


def plugin_nodes(backend: Backend) -> list[NodeSpec]:
    """The GPU nodes this DaemonSet runs on (HAMi's device plugin has the others)."""
    return [n for n in backend.spec.nodes if n.profile and not n.device_plugin.hami]


def deploy(backend: Backend, progress: Progress) -> None:
    """Deploy the DaemonSet (and the spec's per-node configs)."""
    extra = extra_configs(plugin_nodes(backend))
    if extra:
        # server-side apply under its own field manager: re-applying the shipped
        # ConfigMap keeps these keys (each key of `data` has its own owner)
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP, "namespace": SYSTEM_NAMESPACE},
            "data": extra,
        }
        client.CoreV1Api(backend.api()).patch_namespaced_config_map(
            CONFIGMAP,
            SYSTEM_NAMESPACE,
            body,
            field_manager=f"{FIELD_MANAGER}-spec",
            force=True,
            _content_type="application/apply-patch+yaml",
        )
    backend.apply([MANIFESTS / "device-plugin"], progress)


def wait(backend: Backend, progress: Progress) -> None:
    """Until every node with the DaemonSet advertises its devices."""
    wait_advertised(backend, plugin_nodes(backend), progress)


def wait_advertised(
    backend: Backend, nodes: list[NodeSpec], progress: Progress, component: str = COMPONENT
) -> None:
    """Until every node's allocatable is what its plugin reports (ListAndWatch → kubelet)."""
    core = client.CoreV1Api(backend.api())
    pending = {n.name: expected_resources(n) for n in nodes}
    progress(f"{component} DaemonSet applied; waiting for {len(nodes)} nodes to advertise GPUs")

    def advertised() -> bool:
        for name, resources in list(pending.items()):
            alloc = core.read_node(name).status.allocatable or {}
            if all(alloc.get(r) == str(v) for r, v in resources.items()):
                del pending[name]
        return not pending

    try:
        wait_for(advertised, ADVERTISE_TIMEOUT, "the nodes to advertise their GPUs", 0.25)
    except WaitTimeout:
        name = next(iter(pending))
        pods = backend.component_pods(component, name)
        state = _pod_state(pods[0]) if pods else "no device-plugin pod on it"
        raise HarnessError(
            f"node {name} does not advertise {pending[name]} after {ADVERTISE_TIMEOUT:g}s "
            f"({state}); see `gpulab kubectl -n {SYSTEM_NAMESPACE} logs "
            f"-l app.kubernetes.io/name={component} --all-containers`"
        ) from None
    progress(f"device plugins registered: {len(nodes)} nodes advertise their GPUs")


def _pod_state(pod: client.V1Pod) -> str:
    statuses = (pod.status.init_container_statuses or []) + (pod.status.container_statuses or [])
    for s in statuses:
        waiting = s.state.waiting if s.state else None
        if waiting is not None and waiting.reason not in (None, "PodInitializing"):
            return f"pod {pod.metadata.name}: {s.name} {waiting.reason} {waiting.message or ''}"
    return f"pod {pod.metadata.name} is {pod.status.phase}"
