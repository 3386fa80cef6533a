"""Resources and devices: what the plugin advertises to kubelet, built from the NVML inventory.

Mirrors NVIDIA k8s-device-plugin v0.20.0 ``internal/rm``: ``device_map.go``
(``NewDeviceMap``: the GPU map, the MIG map of strategies single/mixed with their checks,
``updateDeviceMapWithReplicas``), ``devices.go`` (``Device``, ``AnnotatedID``
``<uuid>::<replica>``), ``nvml_devices.go`` (device paths: ``/dev/nvidia<minor>``; a MIG
device adds its GPU- and compute-instance capability devices under ``/dev/nvidia-caps``),
``internal/mig/mig-dp.go`` (``GetMigCapabilityDevicePaths`` reading
``/proc/driver/nvidia-caps/mig-minors``) and ``rm.go`` ``AddDefaultResourcesToConfig``
(MIG resource names ``nvidia.com/mig-<profile>``). Pure: the inventory comes in as plain
dataclasses (read by :mod:`gpulab.deviceplugin.nvml`), the config from
:mod:`gpulab.deviceplugin.config`.

Upstream keys devices in Go maps, so the order of a resource's devices is random there;
here it is NVML's order (GPU index, then MIG index, then replica).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpulab.deviceplugin.config import MIG_STRATEGIES, Config

GPU_RESOURCE = "nvidia.com/gpu"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
REPLICA_SEPARATOR = "::"  # upstream AnnotatedID: "<uuid>::<replica>"
MIG_MINORS_FILE = "/proc/driver/nvidia-caps/mig-minors"
_CAPS_PROC = "/proc/driver/nvidia/capabilities"
_CAPS_DEV = "/dev/nvidia-caps"


class ResourceError(ValueError):
    """The node's GPUs cannot be advertised as configured (invalid MIG layout ...)."""


@dataclass(frozen=True)
class MigInfo:
    """One MIG device as NVML reports it."""

    index: int  # index under the parent (nvmlDeviceGetMigDeviceHandleByIndex)
    uuid: str
    gi_id: int
    ci_id: int
    profile: str  # "1g.10gb", as go-nvlib names it (slices + rounded GB)
    memory_mib: int
    attributes: Mapping[str, int] = field(default_factory=dict)  # GFD's MIG attribute labels


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
    pci_bus_id: str = ""
    # Per other GPU index: nvmlDeviceGetTopologyCommonAncestor level and NVLink count,
    # what go-gpuallocator scores pairs by.
    topology: Mapping[int, int] = field(default_factory=dict)
    nvlinks: Mapping[int, int] = field(default_factory=dict)
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
    index: str = ""  # upstream's Device.Index: "3" for a GPU, "3:1" for MIG device 1 on GPU 3
    mig: bool = False

    @property
    def aligned_allocation_supported(self) -> bool:
        """Upstream ``Device.AlignedAllocationSupported``: whole GPUs only."""
        return not self.mig


@dataclass(frozen=True)
class ResourceSpec:
    """One extended resource and the devices behind it: one gRPC server and socket each."""

    name: str  # nvidia.com/gpu, nvidia.com/mig-1g.10gb, nvidia.com/gpu.shared
    devices: tuple[Device, ...] = ()

    @property
    def socket_name(self) -> str:
        # Upstream getPluginSocketPath: "nvidia-" + the resource name without its domain.
        return f"nvidia-{self.name.split('/', 1)[1]}.sock"


def mig_profile_name(slices: int, mig_memory_mib: int, total_memory_mib: int) -> str:
    """The MIG profile name of a full-size compute instance (go-nvlib ``getMigMemorySizeGB``).

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


def base_id(device_id: str) -> str:
    """Upstream ``AnnotatedID.GetID``: the UUID a (replica) ID stands for."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def has_annotations(device_id: str) -> bool:
    return REPLICA_SEPARATOR in device_id


_MINOR_LINE = (
    (re.compile(r"^gpu(\d+)/gi(\d+)/ci(\d+)/access (\d+)$"), "{}/gpu{}/mig/gi{}/ci{}/access"),
    (re.compile(r"^gpu(\d+)/gi(\d+)/access (\d+)$"), "{}/gpu{}/mig/gi{}/access"),
    (re.compile(r"^config (\d+)$"), "{}/mig/config"),
    (re.compile(r"^monitor (\d+)$"), "{}/mig/monitor"),
)


def parse_mig_minors(text: str) -> dict[str, str]:
    """Upstream ``GetMigCapabilityDevicePaths``: capability path -> ``/dev/nvidia-caps`` node."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        for pattern, template in _MINOR_LINE:
            m = pattern.match(line.strip())
            if m:
                *parts, minor = m.groups()
                out[template.format(_CAPS_PROC, *parts)] = f"{_CAPS_DEV}/nvidia-cap{minor}"
                break
    return out


def _gpu_device(gpu: GPUInfo) -> Device:
    paths = (f"/dev/nvidia{gpu.minor}",)
    return Device(gpu.uuid, gpu.uuid, gpu.index, paths, gpu.numa_node, index=str(gpu.index))


def _mig_device(gpu: GPUInfo, mig: MigInfo, caps: Mapping[str, str]) -> Device:
    """A MIG device: its parent's device node plus the GI and CI access capabilities."""
    gi_cap = f"{_CAPS_PROC}/gpu{gpu.minor}/mig/gi{mig.gi_id}/access"
    ci_cap = f"{_CAPS_PROC}/gpu{gpu.minor}/mig/gi{mig.gi_id}/ci{mig.ci_id}/access"
    for cap in (gi_cap, ci_cap):
        if cap not in caps:
            raise ResourceError(
                f"missing MIG capability path {cap} in {MIG_MINORS_FILE} (is the driver's "
                "nvidia-caps module loaded? the lab's fake driver writes it per node)"
            )
    paths = (f"/dev/nvidia{gpu.minor}", caps[gi_cap], caps[ci_cap])
    index = f"{gpu.index}:{mig.index}"
    return Device(mig.uuid, mig.uuid, gpu.index, paths, gpu.numa_node, index=index, mig=True)


def _gpu_map(gpus: Sequence[GPUInfo], strategy: str) -> dict[str, list[Device]]:
    """``buildGPUDeviceMap``: whole GPUs; MIG-enabled ones only under strategy none."""
    devices = [_gpu_device(g) for g in gpus if not (g.mig_enabled and strategy != "none")]
    return {GPU_RESOURCE: devices} if devices else {}


def _mig_map(
    gpus: Sequence[GPUInfo], strategy: str, caps: Mapping[str, str]
) -> dict[str, list[Device]]:
    """``buildMigDeviceMap`` + ``assertAllMigDevicesAreValid``."""
    enabled = [g for g in gpus if g.mig_enabled]
    if strategy == "single":
        empty = [g.index for g in enabled if not g.migs]
        if empty:
            raise ResourceError(
                f"invalid MIG configuration: device {empty[0]} has no MIG devices configured "
                "(mig-strategy single needs MIG devices on every MIG-enabled GPU)"
            )
        kinds = sorted({(m.profile, tuple(sorted(m.attributes.items()))) for g in enabled
                        for m in g.migs})  # fmt: skip
        if len(kinds) > 1:
            found = ", ".join(sorted({k[0] for k in kinds}))
            raise ResourceError(
                "invalid MIG configuration: more than one MIG device type present on node "
                f"({found}); mig-strategy single needs one MIG profile on every GPU: use mixed"
            )
    out: dict[str, list[Device]] = {}
    for g in enabled:
        for m in g.migs:
            name = GPU_RESOURCE if strategy == "single" else f"nvidia.com/mig-{m.profile}"
            out.setdefault(name, []).append(_mig_device(g, m, caps))
    return out


def _replicate(
    device_map: Mapping[str, list[Device]], config: Config
) -> dict[str, tuple[Device, ...]]:
    """``updateDeviceMapWithReplicas``: replicate every device of a time-sliced resource,
    under its ``rename`` if one is set."""
    out: dict[str, tuple[Device, ...]] = {}
    for name, devices in device_map.items():
        shared = config.time_slicing.for_resource(name)
        if shared is None:
            out[name] = tuple(devices)
            continue
        out[shared.rename or name] = tuple(
            Device(
                replica_id(d.id, n), d.uuid, d.gpu_index, d.paths, d.numa_node, n, d.index, d.mig
            )
            for d in devices
            for n in range(shared.replicas)
        )
    return out


def build_resources(
    gpus: Sequence[GPUInfo], config: Config, mig_caps: Mapping[str, str] | None = None
) -> list[ResourceSpec]:
    """The resources to advertise for ``gpus`` under ``config`` (``NewDeviceMap``).

    - none: ``nvidia.com/gpu`` = every GPU, MIG-enabled or not;
    - single: ``nvidia.com/gpu`` = every MIG device, all of one type, on a node where every
      GPU has MIG enabled (a node with no MIG-enabled GPU falls back to whole GPUs);
    - mixed: ``nvidia.com/mig-<profile>`` per MIG profile, ``nvidia.com/gpu`` for the GPUs
      with MIG disabled.

    ``mig_caps`` is :func:`parse_mig_minors` of the driver's mig-minors file (MIG only).
    Resources without devices get no plugin (upstream: "No devices found").
    """
    strategy = config.mig_strategy
    if strategy not in MIG_STRATEGIES:
        raise ResourceError(
            f"unknown MIG strategy {strategy!r}; use one of: {', '.join(MIG_STRATEGIES)}"
        )
    device_map = _gpu_map(gpus, strategy)
    if strategy != "none":
        migs = _mig_map(gpus, strategy, mig_caps or {})
        if strategy == "single" and device_map and migs:
            raise ResourceError(
                "all devices on the node must be configured with the same migEnabled value "
                "(mig-strategy single); use --mig-strategy mixed"
            )
        for name, devices in migs.items():
            device_map.setdefault(name, []).extend(devices)
    resources = _replicate(device_map, config)
    order = sorted(resources, key=lambda n: (n != GPU_RESOURCE, n))
    return [ResourceSpec(n, resources[n]) for n in order if resources[n]]
