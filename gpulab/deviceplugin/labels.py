"""GPU feature discovery labels for the node, computed from the NVML inventory and the config.

Mirrors NVIDIA k8s-device-plugin v0.20.0 ``internal/lm`` (gpu-feature-discovery):
``mig-strategy.go`` (``newGPULabelers``: ``nvidia.com/gpu.count`` counts every GPU of the
product, MIG-enabled or not; ``newMigStrategySingleLabeler`` and its ``MIG-INVALID`` labels;
``newMigStrategyMixedLabeler``), ``resource.go`` (``<resource>.product`` / ``.count`` /
``.replicas`` / ``.sharing-strategy`` / ``.memory`` / ``.family`` / ``.compute.*``, the MIG
attribute labels, ``-SHARED`` for a replicated resource that keeps its name),
``strategy.go`` (``nvidia.com/mig.strategy``, absent for ``none``) and ``nvml.go``
(``nvidia.com/mig.capable``, ``nvidia.com/mps.capable``). Pure.

Not produced: the driver/CUDA version, machine-type, ``gpu.mode`` and timestamp labels
(nothing in the lab reads them). Where a node mixes GPU models, upstream's labels come from
whichever model its Go map yields last; here the most common model wins.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence

from gpulab.deviceplugin.config import SHARING_NONE, Config
from gpulab.deviceplugin.rm import GPU_RESOURCE, GPUInfo, MigInfo

Labels = dict[str, str]


def sanitise(name: str) -> str:
    """Upstream ``sanitise``: keep ``[A-Za-z0-9-_. ]``, then spaces become '-'."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", name).split())


def arch_family(major: int, minor: int) -> str:
    """Upstream ``getArchFamily``."""
    families = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}
    if major in families:
        return families[major]
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    if major in (10, 12):
        return "blackwell"
    if major == 13:
        return "rubin"
    return "undefined"


def _base(resource: str, config: Config | None, count: int, *parts: str) -> Labels:
    """``resourceLabeler.baseLabeler``: product, count, replicas, sharing-strategy.

    ``config`` None is upstream's "sharing disabled" (MIG-enabled GPUs' own labels).
    """
    shared = config.time_slicing.for_resource(resource) if config is not None else None
    replicas = 0 if config is None else (shared.replicas if shared else 1)
    strategy = config.sharing_strategy if config is not None and replicas > 1 else SHARING_NONE
    product = "-".join(sanitise(p) for p in parts if p)
    if shared is not None and shared.replicas > 1 and not shared.rename:
        product += "-SHARED"
    return {
        f"{resource}.product": product,
        f"{resource}.count": str(count),
        f"{resource}.replicas": str(replicas),
        f"{resource}.sharing-strategy": strategy,
    }


def _gpu_labels(gpu: GPUInfo, count: int, config: Config | None) -> Labels:
    """``NewGPUResourceLabeler``: base labels, memory and architecture of a whole GPU."""
    labels = _base(GPU_RESOURCE, config, count, gpu.name)
    if gpu.memory_mib:
        labels[f"{GPU_RESOURCE}.memory"] = str(gpu.memory_mib)
    major, minor = gpu.compute_capability
    if major:
        labels[f"{GPU_RESOURCE}.family"] = arch_family(major, minor)
        labels[f"{GPU_RESOURCE}.compute.major"] = str(major)
        labels[f"{GPU_RESOURCE}.compute.minor"] = str(minor)
    return labels


def _mig_labels(resource: str, parent: GPUInfo, mig: MigInfo, count: int, config: Config) -> Labels:
    """``NewMIGResourceLabeler``: ``<model>-MIG-<profile>`` and the MIG device's attributes."""
    labels = _base(resource, config, count, parent.name, "MIG", mig.profile)
    labels.update({f"{resource}.{k}": str(v) for k, v in mig.attributes.items()})
    return labels


def _invalid_single(gpu: GPUInfo) -> Labels:
    """``newInvalidMigStrategyLabeler``: mig-strategy single on a node it does not fit."""
    return {
        f"{GPU_RESOURCE}.product": f"{sanitise(gpu.name)}-MIG-INVALID",
        f"{GPU_RESOURCE}.count": "0",
        f"{GPU_RESOURCE}.replicas": "0",
        f"{GPU_RESOURCE}.sharing-strategy": "",
        f"{GPU_RESOURCE}.memory": "0",
    }


def _full_gpu_labels(gpus: Sequence[GPUInfo], config: Config) -> Labels:
    """``newGPULabelers``: per product, MIG-enabled GPUs without sharing, whole GPUs with it
    (the latter override); the count is every GPU of the product."""
    counts = Counter(g.name for g in gpus)
    # least common first, so the most common product's labels are the ones left standing
    names = sorted(counts, key=lambda n: (counts[n], -min(g.index for g in gpus if g.name == n)))
    labels: Labels = {}
    for name in names:
        enabled = [g for g in gpus if g.name == name and g.mig_enabled]
        if enabled:
            labels.update(_gpu_labels(enabled[-1], counts[name], None))
    for name in names:
        whole = [g for g in gpus if g.name == name and not g.mig_enabled]
        if whole:
            labels.update(_gpu_labels(whole[-1], counts[name], config))
    return labels


def _by_profile(gpus: Sequence[GPUInfo]) -> Mapping[str, tuple[GPUInfo, MigInfo, int]]:
    """MIG devices by profile: (parent, first device, count)."""
    out: dict[str, tuple[GPUInfo, MigInfo, int]] = {}
    for g in gpus:
        for m in g.migs if g.mig_enabled else ():
            parent, first, n = out.get(m.profile, (g, m, 0))
            out[m.profile] = (parent, first, n + 1)
    return out


def _single(gpus: Sequence[GPUInfo], config: Config) -> Labels:
    enabled = [g for g in gpus if g.mig_enabled]
    if not enabled:
        return {}  # no MIG-enabled GPU: same as strategy none
    if any(not g.migs for g in enabled) or len(enabled) != len(gpus):
        return _invalid_single(enabled[0])
    profiles = _by_profile(gpus)
    if len(profiles) != 1:
        return _invalid_single(enabled[0])
    ((parent, mig, n),) = profiles.values()
    return _mig_labels(GPU_RESOURCE, parent, mig, n, config)


def gfd_labels(gpus: Sequence[GPUInfo], config: Config) -> Labels:
    """The labels GFD would put on a node with ``gpus``; {} when it has none."""
    if not gpus:
        return {}
    labels: Labels = {
        "nvidia.com/mig.capable": str(any(g.mig_capable for g in gpus)).lower(),
        "nvidia.com/mps.capable": "false",
    }
    labels.update(_full_gpu_labels(gpus, config))
    strategy = config.mig_strategy
    if strategy == "none":
        return labels
    labels["nvidia.com/mig.strategy"] = strategy
    if strategy == "single":
        labels.update(_single(gpus, config))
    else:
        for profile, (parent, mig, n) in sorted(_by_profile(gpus).items()):
            labels.update(_mig_labels(f"nvidia.com/mig-{profile}", parent, mig, n, config))
    return labels
