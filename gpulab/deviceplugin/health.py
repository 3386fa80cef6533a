"""Device health: NVML events mark devices Unhealthy; a periodic re-check marks them Healthy.

Mirrors NVIDIA k8s-device-plugin ``internal/rm/health.go`` (``CheckHealth``): an NVML event
set registered for Xid critical errors and ECC errors on every GPU, ``nvmlEventSetWait_v2``
in a loop, application Xids 13, 31, 43, 45, 68, 109 ignored, the ignore list extended by
``DP_DISABLE_HEALTHCHECKS`` (comma-separated Xids, or ``all``/``xids``) and overridden by
``DP_ENABLE_HEALTHCHECKS``. Differences, both deliberate:

- a double-bit ECC event also marks the GPU Unhealthy (upstream registers for it but only
  acts on Xids; a DBE is what Xid 48 reports anyway);
- recovery: upstream never marks a device Healthy again (a real GPU needs a reset). Here,
  every ``recheck_seconds``, the unhealthy GPUs are registered on a *fresh* event set: the
  NVML shim replays a GPU's uncleared faults on registration, so a GPU whose faults were
  cleared (``gpulab fake-gpu clear``) comes back Healthy. ``recheck_seconds=0`` disables it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import pynvml

from gpulab.deviceplugin.nvml import text
from gpulab.deviceplugin.rm import GPUInfo

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
_WAIT_MS = 500


@dataclass(frozen=True)
class XidFilter:
    """Which Xids are not health failures (upstream ``disabledXIDs``)."""

    disabled: frozenset[int]
    enabled: frozenset[int]
    all_disabled: bool

    def is_disabled(self, xid: int) -> bool:
        if xid in self.enabled:
            return False
        return self.all_disabled or xid in self.disabled


def _parse_xids(value: str) -> tuple[set[int], bool]:
    xids: set[int] = set()
    for raw in value.lower().split(","):
        token = raw.strip()
        if token in ("all", "xids"):
            return set(), True
        if token.isdigit():
            xids.add(int(token))
        elif token:
            _log.info("ignoring malformed Xid value %r in health-check settings", token)
    return xids, False


def xid_filter(env: Mapping[str, str]) -> XidFilter:
    disabled, all_disabled = _parse_xids(env.get(DISABLE_ENV, ""))
    enabled, _ = _parse_xids(env.get(ENABLE_ENV, ""))
    return XidFilter(frozenset(disabled | APPLICATION_XIDS), frozenset(enabled), all_disabled)


def critical(event_type: int, event_data: int, xids: XidFilter) -> bool:
    """Does this NVML event make the device Unhealthy?"""
    if event_type & pynvml.nvmlEventTypeDoubleBitEccError:
        return True
    if event_type & pynvml.nvmlEventTypeXidCriticalError:
        return not xids.is_disabled(event_data)
    return False  # single-bit ECC errors are corrected by the hardware


def affected_uuids(gpu: GPUInfo, gi_id: int, ci_id: int) -> list[str]:
    """The device UUIDs an event on ``gpu`` concerns: one MIG device, or the GPU and all its."""
    if gpu.mig_enabled and gi_id != NO_INSTANCE and ci_id != NO_INSTANCE:
        return [m.uuid for m in gpu.migs if (m.gi_id, m.ci_id) == (gi_id, ci_id)]
    return [gpu.uuid, *(m.uuid for m in gpu.migs)]


HealthCallback = Callable[[list[str], bool, str], None]
"""Called with (uuids, healthy, reason) when devices change health."""


class CheckHealth(threading.Thread):
    """The health-check loop for one node's GPUs. NVML must stay initialised while it runs."""

    def __init__(
        self,
        gpus: Sequence[GPUInfo],
        on_change: HealthCallback,
        xids: XidFilter,
        recheck_seconds: float = 2.0,
    ) -> None:
        super().__init__(name="CheckHealth", daemon=True)
        self._gpus = {g.uuid: g for g in gpus}
        self._on_change = on_change
        self._xids = xids
        self._recheck = recheck_seconds
        self._stop_event = threading.Event()
        self._unhealthy: set[str] = set()  # GPU UUIDs

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        if self._xids.all_disabled and not self._xids.enabled:
            _log.info("health checks disabled by %s", DISABLE_ENV)
            return
        try:
            self._watch()
        except pynvml.NVMLError as exc:  # no event set: health is unknown, so not healthy
            _log.error("health checks stopped (%s); marking all devices Unhealthy", exc)
            for uuid in self._gpus:
                self._mark([uuid], NO_INSTANCE, NO_INSTANCE, False, f"health check failed: {exc}")

    def _watch(self) -> None:
        event_set = pynvml.nvmlEventSetCreate()
        try:
            self._register(event_set, self._gpus.values())
            last_recheck = 0.0
            while not self._stop_event.is_set():
                self._wait_one(event_set)
                now = time.monotonic()
                if self._recheck > 0 and self._unhealthy and now - last_recheck >= self._recheck:
                    last_recheck = now
                    self._recheck_unhealthy()
        finally:
            pynvml.nvmlEventSetFree(event_set)

    def _register(self, event_set: object, gpus: Iterable[GPUInfo]) -> None:
        for gpu in gpus:
            handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
                pynvml.nvmlDeviceRegisterEvents(handle, EVENT_MASK & supported, event_set)
            except pynvml.NVMLError as exc:
                # Upstream: a device that cannot be watched is reported Unhealthy.
                self._mark([gpu.uuid], NO_INSTANCE, NO_INSTANCE, False, f"cannot watch: {exc}")

    def _wait_one(self, event_set: object) -> None:
        try:
            event = pynvml.nvmlEventSetWait_v2(event_set, _WAIT_MS)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_TIMEOUT:
                return
            _log.error("NVML event wait failed (%s); marking all devices Unhealthy", exc)
            for uuid in self._gpus:
                self._mark([uuid], NO_INSTANCE, NO_INSTANCE, False, f"event wait failed: {exc}")
            self._stop_event.wait(1.0)
            return
        uuid = text(pynvml.nvmlDeviceGetUUID(event.device))
        if uuid not in self._gpus:
            _log.info("ignoring event for unexpected device %s", uuid)
            return
        if not critical(event.eventType, event.eventData, self._xids):
            _log.info(
                "skipping event type=0x%x data=%d on %s", event.eventType, event.eventData, uuid
            )
            return
        reason = _describe(event.eventType, event.eventData)
        self._mark([uuid], event.gpuInstanceId, event.computeInstanceId, False, reason)

    def _recheck_unhealthy(self) -> None:
        """Register the unhealthy GPUs on a fresh set: whatever it replays is still active."""
        probe = pynvml.nvmlEventSetCreate()
        try:
            gpus = [self._gpus[u] for u in sorted(self._unhealthy)]
            self._register(probe, gpus)
            still: set[str] = set()
            while True:
                try:
                    event = pynvml.nvmlEventSetWait_v2(probe, 0)
                except pynvml.NVMLError:
                    break
                if critical(event.eventType, event.eventData, self._xids):
                    still.add(text(pynvml.nvmlDeviceGetUUID(event.device)))
        finally:
            pynvml.nvmlEventSetFree(probe)
        for uuid in sorted(self._unhealthy - still):
            self._mark([uuid], NO_INSTANCE, NO_INSTANCE, True, "faults cleared")

    def _mark(self, gpu_uuids: list[str], gi: int, ci: int, healthy: bool, reason: str) -> None:
        for gpu_uuid in gpu_uuids:
            gpu = self._gpus[gpu_uuid]
            if healthy:
                self._unhealthy.discard(gpu_uuid)
            else:
                self._unhealthy.add(gpu_uuid)
            self._on_change(affected_uuids(gpu, gi, ci), healthy, reason)


def _describe(event_type: int, data: int) -> str:
    if event_type & pynvml.nvmlEventTypeXidCriticalError:
        return f"XidCriticalError: Xid={data}"
    return "DoubleBitEccError"
