"""Benchmark: a kind cluster's start and stop beside a local one of the same shape.

The kind lane's shape (harness/clusters/kind-e2e.yaml: a control plane, gpu-a100 with the
NVIDIA device plugin, gpu-t4 with HAMi's) under its own name, images already built and
cached in the engine (`make images`), one round each, in the same run so the ratio holds
on a shared machine:
- kind up: from `DockerCluster.up` until both GPU nodes' plugins are registered with
  their real kubelets, split into phases by the progress messages;
- local up: the same spec on the local backend, ports of its own;
- down of each.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bench import cluster_start
from harness.docker import DockerCluster
from harness.local import LocalCluster
from harness.spec import ClusterSpec, load, parse

NAME = "gpulab-bench-kind"
# kind picks its API server's host port itself; the local twin takes the cluster_start
# benchmark's block (26xxx), which never runs at the same time
PORTS = cluster_start.PORTS
# progress message prefix -> phase name, in the order they happen
PHASES = (
    ("kind cluster created", "kind create cluster (node containers, kubeadm init/join)"),
    ("loaded ", "lab images loaded into the workers"),
    ("fake NVIDIA driver", "device nodes made"),
    ("nodes Ready", "nodes Ready, base manifests applied"),
)


def spec() -> ClusterSpec:
    kind = load("kind-e2e")
    bench = parse({"name": NAME, "ports": PORTS, "nodes": [{"name": "x"}]})
    return replace(kind, name=bench.name, ports=bench.ports, path=None)


Up = Callable[[Callable[[str], None]], None]


def _timed(up: Up) -> tuple[float, list[tuple[float, str]]]:
    """Run ``up``, printing its progress (a kind start takes minutes), timing each line."""
    marks: list[tuple[float, str]] = []
    start = time.monotonic()

    def mark(message: str) -> None:
        marks.append((time.monotonic() - start, message))
        print(f"  [{marks[-1][0]:5.0f}s] {message}", flush=True)

    up(mark)
    return time.monotonic() - start, marks


def run() -> dict[str, Any]:
    kind, local = DockerCluster("kind", spec()), LocalCluster(spec())
    for cluster in (kind, local):
        cluster.down(lambda _m: None)
    kind_up, marks = _timed(kind.up)
    start = time.monotonic()
    kind.down(print)
    kind_down = time.monotonic() - start
    local_up, _ = _timed(local.up)
    start = time.monotonic()
    local.down(lambda _m: None)
    local_down = time.monotonic() - start
    return {
        "nodes": len(kind.spec.nodes),
        "kind_up_s": kind_up,
        "kind_down_s": kind_down,
        "local_up_s": local_up,
        "local_down_s": local_down,
        "kind_phases_s": {
            name: next(t for t, m in marks if m.startswith(prefix))
            for prefix, name in PHASES
            if any(m.startswith(prefix) for _t, m in marks)
        },
    }


def section(ks: dict[str, Any]) -> list[str]:
    return [
        "## Cluster start: kind beside local (images cached)",
        "",
        f"The kind lane's shape ({ks['nodes']} GPU nodes and a control plane), one round "
        "each in the same run.",
        "",
        "| backend | up → plugins registered | down | up ÷ local's |",
        "|---|---|---|---|",
        f"| kind | {ks['kind_up_s']:.0f} s | {ks['kind_down_s']:.0f} s | "
        f"{ks['kind_up_s'] / ks['local_up_s']:.0f}× |",
        f"| local | {ks['local_up_s']:.1f} s | {ks['local_down_s']:.1f} s | 1× |",
        "",
        "kind's phases (time since `up` began):",
        "",
        "| phase | at |",
        "|---|---|",
        *[f"| {name} | {t:.0f} s |" for name, t in ks["kind_phases_s"].items()],
        "",
        "Most of a kind start is node containers booting systemd and kubeadm's init and "
        "join (the lab's images are in the node image already, nothing is loaded); the "
        "local backend starts processes.",
    ]
