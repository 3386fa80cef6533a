"""Which Xids are health failures (health.go getDisabledHealthCheckXids) and which devices
an event concerns."""

from __future__ import annotations

import pytest

from gpulab.deviceplugin.config import Config, time_slicing
from gpulab.deviceplugin.health import NO_INSTANCE, affected, xid_filter
from gpulab.deviceplugin.rm import build_resources, parse_mig_minors
from gpulab.fakegpu import inventory, profiles
from gpulab.fakegpu.render import mig_minors


@pytest.mark.parametrize(
    ("env", "disabled", "enabled", "no_checks"),
    [
        ({}, [13, 31, 43, 45, 68, 109], [48, 79, 94], False),
        ({"DP_DISABLE_HEALTHCHECKS": "79, 94"}, [79, 94, 13], [48], False),
        ({"DP_DISABLE_HEALTHCHECKS": "all"}, [79], [], True),
        ({"DP_DISABLE_HEALTHCHECKS": "xids"}, [79], [], True),
        ({"DP_ENABLE_HEALTHCHECKS": "13"}, [31], [13, 79], False),
        ({"DP_ENABLE_HEALTHCHECKS": "all"}, [], [13, 31, 79, 109], False),
        ({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "all"}, [], [13, 79], False),
        # v0.20.0: with every Xid disabled, checkHealth returns before looking at the rest
        ({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"}, [], [], True),
        ({"DP_DISABLE_HEALTHCHECKS": "x, 79"}, [79], [48], False),  # malformed: ignored
    ],
)
def test_xid_filter_as_upstream(env, disabled, enabled, no_checks) -> None:
    xids = xid_filter(env)
    assert xids.all_disabled() is no_checks
    if no_checks:
        return
    assert [x for x in disabled if not xids.is_disabled(x)] == []
    assert [x for x in enabled if xids.is_disabled(x)] == []


def test_a_gpu_wide_xid_marks_one_replica_of_a_time_sliced_gpu_as_v0_20_0() -> None:
    """parentToDeviceMap keeps one device per GPU: on a node time-sliced 3 ways the Xid
    takes one replica out of allocatable, not 3 (the fix after v0.20.0, #1930, takes all)."""
    gpus = inventory.gpu_infos(profiles.load("t4-x4"), "n1")
    (res,) = build_resources(gpus, Config(time_slicing=time_slicing(3)))
    (hit,) = affected(res.devices, gpus[2], NO_INSTANCE, NO_INSTANCE)
    assert (hit.gpu_index, hit.replica) == (2, 2)  # the last replica in NVML order
    assert affected([d for d in res.devices if d.gpu_index != 2], gpus[2], 0, 0) == []


def test_an_xid_naming_a_mig_instance_counts_only_for_the_kept_mig_device() -> None:
    profile = profiles.load("a100-80gb-mig-x8")
    gpus = inventory.gpu_infos(profile, "n1")
    resources = build_resources(
        gpus, Config(mig_strategy="mixed"), parse_mig_minors(mig_minors(profile))
    )
    gpu0 = gpus[0]  # 3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb
    (one_g,) = [r for r in resources if r.name == "nvidia.com/mig-1g.10gb"]
    first, last = [d for d in one_g.devices if d.gpu_index == 0]
    # GPU-wide: the one device this resource's health check keeps for GPU 0
    assert affected(one_g.devices, gpu0, NO_INSTANCE, NO_INSTANCE) == [last]
    named = {m.uuid: m for m in gpu0.migs}
    assert affected(one_g.devices, gpu0, named[last.uuid].gi_id, named[last.uuid].ci_id) == [last]
    # an Xid naming the other 1g.10gb instance is dropped (NVIDIA/k8s-device-plugin#1929)
    assert affected(one_g.devices, gpu0, named[first.uuid].gi_id, named[first.uuid].ci_id) == []
