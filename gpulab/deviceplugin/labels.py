"""GPU feature discovery labels for the node, computed from the NVML inventory.

Mirrors NVIDIA k8s-device-plugin ``internal/lm`` (gpu-feature-discovery): ``resource.go``
(``<resource>.product`` / ``.count`` / ``.replicas`` / ``.memory`` / ``.family`` /
``.compute.major`` / ``.compute.minor``), ``nvml.go`` (``nvidia.com/mig.capable``) and
``strategy.go`` (``nvidia.com/mig.strategy``). Pure.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from gpulab.deviceplugin.rm import GPUInfo

PREFIX = "nvidia.com/"


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
    return "undefined"


def gfd_labels(gpus: Sequence[GPUInfo], mig_strategy: str, replicas: int = 1) -> dict[str, str]:
    """The labels GFD would put on a node with ``gpus``; {} when it has none.

    Mixed nodes are labelled after their most common model, as GFD labels one product.
    """
    if not gpus:
        return {}
    model = Counter(g.name for g in gpus).most_common(1)[0][0]
    first = next(g for g in gpus if g.name == model)
    major, minor = first.compute_capability
    product = sanitise(first.name)
    count = len(gpus)
    memory = first.memory_mib
    labels = {
        f"{PREFIX}mig.capable": str(any(g.mig_capable for g in gpus)).lower(),
        f"{PREFIX}mig.strategy": mig_strategy,
    }
    migs = [m for g in gpus if g.mig_enabled for m in g.migs]
    if mig_strategy == "single" and migs:
        product = f"{product}-MIG-{migs[0].profile}"
        count, memory = len(migs), migs[0].memory_mib
    if mig_strategy == "mixed":
        for profile, n in sorted(Counter(m.profile for m in migs).items()):
            labels[f"{PREFIX}mig-{profile}.count"] = str(n)
        count = sum(1 for g in gpus if not g.mig_enabled)
    if replicas > 1:
        product += "-SHARED"
    labels.update(
        {
            f"{PREFIX}gpu.product": product,
            f"{PREFIX}gpu.count": str(count),
            f"{PREFIX}gpu.replicas": str(replicas),
            f"{PREFIX}gpu.memory": str(memory),
            f"{PREFIX}gpu.family": arch_family(major, minor),
            f"{PREFIX}gpu.compute.major": str(major),
            f"{PREFIX}gpu.compute.minor": str(minor),
        }
    )
    return labels
