"""Benchmark: local-backend cluster start and stop, binaries cached.

The workshop cluster's shape (harness/clusters/default.yaml: five nodes, four with GPUs
and the device-plugin DaemonSet) under its own name and ports, over N rounds:
- up: from `LocalCluster.up` until every GPU node advertises what its plugin reports,
  split into phases by the progress messages' timestamps;
- down: from `LocalCluster.down` until every process is gone and every port free.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any

from harness.local import LocalCluster
from harness.spec import load, parse

PORTS = {
    "apiserver": 26443,
    "etcd": 26379,
    "etcdPeer": 26380,
    "controllerManager": 26257,
    "scheduler": 26259,
}
# progress message prefix -> phase name, in the order they happen
PHASES = (
    ("kube-apiserver ready", "kube-apiserver ready"),
    ("pod runner started", "nodes created, pod runner + node agents started"),
    ("gpulab-device-plugin DaemonSet applied", "base manifests and the DaemonSet applied"),
    ("device plugins registered", "every GPU node advertises its devices"),
    ("nodes Ready", "nodes Ready, controller-manager and scheduler healthy"),
)


def spec() -> Any:
    default = load("default")
    bench = parse({"name": "gpulab-bench", "ports": PORTS, "nodes": [{"name": "x"}]})
    return replace(default, name=bench.name, ports=bench.ports, path=None)


def run(rounds: int = 3) -> dict[str, Any]:
    local = LocalCluster(spec())
    local.down(lambda _m: None)
    ups, downs, phases = [], [], []
    for _ in range(rounds):
        marks: list[tuple[float, str]] = []
        start = time.monotonic()

        def mark(message: str, marks: list = marks, start: float = start) -> None:
            marks.append((time.monotonic() - start, message))

        local.up(mark)
        ups.append(time.monotonic() - start)
        phases.append({name: next((t for t, m in marks if m.startswith(prefix)), None)
                       for prefix, name in PHASES})  # fmt: skip
        start = time.monotonic()
        local.down(lambda _m: None)
        downs.append(time.monotonic() - start)
    return {
        "nodes": len(local.spec.nodes),
        "gpu_nodes": sum(1 for n in local.spec.nodes if n.profile),
        "rounds": rounds,
        "up_s": ups,
        "down_s": downs,
        "up_median_s": statistics.median(ups),
        "down_median_s": statistics.median(downs),
        "phases_median_s": {
            name: statistics.median(p[name] for p in phases if p[name] is not None)
            for _prefix, name in PHASES
            if any(p[name] is not None for p in phases)
        },
        "target_up_s": 8.0,
    }


def section(cs: dict[str, Any]) -> list[str]:
    lines = [
        "## Cluster start (local backend, binaries cached)",
        "",
        f"The workshop cluster's shape: {cs['nodes']} nodes, {cs['gpu_nodes']} of them with "
        f"GPUs and the device-plugin DaemonSet; {cs['rounds']} rounds.",
        "",
        "| measure | median | all rounds |",
        "|---|---|---|",
        f"| `up` → every GPU node advertises its devices | {cs['up_median_s']:.1f} s | "
        + ", ".join(f"{x:.1f}" for x in cs["up_s"])
        + " |",
        f"| `down` → processes gone, ports free | {cs['down_median_s']:.1f} s | "
        + ", ".join(f"{x:.1f}" for x in cs["down_s"])
        + " |",
        "",
        "Phases (median time since `up` began):",
        "",
        "| phase | at |",
        "|---|---|",
        *[f"| {name} | {t:.1f} s |" for name, t in cs["phases_median_s"].items()],
        "",
        f"Target: ready in {cs['target_up_s']:.0f} s or less → "
        + ("met." if cs["up_median_s"] <= cs["target_up_s"] else "**not met**."),
        "",
        "Beside the other tools (not run here: no Docker engine): kwok's project page says "
        'only that kwokctl sets a cluster up "in seconds" and creates about 20 nodes or '
        "pods per second; kind's documentation publishes no start time (a kind cluster "
        "boots a node container per node from its node image). Neither figure includes "
        "device plugins registering, which is most of this one.",
    ]
    return lines
