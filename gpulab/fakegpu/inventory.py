"""What NVML reports for a profile on a node, as the device plugin's inventory, without NVML.

:func:`gpu_infos` is the read of :func:`gpulab.deviceplugin.nvml.read_inventory` through
the shim, computed from the profile: the harness predicts what a node will advertise by
feeding it to the device plugin's own resource builder. A component test holds the two
equal for every shipped profile, so the prediction cannot drift from the shim.
"""

from __future__ import annotations

from gpulab.deviceplugin.rm import GPUInfo, MigInfo, mig_profile_name
from gpulab.fakegpu.profiles import GPU, Profile, gpu_uuid, mig_uuid
from gpulab.fakegpu.render import BOARDS

# nvmlGpuTopologyLevel_t, as the shim answers nvmlDeviceGetTopologyCommonAncestor
TOPOLOGY_NODE, TOPOLOGY_SYSTEM = 40, 50


def nvlink_counts(profile: Profile) -> dict[int, dict[int, int]]:
    """Links between peers, wired as the shim's ``wire_nvlinks``: each pair gets the
    smaller of its two GPUs' links-per-peer."""

    def per_peer(g: GPU) -> int:
        return BOARDS[g.model.name].nvlinks // len(g.nvlink_peers) if g.nvlink_peers else 0

    out: dict[int, dict[int, int]] = {}
    for g in profile.gpus:
        counts = {}
        for peer in g.nvlink_peers:
            other = profile.gpus[peer]
            n = min(per_peer(g), per_peer(other)) if g.index in other.nvlink_peers else 0
            if n:
                counts[peer] = n
        out[g.index] = counts
    return out


def _mig(node: str, gpu: GPU, j: int) -> MigInfo:
    mp = gpu.mig_instances[j]
    board = BOARDS[gpu.model.name]
    return MigInfo(
        index=j,
        uuid=mig_uuid(node, gpu.index, j),
        gi_id=j + 1,
        ci_id=0,
        profile=mig_profile_name(mp.slices, mp.memory_mib, gpu.model.memory_mib),
        memory_mib=mp.memory_mib,
        attributes={
            "memory": mp.memory_mib,
            "multiprocessors": board.sms_per_slice * mp.slices,
            "slices.gi": mp.slices,
            "slices.ci": mp.slices,
            "engines.copy": mp.slices,
            "engines.decoder": mp.slices // 2,
            "engines.encoder": 0,
            "engines.jpeg": 0,
            "engines.ofa": 0,
        },
    )


def gpu_infos(profile: Profile, node: str) -> list[GPUInfo]:
    links = nvlink_counts(profile)
    return [
        GPUInfo(
            index=g.index,
            uuid=gpu_uuid(node, g.index),
            name=g.model.name,
            memory_mib=g.model.memory_mib,
            compute_capability=g.model.compute_capability,
            minor=g.index,
            numa_node=g.numa_node,
            pci_bus_id=g.pci_bus_id,
            topology={
                o.index: TOPOLOGY_NODE if o.numa_node == g.numa_node else TOPOLOGY_SYSTEM
                for o in profile.gpus
                if o.index != g.index
            },
            nvlinks=links[g.index],
            mig_capable=g.model.mig_capable,
            mig_enabled=g.mig_enabled,
            migs=tuple(_mig(node, g, j) for j in range(len(g.mig_instances))),
        )
        for g in profile.gpus
    ]
