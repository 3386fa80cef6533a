"""ResourceQuota limits on vGPU memory and cores per namespace.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/device/quota.go`` (``QuotaManager``: ``AddQuota``,
``UpdateQuota``, ``DelQuota``, ``AddUsage``, ``RmUsage``, ``FitQuota``): a ResourceQuota's
``spec.hard["limits.nvidia.com/gpumem"]`` / ``["limits.nvidia.com/gpucores"]`` cap what the
namespace's pods hold, as HAMi counts it (their card shares), checked by the webhook at
admission and by Filter per card (``ResourceQuotaNotFit``). Called under the scheduler's
lock; ``key()`` is what Filter's per-node cache must vary with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpulab.hami.config import NvidiaConfig
from gpulab.hami.device import as_int64
from gpulab.hami.pods import Share


@dataclass
class Quota:
    used: int = 0
    limit: int = 0
    limit_set: bool = False  # an explicit limit, 0 included (0 blocks everything)


class QuotaManager:
    def __init__(self, cfg: NvidiaConfig) -> None:
        self.cfg = cfg
        self._quotas: dict[str, dict[str, Quota]] = {}

    def _managed(self, key: str) -> str | None:
        """``managedQuotaName``: "limits.nvidia.com/gpumem" → "nvidia.com/gpumem"."""
        if not key.startswith("limits."):
            return None
        name = key.removeprefix("limits.")
        return (
            name if name in (self.cfg.resource_memory_name, self.cfg.resource_core_name) else None
        )

    def _hard(self, quota: Mapping[str, Any]) -> list[tuple[str, int]]:
        spec = quota.get("spec") or {}
        out = []
        for key, value in (spec.get("hard") or {}).items():
            name = self._managed(key)
            try:
                number = as_int64(value)
            except ValueError:
                continue
            if name is not None and number is not None:
                out.append((name, number))
        return out

    def add_quota(self, quota: Mapping[str, Any]) -> None:
        ns = (quota.get("metadata") or {}).get("namespace", "default")
        for name, limit in self._hard(quota):
            q = self._quotas.setdefault(ns, {}).setdefault(name, Quota())
            q.limit, q.limit_set = limit, True

    def del_quota(self, quota: Mapping[str, Any]) -> None:
        ns = (quota.get("metadata") or {}).get("namespace", "default")
        for name, _ in self._hard(quota):
            q = self._quotas.get(ns, {}).get(name)
            if q is not None:
                q.limit, q.limit_set = 0, False

    def update_quota(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """Both halves at once, so a check never sees the limits zeroed in between."""
        self.del_quota(old)
        self.add_quota(new)

    def _usage(self, shares: Iterable[Share]) -> dict[str, int]:
        mem = cores = 0
        for s in shares:
            mem += s.usedmem
            cores += s.usedcores
        return {self.cfg.resource_memory_name: mem, self.cfg.resource_core_name: cores}

    def add_usage(self, namespace: str, shares: Iterable[Share], sign: int = 1) -> None:
        """``AddUsage`` (sign +1) / ``RmUsage`` (sign -1, never below zero)."""
        for name, value in self._usage(shares).items():
            if not value:
                continue
            q = self._quotas.setdefault(namespace, {}).setdefault(name, Quota())
            q.used = max(0, q.used + sign * value)

    def fits(self, namespace: str, mem: int, cores: int) -> bool:
        """``FitQuota``: would ``mem`` MiB and ``cores`` % more stay within the limits?"""
        ns = self._quotas.get(namespace)
        if not ns:
            return True
        mq = ns.get(self.cfg.resource_memory_name)
        if mq is not None and mq.limit_set:
            limit = mq.limit * self.cfg.memory_factor if self.cfg.memory_factor > 1 else mq.limit
            if mq.used + mem > limit:
                return False
        cq = ns.get(self.cfg.resource_core_name)
        return not (cq is not None and cq.limit_set and cq.used + cores > cq.limit)

    def limited(self, namespace: str) -> bool:
        return any(q.limit_set for q in self._quotas.get(namespace, {}).values())

    def key(self, namespace: str) -> tuple[tuple[str, int, int, bool], ...] | None:
        """The namespace's quota state (None when nothing is limited): Fit results that
        checked it are only valid while it holds."""
        if not self.limited(namespace):
            return None
        return tuple(
            (name, q.used, q.limit, q.limit_set)
            for name, q in sorted(self._quotas[namespace].items())
        )

    def snapshot(self) -> dict[str, dict[str, Quota]]:
        """``GetResourceQuota`` for the metrics."""
        return {
            ns: {name: Quota(q.used, q.limit, q.limit_set) for name, q in qs.items()}
            for ns, qs in self._quotas.items()
        }
