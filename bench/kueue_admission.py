"""Benchmark: Kueue admission throughput for 1,000 Jobs submitted at once.

One run on a dedicated cluster (its own name and ports, addon ``kueue``), the same
1,000 one-pod Jobs twice, each time into an empty namespace:

- unqueued (no queue-name label; the Job webhook lets them through unchanged): time from
  the first create to all 1,000 pods created by the Job controller, and to all Running;
- queued (LocalQueue on a ClusterQueue with quota for all of them): time to all
  Workloads admitted (QuotaReserved), all Jobs unsuspended, and all pods created.

The ratio queued-unsuspended / unqueued-pods-created is what queueing costs before a
Job may start. Every time is taken from watch events as they arrive (demos.kueue.Watched).
Pods ask for 100m CPU (1,000 GPUs would need 125 simulated 8-GPU nodes); kwok keeps them
Running for an hour, so nothing completes during a measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from demos import kueue as demo
from gpulab.kueue import api as kueue
from gpulab.wait import wait_for
from harness.local import LocalCluster
from harness.spec import parse

JOBS = 1000
CPU_PER_JOB = "100m"
TIMEOUT = 900.0
SPEC = {
    "name": "gpulab-bench-kueue",
    "ports": {
        "apiserver": 44443,
        "etcd": 44379,
        "etcdPeer": 44380,
        "controllerManager": 44257,
        "scheduler": 44259,
    },
    "addons": ["kueue"],
    "nodes": [{"name": "node", "count": 10, "cpu": "128", "pods": "250"}],
}
Obj = dict[str, Any]


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

    def all_reached(self, milestone: str, start: float) -> float | None:
        """Seconds from ``start`` until the last of the Jobs' objects got there."""
        times = self.reached[milestone]
        return max(times.values()) - start if len(times) == JOBS else None


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
                lambda i: batch.create_namespaced_job(ns, job(f"job-{i:04d}", queue)), range(JOBS)
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
    core = client.CoreV1Api(api)
    with demo.Watched(core.list_namespaced_pod, ns, on_event=pods):
        t0, submit_s = _submit(api, ns, None)
        created = wait_for(lambda: pods.all_reached("created", t0), TIMEOUT, "all pods created")
        running = wait_for(lambda: pods.all_reached("running", t0), TIMEOUT, "all pods Running")
    _delete_namespace(api, ns)
    return {"submit_s": submit_s, "pods_created_s": created, "pods_running_s": running}


def queued(api: client.ApiClient) -> dict[str, float]:
    ns = "bench-queued"
    _fresh_namespace(api, ns)
    cq = "bench"
    quota = f"{JOBS * 100}m"  # exactly enough for every Job at once
    # a flavor without node labels: the pods may go to any node, as the unqueued ones
    demo.create(
        api, {"apiVersion": kueue.API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": cq}}
    )
    demo.create(api, demo.cluster_queue(cq, ns, quota, cq, resource="cpu"))
    demo.create(api, demo.local_queue("bench", ns, cq))
    custom = client.CustomObjectsApi(api)
    workloads = Milestones({"admitted": _admitted})
    jobs = Milestones({"unsuspended": _unsuspended})
    pods = Milestones({"created": lambda _p: True})
    with (
        demo.Watched(
            custom.list_namespaced_custom_object,
            kueue.GROUP,
            kueue.VERSION,
            ns,
            "workloads",
            on_event=workloads,
        ),
        demo.Watched(client.BatchV1Api(api).list_namespaced_job, ns, on_event=jobs),
        demo.Watched(client.CoreV1Api(api).list_namespaced_pod, ns, on_event=pods),
    ):
        t0, submit_s = _submit(api, ns, "bench")
        admitted = wait_for(
            lambda: workloads.all_reached("admitted", t0), TIMEOUT, "all Workloads admitted"
        )
        unsuspended = wait_for(
            lambda: jobs.all_reached("unsuspended", t0), TIMEOUT, "all Jobs unsuspended"
        )
        created = wait_for(lambda: pods.all_reached("created", t0), TIMEOUT, "all pods created")
    return {
        "submit_s": submit_s,
        "admitted_s": admitted,
        "unsuspended_s": unsuspended,
        "pods_created_s": created,
    }


def run() -> dict[str, Any]:
    local = LocalCluster(parse(SPEC))
    local.down(lambda _m: None)
    local.up(lambda _m: None)
    try:
        api = local.api()
        plain = unqueued(api)
        with_kueue = queued(api)
    finally:
        local.down(lambda _m: None)
    return {
        "jobs": JOBS,
        "nodes": len(local.spec.nodes),
        "unqueued": plain,
        "queued": with_kueue,
        "ratio_unsuspended_to_unqueued_pods": with_kueue["unsuspended_s"] / plain["pods_created_s"],
        "ratio_pods_created": with_kueue["pods_created_s"] / plain["pods_created_s"],
    }


def section(data: dict[str, Any]) -> list[str]:
    """This benchmark's part of REPORT.md."""
    u, q = data["unqueued"], data["queued"]
    return [
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
