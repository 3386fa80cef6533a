"""The kind and k3d backends: the same lab in Docker containers, for a workshop laptop.

Written to kind's and k3d's documentation; they cannot run where this lab is developed
(no Docker engine), so what is verified there is the exact command sequence
(tests/unit/test_harness_docker.py) and every manifest against the local backend's real
API server. On a laptop with Docker:

    kind: docker build → kind create cluster --config kind-config.yaml → kind load
          docker-image → apply manifests/base and device-plugin → wait for nodes;
          a chapter's demo then applies its manifests/<chapter>/ (ensure_addon), each
          webhook Service with a serving-cert Secret and caBundle from the harness's CA
    k3d:  docker build → k3d cluster create --config <rendered> → k3d kubeconfig write
          → k3d image import → apply manifests/ → wait for nodes

Each worker node carries its GPU profile as a file mounted at
``/etc/fake-gpu/profile.yaml`` (kind extraMounts, k3d volumes) and the label
``gpulab.io/spec-node`` naming the spec node it stands for.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from gpulab.fakegpu import profiles
from gpulab.state import cluster_dir
from gpulab.wait import WaitTimeout, wait_for
from harness import pki
from harness.backends import SYSTEM_NAMESPACE, ClusterAPI, ready_nodes
from harness.errors import HarnessError
from harness.spec import PROFILE_MOUNT, ClusterSpec

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "gpulab:dev"
K3S_IMAGE = "rancher/k3s:v1.36.3-k3s1"

Runner = Callable[[Sequence[str]], None]
Progress = Callable[[str], None]


def run_command(argv: Sequence[str]) -> None:
    """Run a tool, streaming its output (docker build and kind show their own progress)."""
    proc = subprocess.run(list(argv), cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise HarnessError(f"`{' '.join(argv)}` failed with exit code {proc.returncode}")


def _worker_labels(node: Any) -> dict[str, str]:
    labels = {"gpulab.io/spec-node": node.name, **node.labels}
    if node.profile:
        labels["gpulab.io/gpu-profile"] = profiles.load(node.profile).name
        labels["nvidia.com/gpu.present"] = "true"
    return labels


def _profile_path(node: Any, relative: bool) -> str:
    path = profiles.resolve(node.profile)
    return f"./{path.relative_to(ROOT)}" if relative else str(path)


def kind_config(spec: ClusterSpec, relative_paths: bool = True) -> dict[str, Any]:
    """kind's Cluster config (kind.x-k8s.io/v1alpha4) for a spec: one worker per node."""
    nodes: list[dict[str, Any]] = [{"role": "control-plane"}]
    for node in spec.nodes:
        worker: dict[str, Any] = {"role": "worker", "labels": _worker_labels(node)}
        if node.profile:
            worker["extraMounts"] = [
                {
                    "hostPath": _profile_path(node, relative_paths),
                    "containerPath": PROFILE_MOUNT,
                    "readOnly": True,
                }
            ]
        nodes.append(worker)
    return {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": spec.name,
        "nodes": nodes,
    }


def k3d_config(spec: ClusterSpec) -> dict[str, Any]:
    """k3d's Simple config (k3d.io/v1alpha5): agent i stands for spec node i."""
    volumes, labels = [], []
    for i, node in enumerate(spec.nodes):
        if node.profile:
            volumes.append(
                {
                    "volume": f"{_profile_path(node, False)}:{PROFILE_MOUNT}",
                    "nodeFilters": [f"agent:{i}"],
                }
            )
        labels += [
            {"label": f"{k}={v}", "nodeFilters": [f"agent:{i}"]}
            for k, v in _worker_labels(node).items()
        ]
    return {
        "apiVersion": "k3d.io/v1alpha5",
        "kind": "Simple",
        "metadata": {"name": spec.name},
        "servers": 1,
        "agents": len(spec.nodes),
        "image": K3S_IMAGE,
        "volumes": volumes,
        "options": {
            "k3s": {"nodeLabels": labels},
            "kubeconfig": {"updateDefaultKubeconfig": False, "switchCurrentContext": False},
        },
    }


class DockerCluster(ClusterAPI):
    """kind or k3d, chosen by ``tool``; ``runner`` is injectable so tests see the commands."""

    def __init__(self, tool: str, spec: ClusterSpec, runner: Runner = run_command) -> None:
        if tool not in ("kind", "k3d"):
            raise HarnessError(f"unknown Docker backend {tool!r}")
        self.tool = tool
        self.spec = spec
        self.run = runner
        self.dir = cluster_dir(spec.name)
        self.kubeconfig = self.dir / "kubeconfig"

    def commands_up(self) -> list[list[str]]:
        """The exact commands `up` runs, in order."""
        build = ["docker", "build", "-t", IMAGE, "-f", str(ROOT / "Dockerfile"), str(ROOT)]
        name = self.spec.name
        if self.tool == "kind":
            return [
                build,
                [
                    "kind",
                    "create",
                    "cluster",
                    "--name",
                    name,
                    "--config",
                    str(self.dir / "kind-config.yaml"),
                    "--kubeconfig",
                    str(self.kubeconfig),
                    "--wait",
                    "120s",
                ],
                ["kind", "load", "docker-image", IMAGE, "--name", name],
            ]
        return [
            build,
            ["k3d", "cluster", "create", "--config", str(self.dir / "k3d-config.yaml"), "--wait"],
            ["k3d", "kubeconfig", "write", name, "--output", str(self.kubeconfig)],
            ["k3d", "image", "import", IMAGE, "--cluster", name],
        ]

    def commands_down(self) -> list[list[str]]:
        if self.tool == "kind":
            return [
                [
                    "kind",
                    "delete",
                    "cluster",
                    "--name",
                    self.spec.name,
                    "--kubeconfig",
                    str(self.kubeconfig),
                ]
            ]
        return [["k3d", "cluster", "delete", self.spec.name]]

    def write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.tool == "kind":
            path = self.dir / "kind-config.yaml"
            path.write_text(
                yaml.safe_dump(kind_config(self.spec, relative_paths=False), sort_keys=False)
            )
        else:
            path = self.dir / "k3d-config.yaml"
            path.write_text(yaml.safe_dump(k3d_config(self.spec), sort_keys=False))
        return path

    def check_tools(self, which: Callable[[str], str | None] = shutil.which) -> None:
        for tool in ("docker", self.tool):
            if which(tool) is None:
                raise HarnessError(
                    f"`{tool}` is not on PATH; the {self.tool} backend needs Docker and "
                    f"{self.tool} (see README: Backends), or use --backend local"
                )

    def up(self, progress: Progress) -> None:
        self.check_tools()
        self.write_config()
        for argv in self.commands_up():
            progress(f"$ {' '.join(argv)}")
            self.run(argv)
        pki.create_ca(self.pki_dir())
        self._apply(["base", "device-plugin"], progress)
        self._wait_nodes(progress)

    def ensure_addon(self, name: str, progress: Progress) -> None:
        """Deploy a chapter's components (manifests/<name>/) on the running cluster."""
        if name == "device-plugin":
            return  # the DaemonSet is part of `up`
        if name == "hami":
            # HAMi needs the device plugin in HAMi mode on its nodes; the DaemonSet here
            # runs the NVIDIA mode, so the chapter has its own local cluster (--spec hami)
            raise HarnessError(
                "the HAMi chapter runs on the local backend (`--backend local --spec hami`)"
            )
        self._apply([name], progress)

    def _apply(self, dirs: list[str], progress: Progress) -> None:
        from harness.apply import MANIFESTS

        self.apply([MANIFESTS / d for d in dirs], progress)

    def apply(self, paths: list[Path], progress: Progress) -> None:
        """Apply manifests with serving-cert Secrets and caBundles from our CA."""
        from harness.apply import ServiceTransform, apply

        ca = pki.KeyPair(self.pki_dir() / "ca.crt", self.pki_dir() / "ca.key")
        apply(self.api(), paths, progress, ServiceTransform(ca, self.pki_dir()))

    def pki_dir(self) -> Path:
        path = self.dir / "pki"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _wait_nodes(self, progress: Progress) -> None:
        want = len(self.spec.nodes) + 1  # the workers and the control plane
        seen: list[int] = []

        def all_ready() -> bool:
            ready = len(ready_nodes(self.api()))
            if not seen or seen[-1] != ready:
                seen.append(ready)
                progress(f"nodes Ready: {ready}/{want}")
            return ready == want

        try:
            wait_for(all_ready, 300, "nodes", interval=5)
        except WaitTimeout:
            raise HarnessError(
                f"{self.tool} nodes not Ready after 300s; see `kubectl get nodes`"
            ) from None

    def down(self, progress: Progress) -> None:
        for argv in self.commands_down():
            progress(f"$ {' '.join(argv)}")
            self.run(argv)

    def running(self) -> bool:
        return self.kubeconfig.exists()

    def processes(self) -> list[Any]:
        return []  # the components are pods in the node containers

    def _fake_gpu(self, node: str, *args: str) -> None:
        """`gpulab fake-gpu ...` inside the node's device-plugin pod, where the shim's
        state is (the DaemonSet's /var/lib/fake-gpu)."""
        from kubernetes.stream import stream

        pods = self.component_pods("gpulab-device-plugin", self._worker(node))
        if not pods:
            raise HarnessError(f"no device-plugin pod runs on {node}; fault injection needs it")
        command = ["gpulab", "fake-gpu", *args, "--node", self._worker(node)]
        command += ["--state-dir", "/var/lib/fake-gpu"]
        core = client.CoreV1Api(self.api())
        stream(
            core.connect_get_namespaced_pod_exec,
            pods[0].metadata.name,
            SYSTEM_NAMESPACE,
            container="device-plugin",
            command=command,
            stderr=True,
            stdout=True,
            stdin=False,
            tty=False,
        )

    def _worker(self, node: str) -> str:
        """The kind/k3d node standing for spec node ``node`` (label gpulab.io/spec-node)."""
        nodes = (
            client.CoreV1Api(self.api())
            .list_node(label_selector=f"gpulab.io/spec-node={node}")
            .items
        )
        if not nodes:
            raise HarnessError(f"no {self.tool} node stands for spec node {node!r}")
        return str(nodes[0].metadata.name)

    def inject_fault(self, node: str, gpu: int, xid: int) -> None:
        self._fake_gpu(node, "inject", "--gpu", str(gpu), "--xid", str(xid))

    def clear_faults(self, node: str, gpu: int | None = None) -> None:
        self._fake_gpu(node, "clear", *(["--gpu", str(gpu)] if gpu is not None else []))
