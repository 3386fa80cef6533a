"""GPU profiles: the YAML files in ``fake-gpu/profiles/`` that describe a node's GPUs.

A profile is behaviour as data (cf. kwok stages): the NVML shim, the cluster spec
(node capacity) and the device plugin all read the same file, so a node that says
``profile: a100-sxm4-40gb-x8`` has the same GPUs everywhere.

Format::

    description: DGX A100 (8x A100-SXM4-40GB, NVSwitch, 2 NUMA nodes)
    driverVersion: "550.54.15"
    cudaDriverVersion: 12040          # as nvmlSystemGetCudaDriverVersion returns it
    nvlink: all                       # all | none | [[0, 1], [2, 3]]
    gpus:
      - model: A100-SXM4-40GB         # a key of MODELS below
        count: 8
        numa: [0, 0, 0, 0, 1, 1, 1, 1] # one per GPU, or a single int for all
        mig: [3g.20gb, 2g.10gb, 1g.5gb] # optional: MIG enabled with these instances

UUIDs are not in the file: they are derived from (node name, GPU index) by
:func:`gpu_uuid` so tests can assert exact values.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpulab.errors import UserError

PROFILE_DIR = Path(__file__).resolve().parents[2] / "fake-gpu" / "profiles"

# Namespace for uuid5 so a GPU's UUID depends only on (node, index).
_UUID_NAMESPACE = uuid.UUID("6f1c1b7e-3d6a-4c59-9a55-2f0b8e6f4a10")


class ProfileError(UserError, ValueError):
    """A profile is missing or malformed; the message names the file and the fix."""


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile as NVML reports it (nvmlDeviceGetGpuInstanceProfileInfo)."""

    name: str  # e.g. "1g.5gb"
    slices: int  # compute slices (the "1g" part)
    memory_mib: int
    max_count: int  # how many instances of this profile fit on an empty GPU


@dataclass(frozen=True)
class GPUModel:
    name: str  # what nvmlDeviceGetName returns
    memory_mib: int
    compute_capability: tuple[int, int]
    architecture: str  # ampere | hopper | turing ...
    mig_profiles: tuple[MigProfile, ...] = ()

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def mig_profile(self, name: str) -> MigProfile:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.mig_profiles) or "none (not MIG capable)"
        raise ProfileError(f"{self.name} has no MIG profile {name!r}; known: {known}")


# Real numbers from NVIDIA's MIG user guide / nvidia-smi output of these boards.
MODELS: dict[str, GPUModel] = {
    "A100-SXM4-40GB": GPUModel(
        "NVIDIA A100-SXM4-40GB",
        40960,
        (8, 0),
        "ampere",
        (
            MigProfile("1g.5gb", 1, 4864, 7),
            MigProfile("1g.10gb", 1, 9856, 4),
            MigProfile("2g.10gb", 2, 9856, 3),
            MigProfile("3g.20gb", 3, 19968, 2),
            MigProfile("4g.20gb", 4, 19968, 1),
            MigProfile("7g.40gb", 7, 40192, 1),
        ),
    ),
    "A100-SXM4-80GB": GPUModel(
        "NVIDIA A100-SXM4-80GB",
        81920,
        (8, 0),
        "ampere",
        (
            MigProfile("1g.10gb", 1, 9728, 7),
            MigProfile("1g.20gb", 1, 19968, 4),
            MigProfile("2g.20gb", 2, 19968, 3),
            MigProfile("3g.40gb", 3, 40192, 2),
            MigProfile("4g.40gb", 4, 40192, 1),
            MigProfile("7g.80gb", 7, 80384, 1),
        ),
    ),
    "H100-80GB-HBM3": GPUModel(
        "NVIDIA H100 80GB HBM3",
        81559,
        (9, 0),
        "hopper",
        (
            MigProfile("1g.10gb", 1, 9984, 7),
            MigProfile("1g.20gb", 1, 19968, 4),
            MigProfile("2g.20gb", 2, 19968, 3),
            MigProfile("3g.40gb", 3, 40192, 2),
            MigProfile("4g.40gb", 4, 40192, 1),
            MigProfile("7g.80gb", 7, 80384, 1),
        ),
    ),
    "T4": GPUModel("Tesla T4", 15360, (7, 5), "turing"),
}

# PCI bus numbers of a DGX-style 8-GPU board; beyond 8 GPUs we count on.
_BUS_NUMBERS = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


@dataclass(frozen=True)
class GPU:
    index: int
    model: GPUModel
    numa_node: int
    pci_bus_id: str  # "00000000:07:00.0", as nvmlDeviceGetPciInfo's busId
    nvlink_peers: tuple[int, ...]
    mig_instances: tuple[MigProfile, ...] = ()

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig_instances)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    driver_version: str
    cuda_driver_version: int
    gpus: tuple[GPU, ...] = field(default_factory=tuple)
    path: Path | None = None


def gpu_uuid(node: str, index: int) -> str:
    """The UUID the shim reports for GPU ``index`` on ``node`` (stable across runs)."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


def mig_uuid(node: str, gpu_index: int, mig_index: int) -> str:
    return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{gpu_index}/mig/{mig_index}')}"


def available() -> list[str]:
    """Names of the shipped profiles (file stems in fake-gpu/profiles)."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def resolve(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    candidate = PROFILE_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    raise ProfileError(
        f"unknown GPU profile {str(name_or_path)!r}; use one of: {', '.join(available())} "
        f"or a path to a profile YAML file"
    )


def load(name_or_path: str | Path) -> Profile:
    """Load and validate a profile by shipped name or file path."""
    path = resolve(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(
            f"{path}: not valid YAML ({exc.__class__.__name__}); fix the file"
        ) from exc
    try:
        return parse(data, name=path.stem, path=path)
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from None


def parse(data: Any, name: str, path: Path | None = None) -> Profile:
    if not isinstance(data, dict):
        raise ProfileError("a profile must be a mapping with a 'gpus' list")
    _known_keys(data, PROFILE_KEYS, "the profile")
    groups = data.get("gpus")
    if not isinstance(groups, list) or not groups:
        raise ProfileError("'gpus' must be a non-empty list of {model, count, ...} groups")
    gpus: list[GPU] = []
    for n, group in enumerate(groups):
        gpus.extend(_parse_group(group, n, start=len(gpus)))
    peers = _parse_nvlink(data.get("nvlink", "none"), len(gpus))
    gpus = [
        GPU(g.index, g.model, g.numa_node, g.pci_bus_id, peers[g.index], g.mig_instances)
        for g in gpus
    ]
    cuda = data.get("cudaDriverVersion", 12040)
    if not isinstance(cuda, int) or cuda <= 0:
        raise ProfileError("'cudaDriverVersion' must be a positive integer such as 12040")
    return Profile(
        name=name,
        description=str(data.get("description", "")),
        driver_version=str(data.get("driverVersion", "550.54.15")),
        cuda_driver_version=cuda,
        gpus=tuple(gpus),
        path=path,
    )


PROFILE_KEYS = ("description", "driverVersion", "cudaDriverVersion", "gpus", "nvlink")
GROUP_KEYS = ("model", "count", "numa", "mig")
COMPUTE_SLICES = 7
MEMORY_SLICES = 8


def _known_keys(raw: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    unknown = [str(k) for k in raw if k not in known]
    if unknown:
        raise ProfileError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(known)}")


def _check_mig_fits(instances: tuple[MigProfile, ...], model: GPUModel, where: str) -> None:
    """The layout fits one GPU: each profile at most its instance count, at most 7 compute
    and 8 memory slices in all (the rules gpulab/gpuoperator/migparted.py checks)."""
    counts: dict[str, int] = {}
    for mp in instances:
        counts[mp.name] = counts.get(mp.name, 0) + 1
        if counts[mp.name] > mp.max_count:
            raise ProfileError(f"{where}: a {model.name} holds at most {mp.max_count} x {mp.name}")
    compute = sum(mp.slices for mp in instances)
    memory = sum(
        max(1, min(MEMORY_SLICES, round(mp.memory_mib * MEMORY_SLICES / model.memory_mib)))
        for mp in instances
    )
    for used, limit, what in (
        (compute, COMPUTE_SLICES, "compute"),
        (memory, MEMORY_SLICES, "memory"),
    ):
        if used > limit:
            raise ProfileError(
                f"{where}: {', '.join(mp.name for mp in instances)} needs {used} {what} "
                f"slices; a {model.name} has {limit}"
            )


def _parse_group(group: Any, n: int, start: int) -> list[GPU]:
    if not isinstance(group, dict):
        raise ProfileError(f"gpus[{n}] must be a mapping")
    # memory, SMs and the rest come from the model: a group sets only these
    _known_keys(group, GROUP_KEYS, f"gpus[{n}]")
    model_key = group.get("model")
    if model_key not in MODELS:
        raise ProfileError(f"gpus[{n}].model {model_key!r} is unknown; known: {', '.join(MODELS)}")
    model = MODELS[model_key]
    count = group.get("count", 1)
    if not isinstance(count, int) or count < 1:
        raise ProfileError(f"gpus[{n}].count must be a positive integer")
    numa = group.get("numa", 0)
    numa_list = [numa] * count if isinstance(numa, int) else numa
    if (
        not isinstance(numa_list, list)
        or len(numa_list) != count
        or not all(isinstance(x, int) and x >= 0 for x in numa_list)
    ):
        raise ProfileError(f"gpus[{n}].numa must be an int or a list of {count} ints >= 0")
    mig_names = group.get("mig", [])
    if not isinstance(mig_names, list):
        raise ProfileError(f"gpus[{n}].mig must be a list of MIG profile names like 1g.5gb")
    instances = tuple(model.mig_profile(str(m)) for m in mig_names)
    _check_mig_fits(instances, model, f"gpus[{n}].mig")
    gpus = []
    for i in range(count):
        index = start + i
        bus = _BUS_NUMBERS[index] if index < len(_BUS_NUMBERS) else 0xC0 + index
        gpus.append(GPU(index, model, numa_list[i], f"00000000:{bus:02X}:00.0", (), instances))
    return gpus


def _parse_nvlink(spec: Any, count: int) -> list[tuple[int, ...]]:
    if spec == "none":
        return [() for _ in range(count)]
    if spec == "all":
        return [tuple(j for j in range(count) if j != i) for i in range(count)]
    if not isinstance(spec, list):
        raise ProfileError("'nvlink' must be 'all', 'none' or a list of [a, b] GPU index pairs")
    peers: list[set[int]] = [set() for _ in range(count)]
    for pair in spec:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(x, int) and 0 <= x < count for x in pair)
            or pair[0] == pair[1]
        ):
            raise ProfileError(
                f"nvlink pair {pair!r} must name two different GPU indexes < {count}"
            )
        peers[pair[0]].add(pair[1])
        peers[pair[1]].add(pair[0])
    return [tuple(sorted(p)) for p in peers]
