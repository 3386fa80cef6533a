"""Fault injection for the NVML shim: Xid errors and ECC double-bit errors, delivered
through nvmlEventSetWait_v2 like the NVIDIA driver delivers them to NVML clients.

Faults go into ``<node dir>/faults.log``, one line per injection or clear, appended with a
single write under an exclusive lock::

    <seq> fault <gpu> <nvml event type> <event data>
    <seq> clear <gpu>|all

Every process using the shim polls the log while it waits for events, so an injected
fault reaches a waiting consumer within ~50 ms without restarting anything. Each fault is
delivered once, never replayed to a consumer that registers later (as real NVML). A fault
stays *active* in the shim's state until cleared; ``clear`` is a lab convenience that
changes only that state (``status``, the smi table) and sends no event.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from gpulab.fakegpu.paths import FAULT_LOG_NAME

# nvmlEventType* bits (nvml.h)
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8

XID_DBE = 48  # double-bit ECC error
XID_FALLEN_OFF_BUS = 79
# Xids NVIDIA's k8s-device-plugin does not count as health failures (application
# errors); the shim still delivers them, the consumer decides.
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})

XID_NAMES = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    74: "NVLink Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
}


@dataclass(frozen=True)
class Fault:
    seq: int
    gpu: int
    event_type: int  # nvmlEventType* bit
    event_data: int  # the Xid for EVENT_XID_CRITICAL

    @property
    def xid(self) -> int | None:
        return self.event_data if self.event_type == EVENT_XID_CRITICAL else None

    @property
    def fatal(self) -> bool:
        """Whether NVIDIA's device plugin would mark the GPU unhealthy for this event: only
        Xid critical errors outside the application list (the ECC events themselves are
        skipped; a double-bit error counts through its Xid 48)."""
        return self.xid is not None and self.xid not in IGNORED_XIDS

    def describe(self) -> str:
        if self.xid is not None:
            return f"Xid {self.xid} ({XID_NAMES.get(self.xid, 'unknown Xid')})"
        if self.event_type == EVENT_DOUBLE_BIT_ECC:
            return "double-bit ECC error"
        if self.event_type == EVENT_SINGLE_BIT_ECC:
            return "single-bit ECC error"
        return f"event 0x{self.event_type:x} data {self.event_data}"


def log_path(node_dir: Path) -> Path:
    return Path(node_dir) / FAULT_LOG_NAME


def _append(node_dir: Path, entries: list[str]) -> list[int]:
    """Append entries ('fault ...' / 'clear ...') with fresh sequence numbers."""
    path = log_path(node_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with open(path) as f:
            last = max((int(line.split()[0]) for line in f if line[:1].isdigit()), default=0)
        seqs = list(range(last + 1, last + 1 + len(entries)))
        for seq, entry in zip(seqs, entries, strict=True):
            os.write(fd, f"{seq} {entry}\n".encode())  # one write per line: never torn
        return seqs
    finally:
        os.close(fd)  # also drops the flock


def inject_xid(node_dir: Path, gpu: int, xid: int) -> Fault:
    (seq,) = _append(node_dir, [f"fault {gpu} {EVENT_XID_CRITICAL} {xid}"])
    return Fault(seq, gpu, EVENT_XID_CRITICAL, xid)


def inject_ecc_dbe(node_dir: Path, gpu: int) -> list[Fault]:
    """A double-bit ECC error: the driver raises both the ECC event and Xid 48."""
    entries = [
        f"fault {gpu} {EVENT_DOUBLE_BIT_ECC} 0",
        f"fault {gpu} {EVENT_XID_CRITICAL} {XID_DBE}",
    ]
    seqs = _append(node_dir, entries)
    return [
        Fault(seqs[0], gpu, EVENT_DOUBLE_BIT_ECC, 0),
        Fault(seqs[1], gpu, EVENT_XID_CRITICAL, XID_DBE),
    ]


def clear(node_dir: Path, gpu: int | None = None) -> None:
    """Clear the shim's fault state of one GPU, or of every GPU on the node (a lab
    convenience; no NVML event: a running device plugin keeps the GPU Unhealthy)."""
    _append(node_dir, [f"clear {'all' if gpu is None else gpu}"])


def active(node_dir: Path) -> dict[int, list[Fault]]:
    """Uncleared faults per GPU index (GPUs without faults are absent)."""
    path = log_path(node_dir)
    if not path.exists():
        return {}
    state: dict[int, list[Fault]] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "clear":
            if parts[2] == "all":
                state.clear()
            else:
                state.pop(int(parts[2]), None)
        elif len(parts) == 5 and parts[1] == "fault":
            seq, gpu, etype, data = int(parts[0]), int(parts[2]), int(parts[3]), int(parts[4])
            state.setdefault(gpu, []).append(Fault(seq, gpu, etype, data))
    return state
