"""Benchmark: Kueue (kubernetes-sigs/kueue v0.19.2 counterpart) admission.

One dedicated cluster (its own name and ports, addon ``kueue`` with the lab's
Configuration: fair sharing on), two measurements:

1. Throughput, 1,000 one-pod Jobs submitted at once, twice, each time into an empty
   namespace: unqueued (no queue-name label; the Job webhook lets them through) — first
   create to all pods created by the Job controller, and to all Running; queued
   (LocalQueue on a ClusterQueue with quota for all of them) — to all Workloads admitted
   (QuotaReserved), all Jobs unsuspended, all pods created. Pods ask for 100m CPU; kwok
   keeps them Running for an hour.
2. Admission latency per Workload: 10 ClusterQueues in 2 Cohorts (5 each, 500 CPU of
   nominal quota each), 5,000 one-CPU Workloads created directly (the scheduler's own
   input, as upstream's scheduler performance test does), spread unevenly so half the
   queues borrow from the other half of their Cohort; latency = the Workload's first
   QuotaReserved seen on the watch minus the moment its create returned; p50/p99; and the
   controller's resident memory (VmRSS after, VmHWM peak) from /proc (the pod runner's
   ``gpulab://PID`` container ID names the pod's process).

Every time is taken from watch events as they arrive (demos.kueue.Watched).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from demos import kueue as demo
from gpulab.informer import JOBS, PODS
from gpulab.kueue import api as kueue
from gpulab.wait import wait_for
from harness.addons import kueue as addon
from harness.local import LocalCluster
from harness.spec import parse

JOBS_COUNT = 1000
CPU_PER_JOB = "100m"
WORKLOADS = 5000
QUEUES, COHORTS = 10, 2
QUOTA_PER_QUEUE = 500  # CPUs: the 5,000 Workloads fit, with half the queues borrowing
TIMEOUT = 900.0
SPEC = {
    "name": "gpulab-bench-kueue",
    "ports": {
        "apiserver": 20443,
        "etcd": 20379,
        "etcdPeer": 20380,
        "controllerManager": 20257,
        "scheduler": 20259,
    },
    "addons": ["kueue"],
    "nodes": [{"name": "node", "count": 10, "cpu": "128", "pods": "250"}],
}
Obj = dict[str, Any]
WORKLOAD_RESOURCE = demo.kueue_resource("Workload")


def job(name: str, queue: str | None) -> client.V1Job:
    container = client.V1Container(
        name="main",
        image="registry.k8s.io/pause:3.10",
        resources=client.V1ResourceRequirements(requests={"cpu": CPU_PER_JOB}),
    )
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(annotations={"pod-complete.stage.kwok.x-k8s.io/delay": "1h"}),
        spec=client.V1PodSpec(restart_policy="Never", containers=[container]),
    )
    labels = {kueue.QUEUE_LABEL: queue} if queue else None
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1JobSpec(template=template, backoff_limit=0),
    )


class Milestones:
    """When (time.monotonic) each object first reached each milestone."""

    def __init__(self, checks: dict[str, Callable[[Obj], bool]]) -> None:
        self._checks = checks
        self.reached: dict[str, dict[str, float]] = {m: {} for m in checks}

    def __call__(self, obj: Obj, _objects: dict[str, Obj]) -> None:
        name = obj["metadata"]["name"]
        for milestone, check in self._checks.items():
            if name not in self.reached[milestone] and check(obj):
                self.reached[milestone][name] = time.monotonic()

    def all_reached(self, milestone: str, start: float, count: int = JOBS_COUNT) -> float | None:
        """Seconds from ``start`` until the last of the objects got there."""
        times = self.reached[milestone]
        return max(times.values()) - start if len(times) >= count else None


def _running(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def _unsuspended(j: Obj) -> bool:
    return (j.get("spec") or {}).get("suspend") is False


def _admitted(wl: Obj) -> bool:
    return demo.reason(wl, kueue.QUOTA_RESERVED) is not None


def _submit(api: client.ApiClient, ns: str, queue: str | None) -> tuple[float, float]:
    """Create the Jobs (8 requests in flight); returns when it started and how long it took."""
    batch = client.BatchV1Api(api)
    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda i: batch.create_namespaced_job(ns, job(f"job-{i:04d}", queue)),
                range(JOBS_COUNT),
            )
        )
    return start, time.monotonic() - start


def _fresh_namespace(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    wait_for(lambda: core.list_namespaced_service_account(ns).items, 60, f"ServiceAccount in {ns}")


def _delete_namespace(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    core.delete_namespace(ns)

    def gone() -> bool:
        try:
            core.read_namespace(ns)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, TIMEOUT, f"namespace {ns} to be deleted", interval=1.0)


def unqueued(api: client.ApiClient) -> dict[str, float]:
    ns = "bench-unqueued"
    _fresh_namespace(api, ns)
    pods = Milestones({"created": lambda _p: True, "running": _running})
    with demo.Watched(api, PODS, ns, on_event=pods):
        t0, submit_s = _submit(api, ns, None)
        created = wait_for(lambda: pods.all_reached("created", t0), TIMEOUT, "all pods created")
        running = wait_for(lambda: pods.all_reached("running", t0), TIMEOUT, "all pods Running")
    _delete_namespace(api, ns)
    return {"submit_s": submit_s, "pods_created_s": created, "pods_running_s": running}


def queued(api: client.ApiClient) -> dict[str, float]:
    ns = "bench-queued"
    _fresh_namespace(api, ns)
    cq = "bench"
    quota = f"{JOBS_COUNT * 100}m"  # exactly enough for every Job at once
    # a flavor without node labels: the pods may go to any node, as the unqueued ones
    demo.create(api, demo.flavor(cq, {}))
    demo.create(api, demo.cluster_queue(cq, ns, quota, cq, resource="cpu"))
    demo.create(api, demo.local_queue("bench", ns, cq))
    workloads = Milestones({"admitted": _admitted})
    jobs = Milestones({"unsuspended": _unsuspended})
    pods = Milestones({"created": lambda _p: True})
    with (
        demo.Watched(api, WORKLOAD_RESOURCE, ns, on_event=workloads),
        demo.Watched(api, JOBS, ns, on_event=jobs),
        demo.Watched(api, PODS, ns, on_event=pods),
    ):
        t0, submit_s = _submit(api, ns, "bench")
        admitted = wait_for(
            lambda: workloads.all_reached("admitted", t0), TIMEOUT, "all Workloads admitted"
        )
        unsuspended = wait_for(
            lambda: jobs.all_reached("unsuspended", t0), TIMEOUT, "all Jobs unsuspended"
        )
        created = wait_for(lambda: pods.all_reached("created", t0), TIMEOUT, "all pods created")
    _delete_namespace(api, ns)
    demo.delete_cluster_objects(api, ("ClusterQueue", cq), ("ResourceFlavor", cq))
    return {
        "submit_s": submit_s,
        "admitted_s": admitted,
        "unsuspended_s": unsuspended,
        "pods_created_s": created,
    }


# -- admission latency -------------------------------------------------------------------------


def _workload(name: str, ns: str, queue: str) -> Obj:
    container = {"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}
    return {
        "apiVersion": kueue.API_VERSION,
        "kind": "Workload",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "queueName": queue,
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
                }
            ],
        },
    }


def _demand(i: int) -> int:
    """Workloads for queue i: 300, 400, 500, 600, 700 in each cohort (2,500 = its quota)."""
    return 300 + 100 * (i % 5)


def _memory_kb(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def latency(local: LocalCluster, api: client.ApiClient) -> dict[str, Any]:
    ns = "bench-latency"
    _fresh_namespace(api, ns)
    flavor = "bench-cpu"
    demo.create(api, demo.flavor(flavor, {}))
    for i in range(QUEUES):
        cohort = f"bench-cohort-{i % COHORTS}"
        demo.create(
            api, demo.cluster_queue(f"bench-{i}", ns, QUOTA_PER_QUEUE, flavor, cohort, "cpu")
        )
        demo.create(api, demo.local_queue(f"lq-{i}", ns, f"bench-{i}"))
    [pod] = local.component_pods(addon.COMPONENT, namespace=addon.NAMESPACE)
    # the pod runner's container ID is the controller's host process
    pid = int(pod.status.container_statuses[0].container_id.removeprefix("gpulab://"))
    before = _memory_kb(pid)
    order = [(f"wl-{i}-{n:04d}", f"lq-{i}") for i in range(QUEUES) for n in range(_demand(i))]
    random.Random(20261201).shuffle(order)  # arrivals interleave across the queues
    assert len(order) == WORKLOADS
    created: dict[str, float] = {}
    seen = Milestones({"admitted": _admitted})
    custom = client.CustomObjectsApi(api)

    def make(item: tuple[str, str]) -> None:
        name, queue = item
        custom.create_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, ns, "workloads", _workload(name, ns, queue)
        )
        created[name] = time.monotonic()

    with demo.Watched(api, WORKLOAD_RESOURCE, ns, on_event=seen):
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(make, order))
        submit_s = time.monotonic() - t0
        all_s = wait_for(
            lambda: seen.all_reached("admitted", t0, WORKLOADS),
            TIMEOUT,
            f"all {WORKLOADS} Workloads admitted",
            interval=1.0,
        )
    after = _memory_kb(pid)
    latencies = sorted(
        seen.reached["admitted"][n] - created[n] for n in created if n in seen.reached["admitted"]
    )
    q = statistics.quantiles(latencies, n=100)

    def usage() -> dict[str, int] | None:
        """Each ClusterQueue's reported usage, once the (batched) statuses add up."""
        found = {
            f"bench-{i}": demo.gpu_usage(demo.get(api, "ClusterQueue", f"bench-{i}"), "cpu")
            for i in range(QUEUES)
        }
        return found if sum(found.values()) == WORKLOADS else None

    reported = wait_for(usage, 30, f"the ClusterQueues to report {WORKLOADS} CPUs in use")
    return {
        "workloads": WORKLOADS,
        "queues": QUEUES,
        "cohorts": COHORTS,
        "submit_s": submit_s,
        "all_admitted_s": all_s,
        "p50_s": q[49],
        "p99_s": q[98],
        "max_s": latencies[-1],
        "usage": reported,
        "rss_before_mb": before["VmRSS"] / 1024,
        "rss_after_mb": after["VmRSS"] / 1024,
        "rss_peak_mb": after["VmHWM"] / 1024,
    }


def run() -> dict[str, Any]:
    local = LocalCluster(parse(SPEC))
    local.down(lambda _m: None)
    local.up(lambda _m: None)
    try:
        api = local.api()
        plain = unqueued(api)
        with_kueue = queued(api)
        lat = latency(local, api)
    finally:
        local.down(lambda _m: None)
    return {
        "jobs": JOBS_COUNT,
        "nodes": len(local.spec.nodes),
        "unqueued": plain,
        "queued": with_kueue,
        "ratio_unsuspended_to_unqueued_pods": with_kueue["unsuspended_s"] / plain["pods_created_s"],
        "ratio_pods_created": with_kueue["pods_created_s"] / plain["pods_created_s"],
        "latency": lat,
    }


def section(data: dict[str, Any]) -> list[str]:
    """This benchmark's part of REPORT.md."""
    u, q = data["unqueued"], data["queued"]
    lines = [
        "## Kueue admission throughput (local backend, addon kueue)",
        "",
        f"{data['jobs']:,} one-pod Jobs (100m CPU each) created at once (8 requests in "
        f"flight) on {data['nodes']} simulated nodes; times from the first create, taken "
        "from watch events.",
        "",
        "| measure | unqueued | queued (Kueue) |",
        "|---|---|---|",
        f"| all Jobs created | {u['submit_s']:.1f} s | {q['submit_s']:.1f} s |",
        f"| all Workloads admitted (QuotaReserved) | — | {q['admitted_s']:.1f} s |",
        f"| all Jobs unsuspended | — | {q['unsuspended_s']:.1f} s |",
        f"| all pods created | {u['pods_created_s']:.1f} s | {q['pods_created_s']:.1f} s |",
        f"| all pods Running | {u['pods_running_s']:.1f} s | |",
        "",
        f"Queued time to all unsuspended / unqueued time to all pods created: "
        f"**{data['ratio_unsuspended_to_unqueued_pods']:.2f}**; "
        f"pods created, queued / unqueued: {data['ratio_pods_created']:.2f}.",
    ]
    lat = data.get("latency")
    if lat:
        lines += [
            "",
            "## Kueue admission latency per Workload (fair sharing on)",
            "",
            f"{lat['workloads']:,} one-CPU Workloads created directly (8 requests in flight) "
            f"into {lat['queues']} ClusterQueues in {lat['cohorts']} Cohorts (500 CPU nominal "
            "each; demand 300..700 per queue, so half of them borrow within their Cohort). "
            "Latency: create returned → QuotaReserved seen on the watch.",
            "",
            "| measure | value |",
            "|---|---|",
            f"| all created | {lat['submit_s']:.1f} s |",
            f"| all admitted | {lat['all_admitted_s']:.1f} s "
            f"({lat['workloads'] / lat['all_admitted_s']:.0f} Workloads/s) |",
            f"| latency p50 | {lat['p50_s']:.2f} s |",
            f"| latency p99 | {lat['p99_s']:.2f} s |",
            f"| latency max | {lat['max_s']:.2f} s |",
            f"| controller RSS before / after / peak | {lat['rss_before_mb']:.0f} / "
            f"{lat['rss_after_mb']:.0f} / {lat['rss_peak_mb']:.0f} MiB |",
            "",
            f"Workloads arrive at {lat['workloads'] / lat['submit_s']:.0f}/s and are admitted "
            f"at {lat['workloads'] / lat['all_admitted_s']:.0f}/s, so the latency is mostly "
            "time spent behind the backlog (one scheduling cycle admits one head per "
            "ClusterQueue, as upstream). Every Cohort ends exactly full (2,500 CPU), the "
            "queues with more demand than nominal quota borrowing what the others leave "
            "(usage in kueue_admission.json).",
        ]
    return lines
