"""Prometheus metrics of the extender, served on their own port.

Mirrors Project-HAMi/HAMi v2.10.0 ``cmd/scheduler/metrics.go`` (``ClusterManagerCollector``:
``hami_gpu_memory_limit_bytes``, ``hami_gpu_core_limit_ratio``,
``hami_gpu_memory_allocated_bytes``, ``hami_gpu_shared_count``,
``hami_gpu_core_allocated_ratio``, ``hami_node_gpu_overview``,
``hami_node_gpu_memory_allocated_ratio``, ``hami_node_gpu_mig_instance_info``,
``hami_resource_quota_used`` / ``hami_resource_quota_limit``,
``hami_vgpu_memory_allocated_bytes``, ``hami_vgpu_core_allocated_ratio``, all with the
constant label ``zone="vGPU"``; with ``--legacy-metrics`` also the pre-2.9 names
``GPUDeviceMemoryLimit``, ``GPUDeviceCoreLimit``, ``GPUDeviceMemoryAllocated``,
``GPUDeviceSharedNum``, ``GPUDeviceCoreAllocated``, ``nodeGPUOverview``,
``nodeGPUMemoryPercentage``, ``nodeGPUMigInstance``, ``QuotaUsed``,
``vGPUMemoryAllocated``, ``vGPUCoreAllocated``) and ``pkg/metrics/metrics.go``
(``hami_build_info``).

Differences, named: the gauges are computed at scrape time from the live usage (upstream
reads the snapshot its last registration pass took, up to 15 s old); ``hami_build_info``
reports the lab's version; the lab's own request timings are ``gpulab_``-prefixed.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from importlib.metadata import version

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpulab.hami import annotations as ann
from gpulab.hami.scheduler import Scheduler
from gpulab.hami.score import CardUsage

ZONE = "vGPU"
MIB = 1024 * 1024
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_DEV = ["node", "device_uuid", "device_index", "device_type"]
_LEGACY_DEV = ["nodeid", "deviceuuid", "deviceidx", "devicetype"]
_CTR = ["namespace", "node", "pod", "container_index", "device_uuid"]
_LEGACY_CTR = ["podnamespace", "nodename", "podname", "containeridx", "deviceuuid"]


def _family(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=[*labels, "zone"])


class ClusterManagerCollector(Collector):
    """The per-GPU, per-quota and per-container gauges, from the scheduler's books."""

    def __init__(self, scheduler: Scheduler, legacy: bool) -> None:
        self.scheduler, self.legacy = scheduler, legacy

    def collect(self) -> Iterator[Metric]:
        s = self.scheduler
        usage = s.usage()
        f = {
            "mem_limit": _family(
                "hami_gpu_memory_limit_bytes", "Device memory limit for a certain GPU", _DEV
            ),
            "core_limit": _family(
                "hami_gpu_core_limit_ratio", "Device core limit for a certain GPU", _DEV
            ),
            "mem_alloc": _family(
                "hami_gpu_memory_allocated_bytes",
                "Device memory allocated for a certain GPU",
                ["node", "device_uuid", "device_index", "device_cores", "device_type"],
            ),
            "shared": _family(
                "hami_gpu_shared_count", "Number of containers sharing this GPU", _DEV
            ),
            "core_alloc": _family(
                "hami_gpu_core_allocated_ratio", "Device core allocated for a certain GPU", _DEV
            ),
            "overview": _family(
                "hami_node_gpu_overview",
                "GPU overview on a certain node",
                [
                    "node",
                    "device_uuid",
                    "device_index",
                    "device_cores",
                    "device_memory_limit",
                    "device_type",
                ],
            ),
            "mem_pct": _family(
                "hami_node_gpu_memory_allocated_ratio",
                "GPU Memory Allocated Percentage on a certain GPU",
                _DEV,
            ),
        }
        legacy = {
            "mem_limit": _family(
                "GPUDeviceMemoryLimit", "Device memory limit for a certain GPU", _LEGACY_DEV
            ),
            "core_limit": _family(
                "GPUDeviceCoreLimit", "Device memory core limit for a certain GPU", _LEGACY_DEV
            ),
            "mem_alloc": _family(
                "GPUDeviceMemoryAllocated",
                "Device memory allocated for a certain GPU",
                ["nodeid", "deviceuuid", "deviceidx", "devicecores", "devicetype"],
            ),
            "shared": _family(
                "GPUDeviceSharedNum", "Number of containers sharing this GPU", _LEGACY_DEV
            ),
            "core_alloc": _family(
                "GPUDeviceCoreAllocated", "Device core allocated for a certain GPU", _LEGACY_DEV
            ),
            "overview": _family(
                "nodeGPUOverview",
                "GPU overview on a certain node",
                [*_LEGACY_DEV[:3], "devicecores", "devicememorylimit", "devicetype"],
            ),
            "mem_pct": _family(
                "nodeGPUMemoryPercentage",
                "GPU Memory Allocated Percentage on a certain GPU",
                ["nodeid", "deviceuuid", "deviceidx"],
            ),
        }
        for node, cards in sorted(usage.items()):
            for c in cards:
                dev = [node, c.id, str(c.index), c.type]
                f["mem_limit"].add_metric([*dev, ZONE], c.totalmem * MIB)
                f["core_limit"].add_metric([*dev, ZONE], c.totalcore)
                f["mem_alloc"].add_metric(
                    [node, c.id, str(c.index), str(c.totalcore), c.type, ZONE], c.usedmem * MIB
                )
                f["shared"].add_metric([*dev, ZONE], c.used)
                f["core_alloc"].add_metric([*dev, ZONE], c.usedcores)
                f["overview"].add_metric(
                    [node, c.id, str(c.index), str(c.totalcore), str(c.totalmem), c.type, ZONE],
                    c.usedmem * MIB,
                )
                if c.totalmem > 0:
                    f["mem_pct"].add_metric([*dev, ZONE], c.usedmem / c.totalmem)
                legacy["mem_limit"].add_metric([*dev, ZONE], c.totalmem * MIB)
                legacy["core_limit"].add_metric([*dev, ZONE], c.totalcore)
                legacy["mem_alloc"].add_metric(
                    [node, c.id, str(c.index), str(c.totalcore), c.type, ZONE], c.usedmem * MIB
                )
                legacy["shared"].add_metric([*dev, ZONE], c.used)
                legacy["core_alloc"].add_metric([*dev, ZONE], c.usedcores)
                legacy["overview"].add_metric(
                    [node, c.id, str(c.index), str(c.totalcore), str(c.totalmem), c.type, ZONE],
                    c.usedmem * MIB,
                )
                if c.totalmem > 0:
                    legacy["mem_pct"].add_metric(
                        [node, c.id, str(c.index), ZONE], c.usedmem / c.totalmem
                    )
        yield from f.values()
        yield from self._mig_instances(usage)
        yield from self._quotas()
        yield from self._containers()
        if self.legacy:
            yield from legacy.values()

    def _mig_instances(self, usage: dict[str, list[CardUsage]]) -> Iterator[Metric]:
        """``hami_node_gpu_mig_instance_info``: every MIG instance the device plugin has
        created for a pod (its allocation carries the MIG UUID) on a MIG-mode GPU;
        ``nodeGPUMigInstance`` (``<profile>-<GI id>``) with --legacy-metrics."""
        info = _family(
            "hami_node_gpu_mig_instance_info",
            "Realized MIG instance identity and scheduler placement",
            ["node", "device_uuid", "device_index", "mig_uuid", "profile", "gpu_instance_id",
             "compute_instance_id", "placement_start", "placement_size"],
        )  # fmt: skip
        legacy = _family(
            "nodeGPUMigInstance",
            "GPU Sharing mode. 0 for hami-core, 1 for mig, 2 for mps",
            [*_LEGACY_DEV[:3], "migname"],
        )
        cards = {
            (node, c.id): c for node, cs in usage.items() for c in cs if c.mode == ann.MODE_MIG
        }
        for p in sorted(self.scheduler.pod_infos(), key=lambda p: (p.node, p.namespace, p.name)):
            raw = ((p.pod.get("metadata") or {}).get("annotations") or {}).get(
                ann.MIG_ALLOCATIONS, ""
            )
            try:
                allocations = ann.decode_mig_allocations(raw)
            except ann.AnnotationError:
                continue
            for a in allocations:
                card = cards.get((p.node, a.gpu_uuid))
                if card is None or not a.runtime_ready:
                    continue
                labels = [p.node, card.id, str(card.index), a.mig_uuid, a.profile,
                          str(a.gpu_instance_id), str(a.compute_instance_id), str(a.start),
                          str(a.size), ZONE]  # fmt: skip
                info.add_metric(labels, 1)
                migname = f"{a.profile}-{a.gpu_instance_id}"
                legacy.add_metric([p.node, card.id, str(card.index), migname, ZONE], 1)
        yield info
        if self.legacy:
            yield legacy

    def _quotas(self) -> Iterator[Metric]:
        used = _family(
            "hami_resource_quota_used",
            "resourcequota usage for a certain device",
            ["namespace", "quota_name", "limit"],
        )
        limit = _family(
            "hami_resource_quota_limit",
            "resourcequota limit for a certain device",
            ["namespace", "quota_name"],
        )
        legacy = _family(
            "QuotaUsed",
            "resourcequota usage for a certain device",
            ["quotanamespace", "quotaName", "limit"],
        )
        with self.scheduler.lock:
            snapshot = self.scheduler.quotas.snapshot()
        for ns, quotas in sorted(snapshot.items()):
            for name, q in sorted(quotas.items()):
                used.add_metric([ns, name, str(q.limit), ZONE], q.used)
                legacy.add_metric([ns, name, str(q.limit), ZONE], q.used)
                if q.limit_set:
                    limit.add_metric([ns, name, ZONE], q.limit)
        yield used
        yield limit
        if self.legacy:
            yield legacy

    def _containers(self) -> Iterator[Metric]:
        mem = _family(
            "hami_vgpu_memory_allocated_bytes", "vGPU memory allocated from a container", _CTR
        )
        core = _family(
            "hami_vgpu_core_allocated_ratio", "vGPU core allocated from a container", _CTR
        )
        legacy_mem = _family(
            "vGPUMemoryAllocated", "vGPU memory allocated from a container", _LEGACY_CTR
        )
        legacy_core = _family(
            "vGPUCoreAllocated", "vGPU core allocated from a container", _LEGACY_CTR
        )
        for p in self.scheduler.pod_infos():
            # the pod cache holds the collapsed use: one entry (container index 0) per card
            for share in p.shares:
                labels = [p.namespace, p.node, p.name, "0", share.uuid, ZONE]
                mem.add_metric(labels, share.usedmem * MIB)
                core.add_metric(labels, share.usedcores)
                legacy_mem.add_metric(labels, share.usedmem * MIB)
                legacy_core.add_metric(labels, share.usedcores)
        yield mem
        yield core
        if self.legacy:
            yield legacy_mem
            yield legacy_core


class BuildInfo(Collector):
    """``hami_build_info``: constant 1 with version labels (the lab's)."""

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "hami_build_info",
            "hami build metadata exposed as labels with a constant value of 1.",
            labels=["version", "revision", "build_date", "go_version", "compiler", "platform"],
        )
        info.add_metric(
            [
                f"gpulab-{version('gpu-scheduling-lab')}",
                "",
                "",
                "",
                "python",
                f"{platform.system().lower()}/{platform.machine()}",
            ],
            1,
        )
        yield info


class ExtenderMetrics:
    """The metrics registry: the release's collectors plus the lab's request timings."""

    def __init__(self, scheduler: Scheduler | None = None, legacy: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(BuildInfo())
        if scheduler is not None:
            self.registry.register(ClusterManagerCollector(scheduler, legacy))
        self.duration = Histogram(
            "gpulab_extender_request_duration_seconds",
            "Lab only: time spent answering a route, by route and result (ok or error).",
            ["route", "result"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "gpulab_extender_requests",
            "Lab only: requests by route and outcome (ok, rejected, error).",
            ["route", "outcome"],
            registry=self.registry,
        )
