"""Cluster spec: which simulated nodes, which GPU profile each has, which ports to use.

A spec is a small YAML file (``harness/clusters/*.yaml`` ships a few)::

    name: gpulab                 # cluster name: state dir, kubeconfig context
    ports:                       # all on 127.0.0.1; each must be free
      apiserver: 21443
    nodes:
      - name: gpu-a100           # one node ...
        profile: a100-sxm4-40gb-x8
        labels: {topology.kubernetes.io/zone: zone-a}
      - name: gpu-t4             # ... or `count` nodes gpu-t4-0 .. gpu-t4-(count-1)
        count: 3
        profile: t4-x4
      - name: cpu-only           # no profile: a node without GPUs
        cpu: "16"
    addons: [device-plugin]      # chapters deployed with the cluster (harness/addons)
    kubelet:                     # every GPU node's kubelet (KubeletConfiguration fields)
      topologyManagerPolicy: single-numa-node

With the ``device-plugin`` addon each GPU node gets a device plugin + node agent (kind
runs the DaemonSet instead); a node may set ``devicePlugin: {migStrategy: mixed,
replicas: 4, hami: true}``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpulab.deviceplugin.config import MIG_STRATEGIES
from gpulab.deviceplugin.configmanager import NODE_LABEL as CONFIG_LABEL
from gpulab.fakegpu import profiles
from gpulab.nodeagent.topology import KubeletConfig
from harness.addons import ADDONS
from harness.errors import HarnessError

SPEC_DIR = Path(__file__).resolve().parent / "clusters"

# Every spec's ports lie below 32768, out of Linux's ephemeral range (32768-60999), where
# a client connection of any process could hold one for a moment. Each spec takes its own
# block of 1,000 (tests/unit/test_harness_spec.py checks the shipped specs): 21xxx default,
# 22xxx e2e, 23xxx hami, 24xxx hami-e2e, 25xxx lifecycle test, 26xxx start bench,
# 27xxx device-plugin-e2e, 28xxx plugin-project test, 29xxx external-backend test,
# 11xxx scheduling, 12xxx scheduling-e2e, 13xxx volcano, 14xxx volcano-e2e, 15xxx
# kueue-hami-e2e, 16xxx dashboard-e2e, 17xxx dashboard bench, 18xxx gpu-operator, 19xxx
# gpu-operator-e2e, 20xxx kueue bench, 10xxx hami bench, 30xxx labs (and labs-mig, its own
# ports in the block), 31xxx volcano bench, 9xxx kind-e2e, 5xxx kind-gpu-operator-e2e
# (kind picks its own ports).
DEFAULT_PORTS = {
    "apiserver": 21443,
    "etcd": 21379,
    "etcdPeer": 21380,
    "controllerManager": 21257,
    "scheduler": 21259,
}

# Where every backend puts a GPU node's profile on the node (kind: extraMounts; local: the
# node's rootfs), for the device plugin's init container to render the NVML shim config.
PROFILE_MOUNT = "/etc/fake-gpu/profile.yaml"

# Shifts every port of every spec: a second checkout on the same machine (with its own
# $XDG_STATE_HOME) can then run the same specs beside the first.
PORT_OFFSET_ENV = "GPULAB_PORT_OFFSET"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class DevicePluginConfig:
    mig_strategy: str = "none"
    replicas: int = 1  # time-slicing
    hami: bool = False  # register the GPUs for the HAMi extender


@dataclass(frozen=True)
class NodeSpec:
    name: str
    profile: str | None
    labels: dict[str, str] = field(default_factory=dict)
    cpu: str = "64"
    memory: str = "512Gi"
    pods: str = "110"
    device_plugin: DevicePluginConfig = field(default_factory=DevicePluginConfig)


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    ports: dict[str, int]
    nodes: tuple[NodeSpec, ...]
    path: Path | None = None
    addons: tuple[str, ...] = ()
    # every GPU node's kubelet settings (the Topology Manager and its CPU/memory managers)
    kubelet: KubeletConfig = field(default_factory=KubeletConfig)


# spec key -> (KubeletConfig field, allowed values), as KubeletConfiguration spells them
KUBELET_SETTINGS = {
    "topologyManagerPolicy": (
        "topology_manager_policy",
        ("none", "best-effort", "restricted", "single-numa-node"),
    ),
    "topologyManagerScope": ("topology_manager_scope", ("container", "pod")),
    "cpuManagerPolicy": ("cpu_manager_policy", ("none", "static")),
    "memoryManagerPolicy": ("memory_manager_policy", ("None", "Static")),
}


def _parse_kubelet(raw: Any) -> KubeletConfig:
    if not isinstance(raw, dict):
        raise HarnessError("'kubelet' must be a mapping of KubeletConfiguration settings")
    values = {}
    for key, value in raw.items():
        if key not in KUBELET_SETTINGS:
            raise HarnessError(f"kubelet.{key}: unknown; known: {', '.join(KUBELET_SETTINGS)}")
        attr, allowed = KUBELET_SETTINGS[key]
        if value not in allowed:
            raise HarnessError(f"kubelet.{key}: {value!r} is not one of {', '.join(allowed)}")
        values[attr] = value
    return KubeletConfig(**values)


def port_offset() -> int:
    raw = os.environ.get(PORT_OFFSET_ENV, "0") or "0"
    try:
        offset = int(raw)
    except ValueError:
        raise HarnessError(f"${PORT_OFFSET_ENV}={raw!r} must be an integer") from None
    if not 0 <= offset <= 10000:
        raise HarnessError(f"${PORT_OFFSET_ENV}={offset} must be in 0..10000")
    return offset


def available() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))


def load(name_or_path: str | Path) -> ClusterSpec:
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = SPEC_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise HarnessError(
            f"no cluster spec {str(name_or_path)!r}; use one of {', '.join(available())} "
            "or a path to a spec YAML file"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise HarnessError(f"{path}: not valid YAML{where} ({problem}); fix it") from exc
    try:
        return parse(data, path)
    except HarnessError as exc:
        raise HarnessError(f"cluster spec {path}: {exc}") from None


def parse(data: Any, path: Path | None = None) -> ClusterSpec:
    if not isinstance(data, dict):
        raise HarnessError("a cluster spec must be a mapping with 'name' and 'nodes'")
    _known_keys(data, SPEC_KEYS, "the spec")
    name = str(data.get("name", "gpulab"))
    if not _DNS_LABEL.match(name):
        raise HarnessError(f"cluster name {name!r} must be a DNS label (a-z, 0-9, -)")
    ports = dict(DEFAULT_PORTS)
    for key, value in (data.get("ports") or {}).items():
        if key not in DEFAULT_PORTS:
            raise HarnessError(f"unknown port {key!r}; known: {', '.join(DEFAULT_PORTS)}")
        if not isinstance(value, int) or not 1024 <= value <= 65535:
            raise HarnessError(f"port {key}: {value!r} must be an integer in 1024..65535")
        ports[key] = value
    by_port: dict[int, list[str]] = {}
    for key, value in ports.items():
        by_port.setdefault(value, []).append(key)
    shared = {port: keys for port, keys in by_port.items() if len(keys) > 1}
    if shared:
        port, keys = next(iter(shared.items()))
        raise HarnessError(
            f"ports must all differ: {' and '.join(keys)} are both {port}; give each its own "
            f"port under 'ports' (the defaults: {DEFAULT_PORTS})"
        )
    offset = port_offset()
    if offset:
        ports = {k: v + offset for k, v in ports.items()}
        if max(ports.values()) > 65535:
            raise HarnessError(f"${PORT_OFFSET_ENV}={offset} moves ports past 65535: {ports}")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise HarnessError("'nodes' must be a non-empty list")
    nodes: list[NodeSpec] = []
    for n, raw in enumerate(raw_nodes):
        nodes.extend(_parse_node(raw, n))
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise HarnessError(f"duplicate node name {node.name!r}; node names must be unique")
        seen.add(node.name)
    addons = data.get("addons") or []
    if not isinstance(addons, list) or any(a not in ADDONS for a in addons):
        raise HarnessError(f"'addons' must be a list of: {', '.join(ADDONS)}; got {addons!r}")
    return ClusterSpec(
        name=name,
        ports=ports,
        nodes=tuple(nodes),
        path=path,
        addons=tuple(addons),
        kubelet=_parse_kubelet(data.get("kubelet") or {}),
    )


SPEC_KEYS = ("name", "ports", "nodes", "addons", "kubelet")
NODE_KEYS = ("name", "profile", "count", "labels", "cpu", "memory", "pods", "devicePlugin")


def _known_keys(raw: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    """A misspelt key is an error, not a setting silently left at its default."""
    unknown = [str(k) for k in raw if k not in known]
    if unknown:
        raise HarnessError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(known)}")


def _parse_node(raw: Any, n: int) -> list[NodeSpec]:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise HarnessError(f"nodes[{n}] must be a mapping with a 'name'")
    _known_keys(raw, NODE_KEYS, f"nodes[{n}] ({raw['name']})")
    profile = raw.get("profile")
    if profile is not None:
        try:
            profiles.load(profile)  # a profile with impossible values fails here, not at start
        except profiles.ProfileError as exc:
            raise HarnessError(f"nodes[{n}] ({raw['name']}): {exc}") from None
    labels = raw.get("labels") or {}
    if not isinstance(labels, dict):
        raise HarnessError(f"nodes[{n}].labels must be a mapping")
    count = raw.get("count")
    if count is not None and (not isinstance(count, int) or count < 1):
        raise HarnessError(f"nodes[{n}].count must be a positive integer")
    plugin = _parse_device_plugin(raw.get("devicePlugin") or {}, n)
    names = [raw["name"]] if count is None else [f"{raw['name']}-{i}" for i in range(count)]
    for name in names:
        if not _DNS_LABEL.match(name) or len(name) > 63:
            raise HarnessError(f"node name {name!r} must be a DNS label (a-z, 0-9, -)")
    return [
        NodeSpec(
            name=name,
            profile=profile,
            labels={str(k): str(v) for k, v in labels.items()},
            cpu=str(raw.get("cpu", "64")),
            memory=str(raw.get("memory", "512Gi")),
            pods=str(raw.get("pods", "110")),
            device_plugin=plugin,
        )
        for name in names
    ]


def _parse_device_plugin(raw: Any, n: int) -> DevicePluginConfig:
    if not isinstance(raw, dict):
        raise HarnessError(f"nodes[{n}].devicePlugin must be a mapping")
    unknown = set(raw) - {"migStrategy", "replicas", "hami"}
    if unknown:
        raise HarnessError(f"nodes[{n}].devicePlugin: unknown keys {sorted(unknown)}")
    strategy = raw.get("migStrategy", "none")
    if strategy not in MIG_STRATEGIES:
        raise HarnessError(
            f"nodes[{n}].devicePlugin.migStrategy {strategy!r}: use one of "
            f"{', '.join(MIG_STRATEGIES)}"
        )
    replicas = raw.get("replicas", 1)
    if not isinstance(replicas, int) or replicas < 1:
        raise HarnessError(f"nodes[{n}].devicePlugin.replicas must be a positive integer")
    return DevicePluginConfig(strategy, replicas, bool(raw.get("hami", False)))


# NFD's label for a node with an NVIDIA PCI device (vendor 10de), which the GPU Operator
# selects GPU nodes by; the lab gives it to every node with a GPU profile, as NFD would.
NFD_NVIDIA_LABEL = "feature.node.kubernetes.io/pci-10de.present"
# HAMi's device plugin DaemonSet runs on nodes labelled gpu=on (HAMi's documented label).
HAMI_NODE_LABEL = "gpu"


def device_plugin_config_name(settings: DevicePluginConfig) -> str:
    """The named config (manifests/device-plugin ConfigMap) a node's ``devicePlugin:``
    settings select through the label nvidia.com/device-plugin.config."""
    parts = []
    if settings.mig_strategy != "none":
        parts.append(f"mig-{settings.mig_strategy}")
    if settings.replicas > 1:
        parts.append(f"time-slicing-{settings.replicas}")
    return "-".join(parts) or "default"


def node_labels(node: NodeSpec) -> dict[str, str]:
    """The labels a spec node carries on every backend: the spec's own, the GPU profile,
    NFD's PCI label, and the label that places (and configures) its device plugin: NVIDIA's
    (nvidia.com/gpu.present, nvidia.com/device-plugin.config) or HAMi's (gpu=on)."""
    labels = dict(node.labels)
    if node.profile is not None:
        labels["gpulab.io/gpu-profile"] = profiles.load(node.profile).name
        labels[NFD_NVIDIA_LABEL] = "true"
        if node.device_plugin.hami:
            labels[HAMI_NODE_LABEL] = "on"
        else:
            labels["nvidia.com/gpu.present"] = "true"
            labels[CONFIG_LABEL] = device_plugin_config_name(node.device_plugin)
    return labels


def node_object(node: NodeSpec, static_gpus: bool = True) -> dict[str, Any]:
    """The Node the harness creates for kwok to manage.

    With ``static_gpus`` its capacity carries the profile's GPUs; without, a device plugin
    is expected to advertise them (through the node agent), as on a real node.
    """
    capacity = {"cpu": node.cpu, "memory": node.memory, "pods": node.pods}
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **node_labels(node),
    }
    if node.profile is not None and static_gpus:
        capacity["nvidia.com/gpu"] = str(len(profiles.load(node.profile).gpus))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            # kwok manages nodes carrying this annotation (--manage-nodes-with-annotation-selector)
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }
