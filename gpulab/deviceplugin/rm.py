"""Resources and devices: what the plugin advertises to kubelet, built from the NVML inventory.

Mirrors NVIDIA k8s-device-plugin ``internal/rm`` (``devices.go``: Device, AnnotatedID;
``nvml_devices.go`` / ``rm.go``: one ResourceManager per resource) and the MIG strategies of
``cmd/nvidia-device-plugin/mig-strategy.go`` (none | single | mixed). Pure: the inventory
comes in as plain dataclasses (read by :mod:`gpulab.deviceplugin.nvml`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

GPU_RESOURCE = "nvidia.com/gpu"
MIG_STRATEGIES = ("none", "single", "mixed")
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# Upstream AnnotatedID separator: "<uuid>::<replica>".
REPLICA_SEPARATOR = "::"


class ResourceError(ValueError):
    """The node's GPUs cannot be advertised as asked (bad strategy, inconsistent MIG layout)."""


@dataclass(frozen=True)
class MigInfo:
    """One MIG device as NVML reports it."""

    index: int  # index under the parent (nvmlDeviceGetMigDeviceHandleByIndex)
    uuid: str
    gi_id: int
    ci_id: int
    profile: str  # "1g.10gb", as upstream names it (slices + rounded GB)
    memory_mib: int


@dataclass(frozen=True)
class GPUInfo:
    """One physical GPU as NVML reports it."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    compute_capability: tuple[int, int]
    minor: int  # /dev/nvidia<minor>
    numa_node: int | None
    nvlink_peers: tuple[int, ...] = ()
    mig_capable: bool = False
    mig_enabled: bool = False
    migs: tuple[MigInfo, ...] = ()


@dataclass(frozen=True)
class Device:
    """One device ID the plugin advertises (a GPU, a MIG device, or one replica of either)."""

    id: str
    uuid: str  # the physical GPU or MIG UUID the ID stands for
    gpu_index: int  # the physical GPU (the parent of a MIG device)
    paths: tuple[str, ...]  # host device nodes
    numa_node: int | None
    replica: int | None = None


@dataclass(frozen=True)
class ResourceSpec:
    """One extended resource and the devices behind it: one gRPC server and socket each."""

    name: str  # nvidia.com/gpu, nvidia.com/mig-1g.10gb
    devices: tuple[Device, ...] = field(default_factory=tuple)

    @property
    def socket_name(self) -> str:
        # Upstream: "nvidia-" + the resource name without its domain.
        return f"nvidia-{self.name.split('/', 1)[1]}.sock"


def mig_profile_name(slices: int, mig_memory_mib: int, total_memory_mib: int) -> str:
    """The MIG profile name upstream derives (go-nvlib ``getMigMemorySizeGB``).

    The memory is rounded up to eighths of the whole GPU, then scaled to the GPU's size in
    whole GB, so a 9728 MiB slice of an 80 GB A100 is "10gb" and 80384 MiB is "80gb".
    """
    fraction = mig_memory_mib / total_memory_mib
    eighths = -(-round(fraction * 8 * 1_000_000) // 1_000_000)  # ceil, immune to fp dust
    total_gb = -(-total_memory_mib // 1024)
    gb = int(eighths / 8 * total_gb + 0.5)
    return f"{slices}g.{gb}gb"


def replica_id(uuid: str, replica: int) -> str:
    return f"{uuid}{REPLICA_SEPARATOR}{replica}"


def _gpu_paths(gpu: GPUInfo) -> tuple[str, ...]:
    return (f"/dev/nvidia{gpu.minor}",)


def _whole_gpu(gpu: GPUInfo) -> Device:
    return Device(gpu.uuid, gpu.uuid, gpu.index, _gpu_paths(gpu), gpu.numa_node)


def _mig_device(gpu: GPUInfo, mig: MigInfo) -> Device:
    # A MIG device is reached through its parent's device node (MIG capability files
    # under /dev/nvidia-caps are not simulated).
    return Device(mig.uuid, mig.uuid, gpu.index, _gpu_paths(gpu), gpu.numa_node)


def _replicate(devices: Sequence[Device], replicas: int) -> tuple[Device, ...]:
    if replicas <= 1:
        return tuple(devices)
    return tuple(
        Device(replica_id(d.uuid, n), d.uuid, d.gpu_index, d.paths, d.numa_node, n)
        for d in devices
        for n in range(replicas)
    )


def build_resources(
    gpus: Sequence[GPUInfo], strategy: str = "none", replicas: int = 1
) -> list[ResourceSpec]:
    """The resources to advertise for ``gpus`` under a MIG strategy and time-slicing replicas.

    - none: ``nvidia.com/gpu`` = every GPU, MIG or not;
    - single: ``nvidia.com/gpu`` = every MIG device; all GPUs must have MIG enabled with
      one and the same profile (falls back to whole GPUs when no GPU has MIG enabled);
    - mixed: ``nvidia.com/mig-<profile>`` per MIG profile, ``nvidia.com/gpu`` for the GPUs
      with MIG disabled.
    """
    if strategy not in MIG_STRATEGIES:
        raise ResourceError(
            f"unknown MIG strategy {strategy!r}; use one of: {', '.join(MIG_STRATEGIES)}"
        )
    if replicas < 1:
        raise ResourceError(f"replicas must be >= 1, got {replicas}")
    if strategy == "none":
        specs = [ResourceSpec(GPU_RESOURCE, tuple(_whole_gpu(g) for g in gpus))]
    elif strategy == "single":
        specs = [ResourceSpec(GPU_RESOURCE, _single_strategy_devices(gpus))]
    else:
        specs = _mixed_strategy(gpus)
    return [ResourceSpec(s.name, _replicate(s.devices, replicas)) for s in specs if s.devices]


def _single_strategy_devices(gpus: Sequence[GPUInfo]) -> tuple[Device, ...]:
    enabled = [g for g in gpus if g.mig_enabled]
    if not enabled:
        return tuple(_whole_gpu(g) for g in gpus)
    if len(enabled) != len(gpus):
        off = ", ".join(str(g.index) for g in gpus if not g.mig_enabled)
        raise ResourceError(
            f"mig-strategy single needs MIG enabled on every GPU; GPU(s) {off} have it "
            "disabled (use --mig-strategy mixed)"
        )
    profiles = sorted({m.profile for g in gpus for m in g.migs})
    if len(profiles) != 1:
        raise ResourceError(
            "mig-strategy single needs one MIG profile on every GPU; this node has "
            f"{', '.join(profiles) or 'no MIG devices'} (use --mig-strategy mixed)"
        )
    return tuple(_mig_device(g, m) for g in gpus for m in g.migs)


def _mixed_strategy(gpus: Sequence[GPUInfo]) -> list[ResourceSpec]:
    by_profile: dict[str, list[Device]] = {}
    for g in gpus:
        for m in g.migs if g.mig_enabled else ():
            by_profile.setdefault(m.profile, []).append(_mig_device(g, m))
    whole = tuple(_whole_gpu(g) for g in gpus if not g.mig_enabled)
    specs = [ResourceSpec(GPU_RESOURCE, whole)]
    specs += [ResourceSpec(f"nvidia.com/mig-{p}", tuple(d)) for p, d in sorted(by_profile.items())]
    return specs
