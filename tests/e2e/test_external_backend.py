"""The external backend against an existing cluster: a local-backend cluster of CPU-only
nodes stands for it. `gpulab up --backend external --kubeconfig` deploys the chapters,
leaves what was there alone, skips the device plugin where NVIDIA's runs; `down` removes
exactly what `up` created."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.external import ExternalCluster, Ref
from harness.pytest_plugin import GpulabManager, LabOptions, lab_cluster
from harness.spec import load

# the "existing cluster" is a local-backend cluster this test brings up (ports: block 27xxx)
pytestmark = pytest.mark.local_backend

HOST = {
    "name": "gpulab-ext-host",
    "ports": {
        "apiserver": 29443,
        "etcd": 29379,
        "etcdPeer": 29380,
        "controllerManager": 29257,
        "scheduler": 29259,
    },
    "nodes": [{"name": "cpu", "count": 2}],
}
# What is deployed onto it: nodes are not used by the external backend, addons are.
GUEST = {"name": "gpulab-ext-guest", "addons": ["device-plugin", "kueue"], "nodes": [{"name": "x"}]}


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpulabManager]:
    path = tmp_path_factory.mktemp("ext") / "host.yaml"
    path.write_text(yaml.safe_dump(HOST))
    with lab_cluster(LabOptions(backend="local"), str(path)) as c:
        yield c


@pytest.fixture
def guest(host: GpulabManager, tmp_path: Path) -> Path:
    path = tmp_path / "guest.yaml"
    path.write_text(yaml.safe_dump(GUEST))
    ExternalCluster(load(path), host.kubeconfig).down(print)  # left by an interrupted run
    return path


def _exists(api: client.ApiClient, ref: Ref) -> bool:
    from kubernetes import dynamic

    try:
        resource = dynamic.DynamicClient(api).resources.get(
            api_version=ref.api_version, kind=ref.kind
        )
        resource.get(name=ref.name, namespace=ref.namespace)
    except ApiException as exc:
        assert exc.status == 404
        return False
    except Exception:  # the CRD is gone, so is its API
        return False
    return True


def _gpulab(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpulab", *args],
        capture_output=True,
        text=True,
        timeout=400,
        env=os.environ,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_up_deploys_the_chapters_and_down_removes_exactly_what_up_created(
    host: GpulabManager, guest: Path
) -> None:
    core = client.CoreV1Api(host.api)
    mine = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="keep-me"), data={"a": "b"})
    core.create_namespaced_config_map("gpulab-system", mine)

    up = _gpulab(
        "up", "--backend", "external", "--kubeconfig", str(host.kubeconfig), "--spec", str(guest)
    )
    assert "base: already on the cluster" in up.stderr  # the host cluster applied it
    ext = ExternalCluster(load(guest), host.kubeconfig)
    created = ext.created()
    kinds = {(r.kind, r.name) for r in created}
    assert ("DaemonSet", "gpulab-device-plugin") in kinds  # no GPU advertised: ours goes on
    assert ("Deployment", "kueue-controller-manager") in kinds
    assert ("CustomResourceDefinition", "clusterqueues.kueue.x-k8s.io") in kinds
    assert ("Secret", "kueue-webhook-service-tls") in kinds
    assert not any(r.kind == "Namespace" and r.name == "gpulab-system" for r in created)
    assert all(_exists(host.api, r) for r in created)

    down = _gpulab("down", "--spec", str(guest))  # the backend and kubeconfig were recorded
    assert f"removed the {len(created)} objects" in down.stderr
    assert not any(_exists(host.api, r) for r in created)
    # what was there before `up` is still there
    assert core.read_namespaced_config_map("keep-me", "gpulab-system").data == {"a": "b"}
    rbac = client.RbacAuthorizationV1Api(host.api)
    assert rbac.read_cluster_role("gpulab-trace-writer")
    assert not ext.running()


def test_the_device_plugin_is_not_deployed_where_nvidias_runs(
    host: GpulabManager, tmp_path: Path
) -> None:
    apps = client.AppsV1Api(host.api)
    nvidia = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"name": "nvidia-device-plugin-ds"}},
            "template": {
                "metadata": {"labels": {"name": "nvidia-device-plugin-ds"}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "containers": [
                        {
                            "name": "nvidia-device-plugin-ctr",
                            "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
                        }
                    ],
                },
            },
        },
    }
    apps.create_namespaced_daemon_set("kube-system", nvidia)
    path = tmp_path / "plugin-only.yaml"
    path.write_text(yaml.safe_dump({**GUEST, "addons": ["device-plugin"]}))
    ext = ExternalCluster(load(path), host.kubeconfig)
    said: list[str] = []
    try:
        ext.up(said.append)
        assert (
            "device-plugin: not deployed, NVIDIA's device plugin runs "
            "(DaemonSet kube-system/nvidia-device-plugin-daemonset)" in said
        )
        assert not apps.list_namespaced_daemon_set(
            "gpulab-system", field_selector="metadata.name=gpulab-device-plugin"
        ).items
        assert ext.created() == []
    finally:
        ext.down(said.append)
        apps.delete_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system")
