"""Events of the extender: HAMi's reasons and the lab's call-chain steps.

HAMi v2.10.0 ``pkg/scheduler/event.go`` records ``FilteringSucceed``, ``FilteringFailed``,
``BindingSucceed`` and ``BindingFailed`` on the pod through client-go's recorder. Beside
them the lab writes its call-chain step (``Filter``, ``LockNode``, ``Bind`` ...). Both go
through ``gpulab.trace.Tracer``, which aggregates repeated identical Events into one
events.k8s.io series as client-go's ``tools/events`` recorder does: a pod that fails
Filter at every retry has one Warning Event with a growing ``series.count``.
Differences, named: upstream records through the core/v1 recorder (source component
``hami-scheduler``, aggregated by ``count``); the lab writes events.k8s.io/v1 with
reportingController ``gpulab.io/hami-scheduler`` and action = reason, as every lab
component's trace does.
"""

from __future__ import annotations

import sys
from typing import Any

from kubernetes import client

from gpulab.trace import ObjectRef, Tracer

# event.go
FILTERING_FAILED = "FilteringFailed"
FILTERING_SUCCEED = "FilteringSucceed"
BINDING_FAILED = "BindingFailed"
BINDING_SUCCEED = "BindingSucceed"


class SchedulerEvents:
    """The extender's two voices on one Tracer: HAMi's Event reasons and the lab's
    call-chain step (each also a JSON log line). ``api`` None writes the log lines only."""

    def __init__(
        self, api: client.ApiClient | None, instance: str | None = None, stream: Any = None
    ) -> None:
        self.trace = Tracer("hami-scheduler", api, instance, stream=stream or sys.stderr)

    def step(
        self, step: str, ref: ObjectRef, message: str, *, warning: bool = False, **detail: Any
    ) -> None:
        self.trace.step(step, ref, message, warning=warning, **detail)

    def hami(self, ref: ObjectRef, reason: str, message: str, *, warning: bool) -> None:
        """``recordScheduleFilterResultEvent`` / ``recordScheduleBindingResultEvent``."""
        self.trace.step(reason, ref, message, warning=warning)

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until the queued Events are written (tests and demos)."""
        self.trace.flush(timeout)
