"""Prometheus metrics of the extender, served on their own port.

Mirrors HAMi ``cmd/scheduler/metrics.go`` (per-GPU ``GPUDeviceMemoryLimit``,
``GPUDeviceCoreLimit``, ``GPUDeviceMemoryAllocated``, ``GPUDeviceCoreAllocated``,
``GPUDeviceSharedNum``, ``vGPUPodsDeviceAllocated``) and ``pkg/scheduler/metrics.go``
(``hami_scheduler_{filter,bind}_duration_seconds`` and ``_total``). Each registry is
private so several extenders (tests) can live in one process.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpulab.hami.scheduler import Scheduler

_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_GPU_LABELS = ["nodeid", "deviceuuid", "deviceidx", "devicetype"]


class _DeviceCollector(Collector):
    """Per-GPU gauges computed from the scheduler's usage view at scrape time."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def collect(self) -> Iterator[Metric]:
        families = {
            "mem_limit": GaugeMetricFamily(
                "GPUDeviceMemoryLimit", "GPU device memory limit (bytes)", labels=_GPU_LABELS
            ),
            "core_limit": GaugeMetricFamily(
                "GPUDeviceCoreLimit", "GPU device core limit (%)", labels=_GPU_LABELS
            ),
            "mem_alloc": GaugeMetricFamily(
                "GPUDeviceMemoryAllocated",
                "GPU device memory allocated (bytes)",
                labels=_GPU_LABELS,
            ),
            "core_alloc": GaugeMetricFamily(
                "GPUDeviceCoreAllocated", "GPU device cores allocated (%)", labels=_GPU_LABELS
            ),
            "shared": GaugeMetricFamily(
                "GPUDeviceSharedNum", "Number of containers sharing this GPU", labels=_GPU_LABELS
            ),
        }
        pods = GaugeMetricFamily(
            "vGPUPodsDeviceAllocated",
            "vGPU memory allocated to a pod's container on a GPU (bytes)",
            labels=["podnamespace", "podname", "nodename", "deviceuuid", "containeridx"],
        )
        for node, cards in sorted(self.scheduler.usage().items()):
            for c in cards:
                labels = [node, c.id, str(c.index), c.type]
                families["mem_limit"].add_metric(labels, c.totalmem * 2**20)
                families["core_limit"].add_metric(labels, c.totalcore)
                families["mem_alloc"].add_metric(labels, c.usedmem * 2**20)
                families["core_alloc"].add_metric(labels, c.usedcores)
                families["shared"].add_metric(labels, c.used)
            for p in self.scheduler.pods_on(node):
                for idx, ctr in enumerate(p.devices):
                    for g in ctr:
                        pods.add_metric(
                            [p.namespace, p.name, node, g.uuid, str(idx)], g.usedmem * 2**20
                        )
        yield from families.values()
        yield pods


class ExtenderMetrics:
    def __init__(self, scheduler: Scheduler | None = None) -> None:
        self.registry = CollectorRegistry()
        self.filter_duration = Histogram(
            "hami_scheduler_filter_duration_seconds",
            "Time spent processing Filter requests.",
            ["result"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.bind_duration = Histogram(
            "hami_scheduler_bind_duration_seconds",
            "Time spent processing Bind requests.",
            ["result"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.filter_total = Counter(
            "hami_scheduler_filter",
            "Total number of Filter requests processed.",
            ["result"],
            registry=self.registry,
        )
        self.bind_total = Counter(
            "hami_scheduler_bind",
            "Total number of Bind requests processed.",
            ["result"],
            registry=self.registry,
        )
        self.requests = Counter(
            "gpulab_extender_requests",
            "HTTP requests by route and outcome (ok, rejected, error, bad_request).",
            ["route", "outcome"],
            registry=self.registry,
        )
        if scheduler is not None:
            self.registry.register(_DeviceCollector(scheduler))
