"""GFD labels (internal/lm) from the inventory and the config."""

from __future__ import annotations

from dataclasses import replace

from gpulab.deviceplugin.config import Config, parse, time_slicing
from gpulab.deviceplugin.labels import arch_family, gfd_labels, sanitise
from gpulab.fakegpu import inventory, profiles


def gpus(profile: str):
    return inventory.gpu_infos(profiles.load(profile), "n1")


def test_whole_gpus_none_strategy() -> None:
    labels = gfd_labels(gpus("a100-sxm4-40gb-x8"), Config())
    assert labels == {
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "40960",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
    }  # no nvidia.com/mig.strategy for strategy none


def test_time_slicing_labels() -> None:
    labels = gfd_labels(gpus("t4-x4"), Config(time_slicing=time_slicing(4)))
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.count"] == "4"
    renamed = parse(
        "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: gpu, replicas: 4}]}}"
    )
    assert gfd_labels(gpus("t4-x4"), renamed)["nvidia.com/gpu.product"] == "Tesla-T4"


def test_mixed_counts_every_gpu_of_the_product_and_labels_each_mig_profile() -> None:
    labels = gfd_labels(gpus("a100-80gb-mig-x8"), Config(mig_strategy="mixed"))
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/gpu.count"] == "8"  # every GPU, all MIG-enabled
    assert labels["nvidia.com/gpu.replicas"] == "0"  # MIG-enabled GPUs: no sharing info
    assert labels["nvidia.com/mig-1g.10gb.count"] == "36"
    assert labels["nvidia.com/mig-3g.40gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"
    assert labels["nvidia.com/mig-3g.40gb.memory"] == "40192"
    assert labels["nvidia.com/mig-3g.40gb.slices.gi"] == "3"
    assert labels["nvidia.com/mig-3g.40gb.multiprocessors"] == "42"


def test_single_labels_the_mig_device_as_the_gpu_with_its_attributes() -> None:
    only_1g = [g for g in gpus("a100-80gb-mig-x8") if g.index >= 4]
    labels = gfd_labels(only_1g, Config(mig_strategy="single"))
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.count"] == "28"
    assert labels["nvidia.com/gpu.memory"] == "9728"
    assert labels["nvidia.com/gpu.slices.ci"] == "1"
    assert labels["nvidia.com/gpu.engines.copy"] == "1"


def test_single_on_a_node_it_does_not_fit_says_invalid() -> None:
    labels = gfd_labels(gpus("a100-80gb-mig-x8"), Config(mig_strategy="single"))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-INVALID"
    assert labels["nvidia.com/gpu.count"] == "0"
    partly = [g if g.index < 4 else replace(g, mig_enabled=False, migs=()) for g in
              gpus("a100-80gb-mig-x8")]  # fmt: skip
    assert gfd_labels(partly, Config(mig_strategy="single"))["nvidia.com/gpu.count"] == "0"


def test_no_gpus_no_labels_and_helpers() -> None:
    assert gfd_labels([], Config()) == {}
    assert sanitise("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert [arch_family(*cc) for cc in ((7, 0), (7, 5), (8, 9), (9, 0), (12, 0))] == [
        "volta", "turing", "ada-lovelace", "hopper", "blackwell",
    ]  # fmt: skip


def test_mixed_products_are_labelled_after_the_most_common() -> None:
    mixed = gpus("mixed")  # GPUs 0-1 A100-SXM4-40GB, 2-3 T4
    labels = gfd_labels(mixed, Config())
    # 2x A100 + 2x T4: a tie, the first-listed product wins; the count is its own
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.memory"]) == ("2", "40960")
    # one A100 and both T4s: the T4s outnumber it, whatever the order
    for subset in (mixed[1:], mixed[:1] + mixed[2:]):
        labels = gfd_labels(subset, Config())
        assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
        assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.family"]) == ("2", "turing")
