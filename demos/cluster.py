"""Demo `cluster`: the ground every chapter stands on.

A GPU pod and a GPU Job go through the real kube-scheduler (Filter by NodeResourcesFit
on ``nvidia.com/gpu``, Score, Bind) onto kwok-simulated GPU nodes; kwok then plays the
kubelet (Running, and Succeeded for the Job's pod) and the real Job controller marks the
Job Complete. Every step is read back from the cluster's own Events as it happens.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kubernetes import client

from demos.common import (
    DemoFailed,
    LiveTrace,
    chapter,
    console,
    ensure_cluster,
    fresh_namespace,
    nodes_table,
    ok,
    say,
)
from gpulab.wait import wait_for

NAMESPACE = "demo-cluster"
IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"


def gpu_pod_spec(
    gpus: int, restart_policy: str = "Always", seconds: int | None = None
) -> client.V1PodSpec:
    """One CUDA container asking for ``gpus``. Where a real kubelet runs it (kind) it lists
    its GPUs and then holds them for ``seconds`` (None: until deleted); on the local
    backend kwok plays that lifetime (pod-complete's delay annotation, see gpu_job)."""
    hold = "exec sleep infinity" if seconds is None else f"sleep {seconds}"
    return client.V1PodSpec(
        restart_policy=restart_policy,
        containers=[
            client.V1Container(
                name="cuda",
                image=IMAGE,
                command=["sh", "-c", f"nvidia-smi -L; {hold}"],
                resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}),
            )
        ],
    )


def gpu_pod(name: str, gpus: int) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace=NAMESPACE), spec=gpu_pod_spec(gpus)
    )


def gpu_job(name: str, gpus: int, seconds: int = 2) -> client.V1Job:
    template = client.V1PodTemplateSpec(
        # how long kwok keeps the pod Running before it "exits 0" (harness/kwok-stages.yaml)
        metadata=client.V1ObjectMeta(
            annotations={"pod-complete.stage.kwok.x-k8s.io/delay": f"{seconds}s"}
        ),
        spec=gpu_pod_spec(gpus, restart_policy="Never", seconds=seconds),
    )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, namespace=NAMESPACE),
        spec=client.V1JobSpec(template=template, backoff_limit=0),
    )


def run(args: argparse.Namespace) -> int:
    api, _spec = ensure_cluster(args)
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    chapter(
        "Chapter 0 - the cluster",
        "A real kube-apiserver, kube-controller-manager and kube-scheduler; kwok plays the\n"
        "kubelet of each simulated GPU node. Node capacity comes from its GPU profile.",
    )
    nodes = nodes_table(api)
    gpu_nodes = {
        n.metadata.name
        for n in nodes
        if int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) > 0
    }
    if not gpu_nodes:
        raise DemoFailed("no node advertises nvidia.com/gpu; check the cluster spec")

    fresh_namespace(api, NAMESPACE)
    with LiveTrace(api, NAMESPACE) as live:
        say("create Pod gpu-pod asking for nvidia.com/gpu: 1")
        core.create_namespaced_pod(NAMESPACE, gpu_pod("gpu-pod", 1))
        pod = wait_for(lambda: _phase(core, "gpu-pod", "Running"), 60, "gpu-pod to be Running")
        live.expect({"Scheduled"}, 30)  # its story told before the Job's
        say("create Job gpu-job (one pod, nvidia.com/gpu: 2, runs 2 s)")
        batch.create_namespaced_job(NAMESPACE, gpu_job("gpu-job", 2))
        job = wait_for(lambda: _job_succeeded(batch, "gpu-job"), 90, "gpu-job to succeed")
        most = max(int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) for n in nodes)
        say(f"create Pod too-big asking for nvidia.com/gpu: {most + 1} (no node has that many)")
        core.create_namespaced_pod(NAMESPACE, gpu_pod("too-big", most + 1))
        live.expect({"Scheduled", "SuccessfulCreate", "Completed", "FailedScheduling"}, 60)
    diagram = getattr(args, "diagram", None)
    if diagram:
        live.write_diagram(Path(diagram))

    console.rule("[bold]outcome")
    if pod.spec.node_name not in gpu_nodes:
        raise DemoFailed(f"gpu-pod landed on {pod.spec.node_name}, which has no GPUs")
    ok(f"gpu-pod was bound by kube-scheduler to {pod.spec.node_name} (has GPUs) and is Running")
    ok(f"gpu-job succeeded ({job.status.succeeded} pod completed)")
    too_big = core.read_namespaced_pod("too-big", NAMESPACE)
    if too_big.spec.node_name:
        raise DemoFailed(f"too-big was bound to {too_big.spec.node_name}")
    why = next(ev.note for ev in live.seen if ev.step == "FailedScheduling")
    ok(f"too-big stays Pending: {why}")
    ok(
        "trace: gpu-pod Scheduled (kube-scheduler) → Pod Running (kwok); gpu-job "
        "SuccessfulCreate (job-controller) → its pod Scheduled → Running → Succeeded → "
        "Completed (job-controller)"
    )
    return 0


def _phase(core: client.CoreV1Api, name: str, phase: str) -> client.V1Pod | None:
    pod = core.read_namespaced_pod(name, NAMESPACE)
    return pod if pod.status.phase == phase else None


def _job_succeeded(batch: client.BatchV1Api, name: str) -> client.V1Job | None:
    job = batch.read_namespaced_job(name, NAMESPACE)
    if job.status.failed:
        raise DemoFailed(f"Job {name} failed: {job.status.conditions}")
    return job if job.status.succeeded else None
