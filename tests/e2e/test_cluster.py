"""The local backend is a real cluster: upstream binaries, scheduling outcomes, Jobs, trace."""

from __future__ import annotations

import argparse
import threading

import httpx
import pytest
from golden import assert_shape
from kubernetes import client
from kubernetes.client.rest import ApiException

from demos.cluster import gpu_job, gpu_pod_spec
from gpulab.fakegpu import profiles
from gpulab.trace import ObjectRef, Tracer, follow
from gpulab.wait import wait_for
from harness.apply import apply
from harness.errors import HarnessError


@pytest.mark.local_backend
def test_api_server_reports_the_pinned_version(cluster) -> None:
    version = httpx.get(
        f"{cluster.local.server}/version", verify=cluster.local.admin_ssl_context()
    ).json()
    assert version["gitVersion"] == "v1.36.3"
    assert (version["major"], version["minor"]) == ("1", "36")


def test_nodes_are_ready_with_their_profiles_gpu_capacity(cluster) -> None:
    nodes = {n.metadata.name: n for n in client.CoreV1Api(cluster.api).list_node().items}
    assert set(nodes) == {n.name for n in cluster.spec.nodes}
    for spec_node in cluster.spec.nodes:
        node = nodes[spec_node.name]
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    # whole GPUs, one per GPU in the profile (advertised by the device plugins)
    for name in ("gpu-a100", "gpu-t4-0", "gpu-t4-1"):
        spec_node = next(n for n in cluster.spec.nodes if n.name == name)
        want = str(len(profiles.load(spec_node.profile).gpus))
        assert nodes[name].status.capacity["nvidia.com/gpu"] == want
        assert nodes[name].status.allocatable["nvidia.com/gpu"] == want
    assert "nvidia.com/gpu" not in nodes["cpu-only"].status.capacity


def _pod(name: str, gpus: int) -> client.V1Pod:
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name), spec=gpu_pod_spec(gpus))


def test_gpu_pod_is_bound_to_the_only_node_with_enough_free_gpus(cluster, namespace) -> None:
    core = client.CoreV1Api(cluster.api)
    # only gpu-a100 has 8 GPUs: the real scheduler's NodeResourcesFit must pick it
    core.create_namespaced_pod(namespace, _pod("eight", 8))
    pod = wait_for(
        lambda: (p := core.read_namespaced_pod("eight", namespace)).status.phase == "Running" and p,
        60,
        "pod eight Running",
    )
    assert pod.spec.node_name == "gpu-a100"
    # gpu-a100 is now full, so a 4-GPU pod must go to a T4 node (whole or time-sliced)
    core.create_namespaced_pod(namespace, _pod("four", 4))
    pod = wait_for(
        lambda: (p := core.read_namespaced_pod("four", namespace)).spec.node_name and p,
        60,
        "pod four bound",
    )
    assert pod.spec.node_name in {"gpu-t4-0", "gpu-t4-1", "gpu-t4-shared"}


def test_pod_asking_more_gpus_than_any_node_stays_pending_with_the_reason(
    cluster, namespace
) -> None:
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(namespace, _pod("too-big", 9))

    def failed_event() -> str | None:
        for ev in core.list_namespaced_event(namespace).items:
            if ev.reason == "FailedScheduling" and ev.involved_object.name == "too-big":
                return ev.message
        return None

    message = wait_for(failed_event, 60, "FailedScheduling event")
    assert "Insufficient nvidia.com/gpu" in message
    # the scheduler writes the pod's PodScheduled condition beside its Event: wait for both
    pod = wait_for(
        lambda: (p := core.read_namespaced_pod("too-big", namespace)).status.conditions and p,
        30,
        "the PodScheduled condition",
    )
    assert pod.status.phase == "Pending" and not pod.spec.node_name
    cond = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert (cond.status, cond.reason) == ("False", "Unschedulable")


def test_job_runs_to_succeeded(cluster, namespace) -> None:
    batch = client.BatchV1Api(cluster.api)
    job = gpu_job("train", 1, seconds=1)
    job.metadata.namespace = namespace
    batch.create_namespaced_job(namespace, job)
    done = wait_for(
        lambda: (j := batch.read_namespaced_job("train", namespace)).status.succeeded and j,
        90,
        "Job train to succeed",
    )
    assert done.status.succeeded == 1
    assert any(c.type == "Complete" and c.status == "True" for c in done.status.conditions)


def test_tracer_events_are_read_back_by_the_live_reader(cluster, namespace) -> None:
    tracer = Tracer("e2e-probe", cluster.api)
    ref = ObjectRef("ConfigMap", "probe", namespace)
    tracer.step("Reconcile", ref, "reconciled the probe", generation=1)
    tracer.flush()
    want = ("e2e-probe", "Reconcile", f"ConfigMap {namespace}/probe", "reconciled the probe")
    stop = threading.Event()
    threading.Timer(30, stop.set).start()  # the listing has it already; this bounds a failure
    for ev in follow(cluster.api, namespace, stop):
        if (ev.component, ev.step, ev.regarding, ev.note) == want:
            break
    else:
        raise AssertionError("the Event never arrived")
    stop.set()


@pytest.mark.local_backend
def test_apply_validates_against_the_real_api_server(cluster, namespace, tmp_path) -> None:
    (tmp_path / "ok.yaml").write_text(
        f"""
apiVersion: v1
kind: ConfigMap
metadata: {{name: applied, namespace: {namespace}}}
data: {{k: v}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: plugin, namespace: {namespace}}}
spec:
  selector: {{matchLabels: {{app: p}}}}
  template:
    metadata: {{labels: {{app: p}}}}
    spec: {{containers: [{{name: c, image: gpulab:dev}}]}}
"""
    )
    transform = cluster.local.apply_transform(dry_run_workloads=True)
    applied = apply(cluster.api, [tmp_path / "ok.yaml"], lambda _m: None, transform)
    assert [(a.kind, a.dry_run) for a in applied] == [("ConfigMap", False), ("DaemonSet", True)]
    core, apps = client.CoreV1Api(cluster.api), client.AppsV1Api(cluster.api)
    assert core.read_namespaced_config_map("applied", namespace).data == {"k": "v"}
    with pytest.raises(ApiException) as exc:  # dry-run: validated, not created
        apps.read_namespaced_daemon_set("plugin", namespace)
    assert exc.value.status == 404

    (tmp_path / "bad.yaml").write_text(
        f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: broken, namespace: {namespace}}}
spec: {{selector: {{matchLabels: {{app: a}}}}, template: {{metadata: {{labels: {{app: b}}}}}}}}
"""
    )
    with pytest.raises(HarnessError, match=r"Deployment .*/broken was rejected by the API server"):
        apply(cluster.api, [tmp_path / "bad.yaml"], lambda _m: None, transform)


@pytest.mark.local_backend
def test_cluster_demo_passes_against_this_cluster(cluster, capsys) -> None:
    from demos import cluster as demo

    assert demo.run(argparse.Namespace(spec="e2e", backend="local")) == 0
    assert_shape("cluster", capsys.readouterr().out)  # tests/e2e/golden/cluster.yaml
