"""The kind lane: the chapters on real kubelets and a real container runtime.

One kind cluster (harness/clusters/kind-e2e.yaml: a control plane, gpu-a100 with the NVIDIA
device plugin, gpu-t4 with HAMi's) from the images `make images` built or pulled (kind
v0.33.0, node image v1.36.3 with containerd v2.3.4). Nothing here goes through the local
backend's node agent or kwok: the device plugin registers over kubelet's own socket, and
every pod's container runs in containerd.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import Cluster, fresh_namespace, running_cluster
from kubernetes import client

from demos.cluster import gpu_pod_spec
from gpulab.fakegpu import faults, profiles
from gpulab.wait import wait_for
from harness.addons.device_plugin import COMPONENT
from harness.backends import SYSTEM_NAMESPACE
from harness.binaries import KUBERNETES_VERSION
from harness.pytest_plugin import LabOptions

SPEC = "kind-e2e"
GPU = "nvidia.com/gpu"
A100, T4 = "gpu-a100", "gpu-t4"


@pytest.fixture(scope="module")
def kind() -> Iterator[Cluster]:
    with running_cluster(SPEC, LabOptions(backend="kind")) as cluster:
        yield cluster


@pytest.fixture
def ns(kind: Cluster) -> Iterator[str]:
    """A namespace HAMi's webhook leaves alone (its chart's `hami.io/webhook=ignore`): on
    this cluster HAMi serves gpu-t4 only, and would take every nvidia.com/gpu pod."""
    with fresh_namespace(kind.api, "kind") as name:
        body = {"metadata": {"labels": {"hami.io/webhook": "ignore"}}}
        client.CoreV1Api(kind.api).patch_namespace(name, body)
        yield name


@pytest.fixture
def hami_ns(kind: Cluster) -> Iterator[str]:
    with fresh_namespace(kind.api, "kind-hami") as name:
        yield name


def _allocatable(kind: Cluster, node: str, resource: str = GPU) -> int:
    alloc = client.CoreV1Api(kind.api).read_node(node).status.allocatable or {}
    return int(alloc.get(resource, "0"))


def _node_container(kind: Cluster, node: str) -> str:
    """The Docker container a kind node runs in."""
    return str(kind.backend.node_containers()[node].name)


def _gpu_pod(name: str, node: str, gpus: int) -> client.V1Pod:
    spec = gpu_pod_spec(gpus)
    spec.node_selector = {"kubernetes.io/hostname": node}
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name), spec=spec)


def _running(core: client.CoreV1Api, ns: str, name: str) -> bool:
    return core.read_namespaced_pod(name, ns).status.phase == "Running"


def test_nodes_are_kind_containers_with_real_kubelets(kind: Cluster) -> None:
    nodes = {n.metadata.name: n for n in client.CoreV1Api(kind.api).list_node().items}
    assert set(nodes) == {f"{kind.spec.name}-control-plane", A100, T4}
    for node in nodes.values():
        info = node.status.node_info
        assert info.kubelet_version == KUBERNETES_VERSION
        assert info.container_runtime_version.startswith("containerd://")
        assert node.spec.provider_id.startswith(f"kind://docker/{kind.spec.name}/")
    # no node agent: kubelet's own device manager talks to the plugin
    pods = client.CoreV1Api(kind.api).list_pod_for_all_namespaces().items
    assert not [p for p in pods if "node-agent" in p.metadata.name]


def test_the_device_plugin_registers_with_the_real_kubelet(kind: Cluster) -> None:
    """Allocatable is what the plugin's ListAndWatch reports, through kubelet's socket; the
    plugin is a container crictl lists in the node, and kubectl logs reads it."""
    gpus = len(profiles.load("a100-sxm4-40gb-x8").gpus)
    assert _allocatable(kind, A100) == gpus
    node = _node_container(kind, A100)
    sockets = subprocess.run(
        ["docker", "exec", node, "ls", "/var/lib/kubelet/device-plugins"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert "kubelet.sock" in sockets and "nvidia-gpu.sock" in sockets
    crictl = subprocess.run(
        ["docker", "exec", node, "crictl", "ps", "--name", "device-plugin", "-o", "json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (container,) = json.loads(crictl)["containers"]
    assert container["state"] == "CONTAINER_RUNNING"
    assert container["image"]["userSpecifiedImage"] == "gpulab:dev"
    (pod,) = kind.backend.component_pods(COMPONENT, A100)
    logs = client.CoreV1Api(kind.api).read_namespaced_pod_log(
        pod.metadata.name, SYSTEM_NAMESPACE, container="device-plugin"
    )
    # kubelet calls ListAndWatch only on a plugin whose Register it accepted
    assert "registering nvidia.com/gpu with kubelet" in logs
    assert '"step": "ListAndWatch"' in logs


def test_a_gpu_pod_sees_only_its_gpus(kind: Cluster, ns: str) -> None:
    """Allocate's NVIDIA_VISIBLE_DEVICES reaches the container, and nvidia-smi -L inside
    it (the NVML shim) lists exactly those GPUs, on one NUMA node."""
    core = client.CoreV1Api(kind.api)
    core.create_namespaced_pod(ns, _gpu_pod("pair", A100, 2))
    wait_for(lambda: _running(core, ns, "pair"), 120, "pod pair to run")
    envs = wait_for(lambda: kind.backend.allocation(ns, "pair", "cuda"), 30, "its envs")
    visible = envs["NVIDIA_VISIBLE_DEVICES"].split(",")
    profile = profiles.load("a100-sxm4-40gb-x8")
    by_uuid = {profiles.gpu_uuid(A100, g.index): g for g in profile.gpus}
    assert len(visible) == 2 and set(visible) <= set(by_uuid)
    assert len({by_uuid[u].numa_node for u in visible}) == 1
    listed = kind.backend.exec(ns, "pair", "cuda", ["nvidia-smi", "-L"])
    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", listed) == sorted(
        visible, key=lambda u: by_uuid[u].index
    )
    assert _allocatable(kind, A100) == len(profile.gpus)  # allocatable counts, not usage


def test_an_xid_takes_a_gpu_out_of_the_real_kubelets_allocatable(kind: Cluster) -> None:
    gpus = len(profiles.load("a100-sxm4-40gb-x8").gpus)
    (pod,) = kind.backend.component_pods(COMPONENT, A100)
    core = client.CoreV1Api(kind.api)

    def watching() -> bool:
        logs = core.read_namespaced_pod_log(
            pod.metadata.name, SYSTEM_NAMESPACE, container="device-plugin"
        )
        return "for Xid critical errors" in logs

    wait_for(watching, 60, "the plugin's health check")
    kind.backend.inject_fault(A100, 3, faults.XID_FALLEN_OFF_BUS)
    wait_for(lambda: _allocatable(kind, A100) == gpus - 1, 60, "allocatable to drop by one")
    capacity = client.CoreV1Api(kind.api).read_node(A100).status.capacity
    assert capacity[GPU] == str(gpus)
    kind.backend.clear_faults(A100)
    kind.backend.restart(COMPONENT, A100)
    wait_for(lambda: _allocatable(kind, A100) == gpus, 90, "all GPUs back after a restart")


def test_the_external_backend_deploys_onto_the_kind_cluster_and_removes_it_again(
    kind: Cluster, tmp_path: Path
) -> None:
    """`gpulab up --backend external --kubeconfig` against this kind cluster (real kubelets):
    Kueue's chapter deployed and running in containerd, the device plugin the cluster runs
    left alone, and `down` removing exactly what `up` created."""
    from harness.external import ExternalCluster
    from harness.spec import load

    path = tmp_path / "guest.yaml"
    guest = {
        "name": "gpulab-kind-guest",
        "addons": ["device-plugin", "kueue"],
        "nodes": [{"name": "x"}],
    }
    path.write_text(yaml.safe_dump(guest))
    ext = ExternalCluster(load(path), kind.kubeconfig)
    said: list[str] = []
    try:
        ext.up(said.append)
        created = {(r.kind, r.name) for r in ext.created()}
        assert ("Deployment", "kueue-controller-manager") in created
        assert not any(name == "gpulab-device-plugin" for _, name in created)
        assert any(line.startswith("device-plugin: ") for line in said), said
        pods = client.CoreV1Api(kind.api).list_namespaced_pod("kueue-system").items
        assert any(
            (s.container_id or "").startswith("containerd://") and s.ready
            for p in pods
            for s in p.status.container_statuses or []
        )
    finally:
        ext.down(said.append)
    assert not ext.created()
    apps = client.AppsV1Api(kind.api)
    assert not apps.list_namespaced_deployment("kueue-system").items
    assert apps.read_namespaced_daemon_set(COMPONENT, SYSTEM_NAMESPACE)  # untouched


# ------------------------------------------------------------------ the other chapters


def test_hami_places_a_vgpu_pod_and_its_container_gets_the_limits(
    kind: Cluster, hami_ns: str
) -> None:
    """webhook → hami-scheduler (the stock kube-scheduler) → /filter, /bind → HAMi's device
    plugin's Allocate through the real kubelet: the container gets one T4 and its share,
    and its own nvidia-smi shows HAMi-core's view: the limit as the GPU's memory."""
    from demos import hami as demo
    from gpulab.hami import annotations as ha

    kind.backend.ensure_addon("hami", print)
    api = kind.api
    client.CoreV1Api(api).create_namespaced_pod(hami_ns, demo.vgpu_pod("vgpu", 3000, 30))

    def allocated() -> dict | None:
        pod = demo.read_pod(api, hami_ns, "vgpu")
        return pod if demo.allocated(pod) else None

    pod = wait_for(allocated, 120, "the vGPU pod to be bound and allocated")
    assert pod["spec"]["schedulerName"] == "hami-scheduler"  # the webhook set it
    node, devices = demo.placement(pod)
    assert node == T4
    (card,) = devices
    assert card.usedmem == 3000 and card.usedcores == 30
    core = client.CoreV1Api(api)
    wait_for(lambda: _running(core, hami_ns, "vgpu"), 120, "the vGPU pod to run")
    envs = kind.backend.allocation(hami_ns, "vgpu", "cuda")
    assert envs is not None
    assert envs["NVIDIA_VISIBLE_DEVICES"] == card.uuid
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    # the pod's image is the stand-in (docs/backends.md): its nvidia-smi is the shim's, which
    # applies CUDA_DEVICE_MEMORY_LIMIT_0 as HAMi-core's NVML hook does; nothing allocated
    smi = kind.backend.exec(hami_ns, "vgpu", "cuda", ["nvidia-smi"])
    assert "0MiB / 3000MiB" in smi and demo.smi_total_mib(smi) == [3000], smi
    assert demo.annotations(pod)[ha.BIND_PHASE] == ha.BIND_SUCCESS


def test_kueue_admits_within_quota_and_keeps_the_rest_suspended(kind: Cluster, ns: str) -> None:
    """A ClusterQueue of 2 GPUs: the first 2-GPU Job is admitted (unsuspended, its pod runs
    in containerd), the second waits suspended until the first finishes."""
    from demos import kueue as kq

    kind.backend.ensure_addon("kueue", print)
    api = kind.api
    flavor, cq, lq = f"kind-{ns}", f"kind-{ns}", "team"
    kq.create(api, kq.flavor(flavor))
    kq.create(api, kq.cluster_queue(cq, ns, 2, flavor))
    kq.create(api, kq.local_queue(lq, ns, cq))
    batch = client.BatchV1Api(api)
    try:
        batch.create_namespaced_job(ns, kq.queued_job("first", lq, 2, seconds=20))
        wait_for(lambda: not kq.suspended(api, ns, "first"), 60, "the first Job's admission")
        batch.create_namespaced_job(ns, kq.queued_job("second", lq, 2, seconds=1))
        core = client.CoreV1Api(api)

        def first_runs() -> bool:
            pods = core.list_namespaced_pod(ns, label_selector="job-name=first").items
            return any(p.status.phase == "Running" for p in pods)

        wait_for(first_runs, 120, "the first Job's pod to run")
        assert kq.suspended(api, ns, "second")
        assert kq.reason(kq.workload_of(api, ns, "second"), "QuotaReserved", "False")
        wait_for(lambda: not kq.suspended(api, ns, "second"), 120, "the second Job's turn")
    finally:
        kq.delete_cluster_objects(api, ("ClusterQueue", cq), ("ResourceFlavor", flavor))


def test_volcano_binds_a_gang_whole(kind: Cluster, ns: str) -> None:
    """A vcjob of 3 one-GPU tasks, minAvailable 3: one session binds all three; kubelet runs
    them."""
    from gpulab.volcano import objects as vo
    from gpulab.volcano.apis import BATCH_GROUP, BATCH_VERSION
    from gpulab.volcano.client import VolcanoClient

    kind.backend.ensure_addon("volcano", print)
    task = vo.task("worker", 3, gpus=1, cpu="50m", memory="32Mi")
    task["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": A100}
    job = vo.vcjob("gang", [task], queue="default", min_available=3, namespace=ns)
    vc = VolcanoClient(kind.api)
    vc.create_job(ns, job)
    core = client.CoreV1Api(kind.api)

    def running() -> int:
        pods = core.list_namespaced_pod(ns).items
        return sum(p.status.phase == "Running" and p.spec.node_name == A100 for p in pods)

    try:
        wait_for(lambda: running() == 3, 180, "the gang's three pods to run")
        pods = core.list_namespaced_pod(ns).items
        assert {p.spec.scheduler_name for p in pods} == {"volcano"}
        assert vc.job_phase(ns, "gang") == "Running"
    finally:  # the job controller would recreate the pods the namespace's cleanup deletes
        vc.custom.delete_namespaced_custom_object(BATCH_GROUP, BATCH_VERSION, ns, "jobs", "gang")
