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


def test_a_gpu_wide_xid_hits_every_device_of_the_gpu_replicas_included() -> None:
    gpus = inventory.gpu_infos(profiles.load("t4-x4"), "n1")
    (res,) = build_resources(gpus, Config(time_slicing=time_slicing(3)))
    hit = affected(res.devices, gpus[2], NO_INSTANCE, NO_INSTANCE)
    assert len(hit) == 3 and {d.gpu_index for d in hit} == {2}


def test_an_xid_naming_a_mig_instance_hits_only_that_device() -> None:
    profile = profiles.load("a100-80gb-mig-x8")
    gpus = inventory.gpu_infos(profile, "n1")
    resources = build_resources(
        gpus, Config(mig_strategy="mixed"), parse_mig_minors(mig_minors(profile))
    )
    devices = [d for r in resources for d in r.devices]
    gpu0 = gpus[0]
    assert len(affected(devices, gpu0, NO_INSTANCE, NO_INSTANCE)) == len(gpu0.migs)
    (one,) = affected(devices, gpu0, gpu0.migs[1].gi_id, gpu0.migs[1].ci_id)
    assert one.uuid == gpu0.migs[1].uuid
