"""Which NVML events are health failures and which devices they hit (deviceplugin.health)."""

from __future__ import annotations

import pynvml
import pytest

from gpulab.deviceplugin.health import NO_INSTANCE, affected_uuids, critical, xid_filter
from gpulab.deviceplugin.rm import GPUInfo, MigInfo

XID = pynvml.nvmlEventTypeXidCriticalError


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_not_failures(xid: int) -> None:
    assert not critical(XID, xid, xid_filter({}))


@pytest.mark.parametrize("xid", [48, 63, 74, 79, 94])
def test_other_xids_are_failures(xid: int) -> None:
    assert critical(XID, xid, xid_filter({}))


def test_ecc_double_bit_fails_single_bit_does_not() -> None:
    assert critical(pynvml.nvmlEventTypeDoubleBitEccError, 0, xid_filter({}))
    assert not critical(pynvml.nvmlEventTypeSingleBitEccError, 0, xid_filter({}))


def test_env_extends_and_overrides_the_ignore_list() -> None:
    xids = xid_filter({"DP_DISABLE_HEALTHCHECKS": "79, 94,bogus", "DP_ENABLE_HEALTHCHECKS": "13"})
    assert not critical(XID, 79, xids) and not critical(XID, 94, xids)
    assert critical(XID, 13, xids)  # explicitly enabled beats the built-in list
    assert critical(XID, 48, xids)


def test_all_disables_every_xid_except_enabled_ones() -> None:
    xids = xid_filter({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"})
    assert xids.all_disabled
    assert not critical(XID, 48, xids)
    assert critical(XID, 79, xids)


def _mig_gpu() -> GPUInfo:
    migs = (MigInfo(0, "MIG-a", 1, 0, "3g.40gb", 40192), MigInfo(1, "MIG-b", 2, 0, "1g.10gb", 9728))
    return GPUInfo(0, "GPU-0", "NVIDIA A100", 81920, (8, 0), 0, 0, (), True, True, migs)


def test_gpu_wide_event_hits_the_gpu_and_all_its_mig_devices() -> None:
    assert affected_uuids(_mig_gpu(), NO_INSTANCE, NO_INSTANCE) == ["GPU-0", "MIG-a", "MIG-b"]


def test_instance_event_hits_only_that_mig_device() -> None:
    assert affected_uuids(_mig_gpu(), 2, 0) == ["MIG-b"]
