"""Profile -> NVML shim: renders a profile for one node into the line-based file that
``fake-gpu/build/libnvidia-ml.so.1`` reads at nvmlInit (format: fake-gpu/README.md).

The numbers NVML reports but a profile does not carry (PCI IDs, NVLink count, brand,
MIG GPU-instance profile IDs) are filled in here from what the real boards report.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpulab.fakegpu.paths import CONFIG_NAME, MIG_MINORS_NAME
from gpulab.fakegpu.profiles import GPU, GPUModel, MigProfile, Profile, gpu_uuid, mig_uuid

FORMAT_VERSION = 1
CPUS_PER_NUMA_NODE = 32  # each NUMA node owns CPUs [n*32, n*32+31] (nvmlDeviceGetCpuAffinity)

# nvmlDeviceArchitecture_t and nvmlBrandType_t values
_ARCHITECTURES = {"volta": 5, "turing": 6, "ampere": 7, "ada": 8, "hopper": 9}
BRAND_TESLA = 2
BRAND_NVIDIA = 14


@dataclass(frozen=True)
class Board:
    """What NVML reports about a board beyond the profile: PCI IDs, NVLinks, brand."""

    pci_device_id: int  # (device << 16) | vendor 0x10DE
    pci_subsystem_id: int
    nvlinks: int
    brand: int
    sms_per_slice: int  # multiprocessors per MIG compute slice


BOARDS: dict[str, Board] = {
    "NVIDIA A100-SXM4-40GB": Board(0x20B010DE, 0x134F10DE, 12, BRAND_NVIDIA, 14),
    "NVIDIA A100-SXM4-80GB": Board(0x20B210DE, 0x147F10DE, 12, BRAND_NVIDIA, 14),
    "NVIDIA H100 80GB HBM3": Board(0x233010DE, 0x16C110DE, 18, BRAND_NVIDIA, 16),
    "Tesla T4": Board(0x1EB810DE, 0x12A210DE, 0, BRAND_TESLA, 0),
}

# nvmlGpuInstanceProfile enum value and the GI profile ID nvidia-smi shows, by slices;
# the "double memory" 1-slice profile (1g.10gb on a 40 GB A100) is PROFILE_1_SLICE_REV2.
_GI_ENUM_BY_SLICES = {1: (0, 19), 2: (1, 14), 3: (2, 9), 4: (3, 5), 7: (4, 0)}
_GI_1_SLICE_REV2 = (9, 15)


def gi_profile_ids(model: GPUModel, profile: MigProfile) -> tuple[int, int]:
    """(NVML_GPU_INSTANCE_PROFILE_* enum, GI profile ID) of a MIG profile on a model."""
    if profile.slices == 1:
        smallest = min(p.memory_mib for p in model.mig_profiles if p.slices == 1)
        if profile.memory_mib > smallest:
            return _GI_1_SLICE_REV2
    return _GI_ENUM_BY_SLICES[profile.slices]


def _serial(node: str, index: int) -> str:
    digest = uuid.uuid5(uuid.NAMESPACE_OID, f"{node}/{index}").int
    return f"156{digest % 10**10:010d}"


def _gpu_lines(node: str, gpu: GPU) -> list[str]:
    model = gpu.model
    board = BOARDS[model.name]
    first_cpu = gpu.numa_node * CPUS_PER_NUMA_NODE
    p = f"gpu.{gpu.index}."
    lines = [
        f"{p}name={model.name}",
        f"{p}uuid={gpu_uuid(node, gpu.index)}",
        f"{p}serial={_serial(node, gpu.index)}",
        f"{p}pci_bus_id={gpu.pci_bus_id}",
        f"{p}pci_device_id=0x{board.pci_device_id:08X}",
        f"{p}pci_subsystem_id=0x{board.pci_subsystem_id:08X}",
        f"{p}memory_mib={model.memory_mib}",
        f"{p}compute_capability={model.compute_capability[0]}.{model.compute_capability[1]}",
        f"{p}architecture={_ARCHITECTURES[model.architecture]}",
        f"{p}brand={board.brand}",
        f"{p}numa_node={gpu.numa_node}",
        f"{p}cpus={first_cpu}-{first_cpu + CPUS_PER_NUMA_NODE - 1}",
        f"{p}nvlinks={board.nvlinks}",
        f"{p}nvlink_peers={','.join(str(x) for x in gpu.nvlink_peers)}",
        f"{p}mig_capable={int(model.mig_capable)}",
        f"{p}mig_mode={int(gpu.mig_enabled)}",
    ]
    for mp in model.mig_profiles:
        enum, gi_id = gi_profile_ids(model, mp)
        sms = board.sms_per_slice * mp.slices
        lines.append(
            f"{p}gi_profile.{enum}={gi_id},{mp.slices},{mp.max_count},{sms},"
            f"{mp.memory_mib},{mp.name}"
        )
    lines.append(f"{p}mig_count={len(gpu.mig_instances)}")
    for j, mp in enumerate(gpu.mig_instances):
        enum, _ = gi_profile_ids(model, mp)
        # GPU instance IDs count from 1 in listing order; one compute instance (ID 0) each
        lines.append(f"{p}mig.{j}={mig_uuid(node, gpu.index, j)},{enum},{j + 1},0")
    return lines


def render(profile: Profile, node: str, state_dir: Path | None = None) -> str:
    """The shim config for ``node`` running ``profile``; ``state_dir`` holds faults.log."""
    cuda_major = profile.cuda_driver_version // 1000
    lines = [
        f"# fake-gpu NVML shim config: profile {profile.name} on node {node}",
        "# written by `gpulab fake-gpu render`; format in fake-gpu/README.md",
        f"version={FORMAT_VERSION}",
        f"node={node}",
        f"profile={profile.name}",
        f"driver_version={profile.driver_version}",
        f"nvml_version={cuda_major}.{profile.driver_version}",
        f"cuda_driver_version={profile.cuda_driver_version}",
    ]
    if state_dir is not None:
        lines.append(f"state_dir={Path(state_dir).resolve()}")
    lines.append(f"gpu_count={len(profile.gpus)}")
    for gpu in profile.gpus:
        lines.extend(_gpu_lines(node, gpu))
    return "\n".join(lines) + "\n"


# The driver's /proc/driver/nvidia-caps/mig-minors layout: config, monitor, then per GPU
# minor 15 GPU-instance slots of one access file plus 8 compute-instance access files.
_MIG_GI_SLOTS, _MIG_CI_SLOTS, _MIG_FIRST = 15, 8, 3


def mig_minors(profile: Profile) -> str:
    """What the NVIDIA driver writes to /proc/driver/nvidia-caps/mig-minors on this board
    (the device plugin maps MIG devices to /dev/nvidia-caps/nvidia-cap<N> with it)."""
    lines = ["config 1", "monitor 2"]
    per_gi = 1 + _MIG_CI_SLOTS
    for gpu in profile.gpus:
        if not gpu.model.mig_capable:
            continue
        base = _MIG_FIRST + gpu.index * _MIG_GI_SLOTS * per_gi
        for gi in range(_MIG_GI_SLOTS):
            lines.append(f"gpu{gpu.index}/gi{gi}/access {base + gi * per_gi}")
            lines += [
                f"gpu{gpu.index}/gi{gi}/ci{ci}/access {base + gi * per_gi + 1 + ci}"
                for ci in range(_MIG_CI_SLOTS)
            ]
    return "\n".join(lines) + "\n"


# The character devices the NVIDIA driver creates: /dev/nvidia<minor> and its control
# nodes on major 195; nvidia-uvm and nvidia-caps get dynamic majors (these are typical).
NVIDIA_MAJOR, UVM_MAJOR, CAPS_MAJOR = 195, 510, 511


def device_nodes(profile: Profile) -> list[tuple[str, int, int]]:
    """(path, major, minor) of every device node the driver makes for this board: where a
    real kubelet runs (kind), the lab's fake driver creates them on the node, so the device
    specs a plugin returns (HAMi's always, NVIDIA's with --pass-device-specs) exist."""
    nodes = [(f"/dev/nvidia{gpu.index}", NVIDIA_MAJOR, gpu.index) for gpu in profile.gpus]
    nodes += [
        ("/dev/nvidiactl", NVIDIA_MAJOR, 255),
        ("/dev/nvidia-modeset", NVIDIA_MAJOR, 254),
        ("/dev/nvidia-uvm", UVM_MAJOR, 0),
        ("/dev/nvidia-uvm-tools", UVM_MAJOR, 1),
    ]
    for line in mig_minors(profile).splitlines():
        name, minor = line.rsplit(" ", 1)
        if "/" in name:
            nodes.append((f"/dev/nvidia-caps/nvidia-cap{minor}", CAPS_MAJOR, int(minor)))
    return nodes


def write(profile: Profile, node: str, path: Path, state_dir: Path | None = None) -> Path:
    """Render to ``path`` atomically, so a shim starting meanwhile never reads half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(render(profile, node, state_dir))
        os.chmod(tmp, 0o644)  # mkstemp makes it private; consumers may run as other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_node(profile: Profile, node: str, node_dir: Path, config: Path | None = None) -> Path:
    """Everything the fake driver provides on a node: the shim's config (at ``config``,
    default ``<node_dir>/config``) and ``<node_dir>/mig-minors``. Returns the config path."""
    node_dir = Path(node_dir)
    node_dir.mkdir(parents=True, exist_ok=True)
    path = write(profile, node, config or node_dir / CONFIG_NAME, state_dir=node_dir)
    (node_dir / MIG_MINORS_NAME).write_text(mig_minors(profile))
    return path
