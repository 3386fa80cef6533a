"""Device health: NVML Xid events mark devices Unhealthy, for as long as the plugin runs.

Mirrors NVIDIA k8s-device-plugin v0.20.0 ``internal/rm/health.go`` (``checkHealth``): one
NVML event set per plugin (resource), registered for Xid critical errors and ECC errors on
the GPU behind each of its devices, ``nvmlEventSetWait_v2`` in a loop. Only
``XidCriticalError`` events count: ECC events are skipped (a double-bit error reaches the
plugin as its Xid 48), and so are application Xids 13, 31, 43, 45, 68, 109, extended by
``DP_DISABLE_HEALTHCHECKS`` (Xids, or ``all``/``xids`` for no health checks at all) and
overridden by ``DP_ENABLE_HEALTHCHECKS`` (Xids, or ``all``). A device that went Unhealthy
never comes back: upstream ListAndWatch has "no way to recover from the Unhealthy state";
restarting the plugin (a new event set, which NVML does not replay old events to) does.

As v0.20.0, one device per GPU is watched (``parentToDeviceMap``, keyed by the parent GPU's
UUID, each device overwriting the one before): an Xid marks only that device, so on a
time-sliced node one replica of the GPU goes Unhealthy and allocatable drops by one, and a
MIG-instance Xid counts only if it names the kept MIG device's instance. A fix merged after
v0.20.0 (NVIDIA/k8s-device-plugin#1929, #1930) marks every device of the GPU instead. One
difference, named: upstream iterates a Go map, so which replica (or MIG device) is kept
varies; here it is the last one in NVML order.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pynvml

from gpulab.deviceplugin.nvml import text
from gpulab.deviceplugin.rm import Device, GPUInfo

_log = logging.getLogger(__name__)

DISABLE_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_ENV = "DP_ENABLE_HEALTHCHECKS"
# Application errors: the GPU is still healthy (upstream's hard-coded list).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
NO_INSTANCE = 0xFFFFFFFF
EVENT_MASK = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)
# Upstream waits 5000 ms per call; shorter here so a stopping plugin is not held up.
_WAIT_MS = 500
_ALL = 0  # upstream's allXIDs key


@dataclass(frozen=True)
class XidFilter:
    """Upstream ``disabledXIDs``: Xid -> disabled?, with key 0 standing for "all"."""

    table: Mapping[int, bool]

    def all_disabled(self) -> bool:
        """``IsAllDisabled``: no health checks at all."""
        return self.table.get(_ALL, False)

    def is_disabled(self, xid: int) -> bool:
        """``IsDisabled``: is this Xid ignored?"""
        if self.table.get(_ALL) is False:  # DP_ENABLE_HEALTHCHECKS=all
            return False
        if xid in self.table:
            return self.table[xid]
        return self.all_disabled()


def _parse_xids(value: str) -> dict[int, bool]:
    """``newHealthCheckXIDs``: a comma-separated list; ``all``/``xids`` means every Xid."""
    out: dict[int, bool] = {}
    for raw in value.lower().split(","):
        token = raw.strip()
        if token in ("all", "xids"):
            return {_ALL: True}
        if not token:
            continue
        if token.isdigit():
            out[int(token)] = True
        else:
            _log.info("Ignoring malformed Xid value %s", token)
    return out


def xid_filter(env: Mapping[str, str]) -> XidFilter:
    """``getDisabledHealthCheckXids``: disabled (env), then the application list, then
    every explicitly enabled Xid (env) switched back on."""
    table = _parse_xids(env.get(DISABLE_ENV, ""))
    table.update(dict.fromkeys(APPLICATION_XIDS, True))
    for xid in _parse_xids(env.get(ENABLE_ENV, "")):
        table[xid] = False
    return XidFilter(table)


def watched(devices: Sequence[Device]) -> dict[int, Device]:
    """``parentToDeviceMap``: GPU index → the one device an event on that GPU marks (each
    device of the GPU replaces the one before, so the last one stays)."""
    return {d.gpu_index: d for d in devices}


def affected(devices: Sequence[Device], gpu: GPUInfo, gi: int, ci: int) -> list[Device]:
    """The devices an Xid on ``gpu`` marks: the GPU's watched device, unless it is a MIG
    device and the event names another instance (gi/ci ``0xFFFFFFFF``: GPU-wide)."""
    kept = watched(devices).get(gpu.index)
    if kept is None:
        return []
    if kept.mig and gi != NO_INSTANCE and ci != NO_INSTANCE:
        placement = {m.uuid: (m.gi_id, m.ci_id) for m in gpu.migs}
        if placement[kept.uuid] != (gi, ci):
            return []
    return [kept]


UnhealthyCallback = Callable[[list[Device], str], None]
"""Called with (devices, reason) when devices go Unhealthy."""


class CheckHealth(threading.Thread):
    """``checkHealth`` for one plugin's devices. NVML must stay initialised while it runs."""

    def __init__(
        self,
        devices: Sequence[Device],
        gpus: Sequence[GPUInfo],
        unhealthy: UnhealthyCallback,
        xids: XidFilter,
        name: str = "CheckHealth",
        on_watching: Callable[[int], None] = lambda _gpus: None,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._on_watching = on_watching
        self._devices = list(devices)
        self._gpus = {g.index: g for g in gpus}
        self._by_uuid = {g.uuid: g for g in gpus}
        self._unhealthy = unhealthy
        self._xids = xids
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        if self._xids.all_disabled():
            _log.info("health checks disabled by %s", DISABLE_ENV)
            return
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:  # upstream: the plugin keeps serving, unchecked
            _log.error(
                "Failed to start health check: %s; continuing with health checks disabled", exc
            )
            return
        try:
            self._register(event_set)
            # from here on an Xid reaches this set; one injected earlier never will
            self._on_watching(len({d.gpu_index for d in self._devices}))
            while not self._stop_event.is_set():
                self._wait_one(event_set)
        finally:
            pynvml.nvmlEventSetFree(event_set)

    def _register(self, event_set: object) -> None:
        for index in sorted({d.gpu_index for d in self._devices}):
            gpu = self._gpus[index]
            mine = [d for d in self._devices if d.gpu_index == index]
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
            except pynvml.NVMLError as exc:
                self._unhealthy(mine, f"unable to determine the supported events: {exc}")
                continue
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, EVENT_MASK & supported, event_set)
            except pynvml.NVMLError_NotSupported:
                _log.warning("Device %s is too old to support healthchecking.", gpu.uuid)
            except pynvml.NVMLError as exc:
                self._unhealthy(mine, f"cannot register for events: {exc}")

    def _wait_one(self, event_set: object) -> None:
        try:
            event = pynvml.nvmlEventSetWait_v2(event_set, _WAIT_MS)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_TIMEOUT:
                return
            _log.info("Error waiting for event: %s; Marking all devices as unhealthy", exc)
            self._unhealthy(self._devices, f"error waiting for NVML events: {exc}")
            return
        if event.eventType != pynvml.nvmlEventTypeXidCriticalError:
            _log.info("Skipping non-nvmlEventTypeXidCriticalError event: 0x%x", event.eventType)
            return
        if self._xids.is_disabled(event.eventData):
            _log.info("Skipping event Xid=%d", event.eventData)
            return
        gpu = self._by_uuid.get(text(pynvml.nvmlDeviceGetUUID(event.device)))
        if gpu is None:
            _log.info("Ignoring event for unexpected device")
            return
        hit = affected(self._devices, gpu, event.gpuInstanceId, event.computeInstanceId)
        if hit:
            self._unhealthy(hit, f"XidCriticalError: Xid={event.eventData}")
