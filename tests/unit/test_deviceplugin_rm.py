"""MIG strategies, resource naming, replica IDs and MIG profile names (gpulab.deviceplugin.rm)."""

from __future__ import annotations

import pytest

from gpulab.deviceplugin.rm import (
    GPUInfo,
    MigInfo,
    ResourceError,
    build_resources,
    mig_profile_name,
    replica_id,
)


def gpu(i: int, migs: tuple[str, ...] = (), numa: int = 0) -> GPUInfo:
    return GPUInfo(
        index=i,
        uuid=f"GPU-{i}",
        name="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        compute_capability=(8, 0),
        minor=i,
        numa_node=numa,
        mig_capable=True,
        mig_enabled=bool(migs),
        migs=tuple(MigInfo(j, f"MIG-{i}-{j}", j + 1, 0, p, 9728) for j, p in enumerate(migs)),
    )


@pytest.mark.parametrize(
    ("slices", "mem", "total", "name"),
    [
        (1, 4864, 40960, "1g.5gb"),  # A100 40GB
        (2, 9856, 40960, "2g.10gb"),
        (7, 40192, 40960, "7g.40gb"),
        (1, 9728, 81920, "1g.10gb"),  # A100 80GB
        (3, 40192, 81920, "3g.40gb"),
        (7, 80384, 81920, "7g.80gb"),
        (1, 9984, 81559, "1g.10gb"),  # H100 80GB: 79.6 GiB rounds up to 80
    ],
)
def test_mig_profile_names_match_upstream_rounding(slices, mem, total, name) -> None:
    assert mig_profile_name(slices, mem, total) == name


def test_strategy_none_advertises_whole_gpus_even_with_mig() -> None:
    (spec,) = build_resources([gpu(0, ("1g.10gb",)), gpu(1)], "none")
    assert spec.name == "nvidia.com/gpu"
    assert [d.id for d in spec.devices] == ["GPU-0", "GPU-1"]
    assert spec.devices[1].paths == ("/dev/nvidia1",)
    assert spec.socket_name == "nvidia-gpu.sock"


def test_strategy_single_counts_mig_devices_as_gpus() -> None:
    (spec,) = build_resources([gpu(0, ("1g.10gb",) * 7), gpu(1, ("1g.10gb",) * 7)], "single")
    assert spec.name == "nvidia.com/gpu"
    assert len(spec.devices) == 14
    assert spec.devices[8].id == "MIG-1-1"
    assert spec.devices[8].paths == ("/dev/nvidia1",)  # through the parent GPU


def test_strategy_single_without_mig_falls_back_to_whole_gpus() -> None:
    (spec,) = build_resources([gpu(0), gpu(1)], "single")
    assert [d.id for d in spec.devices] == ["GPU-0", "GPU-1"]


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ([gpu(0, ("1g.10gb",)), gpu(1, ("2g.20gb",))], "one MIG profile"),
        ([gpu(0, ("1g.10gb",)), gpu(1)], r"GPU\(s\) 1 have it disabled"),
    ],
)
def test_strategy_single_rejects_inconsistent_layouts(gpus, message) -> None:
    with pytest.raises(ResourceError, match=message):
        build_resources(gpus, "single")


def test_strategy_mixed_one_resource_per_profile_plus_whole_gpus() -> None:
    specs = build_resources(
        [gpu(0, ("3g.40gb", "1g.10gb", "1g.10gb")), gpu(1, ("1g.10gb",)), gpu(2)], "mixed"
    )
    assert {s.name: [d.id for d in s.devices] for s in specs} == {
        "nvidia.com/gpu": ["GPU-2"],
        "nvidia.com/mig-1g.10gb": ["MIG-0-1", "MIG-0-2", "MIG-1-0"],
        "nvidia.com/mig-3g.40gb": ["MIG-0-0"],
    }
    assert {s.socket_name for s in specs} >= {"nvidia-mig-1g.10gb.sock"}


def test_unknown_strategy_is_an_error_naming_the_choices() -> None:
    with pytest.raises(ResourceError, match="unknown MIG strategy 'auto'; use one of: none"):
        build_resources([gpu(0)], "auto")


def test_replicas_multiply_devices_with_annotated_ids() -> None:
    (spec,) = build_resources([gpu(0), gpu(1)], "none", replicas=3)
    assert [d.id for d in spec.devices] == [
        "GPU-0::0", "GPU-0::1", "GPU-0::2", "GPU-1::0", "GPU-1::1", "GPU-1::2",
    ]  # fmt: skip
    assert {d.uuid for d in spec.devices} == {"GPU-0", "GPU-1"}
    assert spec.devices[4].replica == 1


def test_replica_id_format() -> None:
    assert replica_id("GPU-a", 2) == "GPU-a::2"
