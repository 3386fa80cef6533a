"""The fault log the shim polls (gpulab.fakegpu.faults)."""

from __future__ import annotations

from pathlib import Path

from gpulab.fakegpu import faults


def test_inject_appends_numbered_lines_in_the_shim_format(tmp_path: Path) -> None:
    faults.inject_xid(tmp_path, 3, 79)
    dbe = faults.inject_ecc_dbe(tmp_path, 1)
    faults.clear(tmp_path, 3)
    faults.clear(tmp_path)
    assert faults.log_path(tmp_path).read_text().splitlines() == [
        "1 fault 3 8 79",
        "2 fault 1 2 0",
        "3 fault 1 8 48",
        "4 clear 3",
        "5 clear all",
    ]
    assert [f.event_type for f in dbe] == [faults.EVENT_DOUBLE_BIT_ECC, faults.EVENT_XID_CRITICAL]


def test_active_faults_until_cleared(tmp_path: Path) -> None:
    assert faults.active(tmp_path) == {}
    faults.inject_xid(tmp_path, 0, 13)
    faults.inject_xid(tmp_path, 2, 79)
    faults.inject_xid(tmp_path, 2, 31)
    active = faults.active(tmp_path)
    assert {g: [f.xid for f in fs] for g, fs in active.items()} == {0: [13], 2: [79, 31]}
    faults.clear(tmp_path, 2)
    assert list(faults.active(tmp_path)) == [0]
    faults.clear(tmp_path)
    assert faults.active(tmp_path) == {}
    faults.inject_xid(tmp_path, 1, 48)
    assert [f.seq for f in faults.active(tmp_path)[1]] == [6]  # sequence keeps counting


def test_fatal_follows_the_device_plugin_ignore_list() -> None:
    def xid(n: int) -> faults.Fault:
        return faults.Fault(1, 0, faults.EVENT_XID_CRITICAL, n)

    assert [n for n in (13, 31, 43, 45, 68, 109) if xid(n).fatal] == []
    assert xid(79).fatal and xid(48).fatal and xid(94).fatal
    assert not faults.Fault(1, 0, faults.EVENT_DOUBLE_BIT_ECC, 0).fatal  # health.go skips it
    assert not faults.Fault(1, 0, faults.EVENT_SINGLE_BIT_ECC, 0).fatal
    assert xid(79).describe() == "Xid 79 (GPU has fallen off the bus)"
