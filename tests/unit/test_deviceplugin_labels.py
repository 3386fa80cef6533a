"""GFD labels from the NVML inventory (gpulab.deviceplugin.labels)."""

from __future__ import annotations

from gpulab.deviceplugin.labels import arch_family, gfd_labels, sanitise
from gpulab.deviceplugin.rm import GPUInfo, MigInfo


def gpu(i: int, name: str = "NVIDIA A100-SXM4-40GB", cc=(8, 0), mem=40960, migs=()) -> GPUInfo:
    return GPUInfo(
        index=i, uuid=f"GPU-{i}", name=name, memory_mib=mem, compute_capability=cc, minor=i,
        numa_node=0, mig_capable=cc[0] >= 8, mig_enabled=bool(migs),
        migs=tuple(MigInfo(j, f"MIG-{i}-{j}", j, 0, p, 9728) for j, p in enumerate(migs)),
    )  # fmt: skip


def test_whole_gpu_labels() -> None:
    labels = gfd_labels([gpu(i) for i in range(8)], "none")
    assert labels == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.memory": "40960",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "none",
    }


def test_spaces_become_dashes_and_odd_characters_go() -> None:
    assert sanitise("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert sanitise("Tesla  T4 (rev/a)") == "Tesla-T4-reva"
    labels = gfd_labels([gpu(0, "Tesla T4", (7, 5), 15360)], "none")
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["nvidia.com/gpu.family"] == "turing"
    assert labels["nvidia.com/mig.capable"] == "false"


def test_time_slicing_marks_the_product_shared() -> None:
    labels = gfd_labels([gpu(0)], "none", replicas=4)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"


def test_mig_single_labels_describe_the_mig_devices() -> None:
    labels = gfd_labels([gpu(i, migs=("1g.10gb",) * 7) for i in range(2)], "single")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.count"] == "14"
    assert labels["nvidia.com/gpu.memory"] == "9728"


def test_mig_mixed_counts_each_profile() -> None:
    labels = gfd_labels([gpu(0, migs=("3g.40gb", "1g.10gb")), gpu(1)], "mixed")
    assert labels["nvidia.com/mig-3g.40gb.count"] == "1"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "1"
    assert labels["nvidia.com/gpu.count"] == "1"  # only the GPU with MIG disabled
    assert labels["nvidia.com/mig.strategy"] == "mixed"


def test_families_follow_compute_capability() -> None:
    assert [arch_family(*cc) for cc in [(7, 0), (7, 5), (8, 6), (8, 9), (9, 0), (10, 0)]] == [
        "volta", "turing", "ampere", "ada-lovelace", "hopper", "blackwell",
    ]  # fmt: skip


def test_no_gpus_no_labels() -> None:
    assert gfd_labels([], "none") == {}
