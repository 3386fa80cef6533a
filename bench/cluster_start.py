"""Benchmark: local-backend cluster start and stop, binaries cached.

Measures, over N rounds of a dedicated cluster (its own name and ports):
- up: from `LocalCluster.up` to all nodes Ready (and the default ServiceAccount present),
- down: from `LocalCluster.down` to every process gone and every port free,
and splits `up` into its phases from the progress messages' timestamps.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from harness.local import LocalCluster
from harness.spec import parse

SPEC = {
    "name": "gpulab-bench",
    "ports": {
        "apiserver": 26443,
        "etcd": 26379,
        "etcdPeer": 26380,
        "controllerManager": 26257,
        "scheduler": 26259,
    },
    "nodes": [
        {"name": "a100", "count": 2, "profile": "a100-sxm4-40gb-x8"},
        {"name": "t4", "count": 8, "profile": "t4-x4"},
    ],
}


def run(rounds: int = 3) -> dict[str, Any]:
    local = LocalCluster(parse(SPEC))
    local.down(lambda _m: None)
    ups, downs, phases = [], [], []
    for _ in range(rounds):
        marks: list[tuple[float, str]] = []
        start = time.monotonic()

        def mark(message: str, marks: list = marks, start: float = start) -> None:
            marks.append((time.monotonic() - start, message))

        local.up(mark)
        ups.append(time.monotonic() - start)
        phases.append(marks)
        start = time.monotonic()
        local.down(lambda _m: None)
        downs.append(time.monotonic() - start)
    apiserver_ready = [
        next(t for t, m in marks if m.startswith("kube-apiserver ready")) for marks in phases
    ]
    return {
        "nodes": len(local.spec.nodes),
        "rounds": rounds,
        "up_s": ups,
        "down_s": downs,
        "up_median_s": statistics.median(ups),
        "down_median_s": statistics.median(downs),
        "apiserver_ready_median_s": statistics.median(apiserver_ready),
        "target_up_s": 15.0,
    }
