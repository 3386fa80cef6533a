"""ResourceQuota bookkeeping (gpulab.hami.quota), as HAMi v2.10.0's QuotaManager."""

from __future__ import annotations

from gpulab.hami.config import NvidiaConfig
from gpulab.hami.pods import Share
from gpulab.hami.quota import QuotaManager


def quota(mem: str | None = None, cores: str | None = None, ns: str = "team") -> dict:
    hard = {"requests.cpu": "4"}
    if mem is not None:
        hard["limits.nvidia.com/gpumem"] = mem
    if cores is not None:
        hard["limits.nvidia.com/gpucores"] = cores
    return {"metadata": {"name": "q", "namespace": ns}, "spec": {"hard": hard}}


def test_limits_count_the_namespaces_shares() -> None:
    q = QuotaManager(NvidiaConfig())
    assert q.fits("team", 10**6, 10**6) and q.key("team") is None  # nothing limited
    q.add_quota(quota(mem="8000", cores="50"))
    q.add_usage("team", [Share("GPU-0", 6000, 30, 1)])
    assert q.fits("team", 2000, 20) and not q.fits("team", 2001, 0) and not q.fits("team", 0, 21)
    assert q.fits("other", 10**6, 10**6)
    q.add_usage("team", [Share("GPU-0", 6000, 30, 1)], -1)
    q.add_usage("team", [Share("GPU-0", 6000, 30, 1)], -1)  # never below zero
    assert q.snapshot()["team"]["nvidia.com/gpumem"].used == 0


def test_an_explicit_zero_blocks_and_an_update_swaps_limits_at_once() -> None:
    q = QuotaManager(NvidiaConfig())
    q.add_quota(quota(mem="0"))
    assert not q.fits("team", 1, 0)
    q.update_quota(quota(mem="0"), quota(mem="4000"))
    assert q.fits("team", 4000, 0) and not q.fits("team", 4001, 0)
    q.del_quota(quota(mem="4000"))
    assert q.fits("team", 10**6, 0) and q.key("team") is None


def test_memory_factor_scales_the_limit() -> None:
    q = QuotaManager(NvidiaConfig(memory_factor=2))
    q.add_quota(quota(mem="1000"))
    assert q.fits("team", 2000, 0) and not q.fits("team", 2001, 0)
