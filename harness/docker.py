"""The kind and k3d backends: the same lab in Docker containers, for a workshop laptop.

Written to kind's and k3d's documentation; they cannot run where this lab is developed
(no Docker engine), so what is verified there is the exact command sequence and the Docker
Engine API conversation against a fake engine (tests/unit/test_harness_docker.py), the
rendered kind config against kind's own Go types (tests/component/test_kind_config.py), and
every manifest against the local backend's real API server. On a laptop with Docker:

    kind: build gpulab:dev (Docker Engine API) → kind create cluster --config
          kind-config.yaml → (image present?) kind load docker-image → apply
          manifests/base and device-plugin → wait for nodes; a chapter's demo then
          applies its manifests/<chapter>/ (ensure_addon), each webhook Service with a
          serving-cert Secret and caBundle from the harness's CA
    k3d:  build gpulab:dev → k3d cluster create --config <rendered> → k3d kubeconfig
          write → (image present?) k3d image import → apply manifests/ → wait for nodes

The lab's own Docker work goes through the Docker SDK (the ``docker`` package: engine
detection, image build with streamed progress, image checks); kind and k3d stay CLIs.
Targeted releases: kind v0.33.0 with its published node image for Kubernetes 1.36
(``KIND_NODE_IMAGE``: no v1.36.3 node image was published, v1.36.4 is the nearest, one
patch ahead of the local backend), k3d v5.8 with ``rancher/k3s:v1.36.3-k3s1``.

Each worker node carries its GPU profile as a file mounted at
``/etc/fake-gpu/profile.yaml`` (kind extraMounts, k3d volumes) and the label
``gpulab.io/spec-node`` naming the spec node it stands for.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import docker
import urllib3
import yaml
from docker.errors import APIError, DockerException, ImageNotFound
from kubernetes import client
from kubernetes.utils import parse_quantity

from gpulab.fakegpu import profiles
from gpulab.fakegpu import render as fakegpu_render
from gpulab.nodeagent.topology import MACHINE_INFO, KubeletConfig, MachineInfo
from gpulab.state import cluster_dir
from gpulab.wait import WaitTimeout, wait_for
from harness import addons, pki
from harness.backends import SYSTEM_NAMESPACE, ClusterAPI, ready_nodes
from harness.binaries import KIND, verify
from harness.engine import missing_capabilities
from harness.errors import HarnessError
from harness.spec import PROFILE_MOUNT, ClusterSpec, NodeSpec, node_labels

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "gpulab:dev"
K3S_IMAGE = "rancher/k3s:v1.36.3-k3s1"
KIND_VERSION = "v0.33.0"
CAP_SYS_RESOURCE = 24
# kind v0.33.0's release notes list this image (with its digest, as kind asks images to be
# pinned) for Kubernetes 1.36; kind published no v1.36.3 node image.
KIND_NODE_IMAGE = (
    "kindest/node:v1.36.4@sha256:099e049362a1526b2db71494e1947aae99bd16290d7c895f2b7ea312e3cbfaed"
)
K3D_VERSION = "v5.8"
# kubeadm v1beta4's timeouts (defaults: 1m for an API call, 4m for a component's health):
# on a loaded 2-core machine kube-apiserver took over a minute to answer after kubelet
# started it, and `kubeadm init` gave up creating its first ClusterRoleBinding
INIT_TIMEOUTS = {
    "controlPlaneComponentHealthCheck": "10m0s",
    "kubeletHealthCheck": "10m0s",
    "kubernetesAPICall": "5m0s",
    "etcdAPICall": "5m0s",
}
JOIN_TIMEOUTS = {
    "discovery": "10m0s",
    "tlsBootstrap": "10m0s",
    "kubeletHealthCheck": "10m0s",
    "kubernetesAPICall": "5m0s",
}
API_TIMEOUT = 300.0  # kube-apiserver answering steadily after a restart under load
APPLY_ATTEMPTS = 4

Runner = Callable[[Sequence[str]], None]
Progress = Callable[[str], None]


def run_command(argv: Sequence[str]) -> None:
    """Run a tool, streaming its output (docker build and kind show their own progress)."""
    proc = subprocess.run(list(argv), cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise HarnessError(f"`{' '.join(argv)}` failed with exit code {proc.returncode}")


# ---------------------------------------------------------------- Docker Engine API


def engine(timeout: float = 10) -> docker.DockerClient:
    """A client for the Docker engine ($DOCKER_HOST, else the default socket); raises
    HarnessError with the reason when no engine answers. ``timeout`` bounds each call:
    image builds and commits take minutes."""
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        return docker.from_env(timeout=timeout)  # asks the engine its API version
    except DockerException as exc:
        reason = str(exc).split("(Caused by", 1)[0].strip().rstrip(":")
        raise HarnessError(f"no Docker engine answers at {where}: {reason}") from None


def engine_status() -> tuple[bool, str]:
    """(True, "Docker Engine 27.1.1 (API 1.46)") or (False, why none answers)."""
    try:
        client = engine()
        version = client.version()
    except (HarnessError, DockerException) as exc:
        return False, str(exc)
    return True, f"Docker Engine {version.get('Version')} (API {version.get('ApiVersion')})"


def build_image(
    client: docker.DockerClient, progress: Progress, context: Path = ROOT, tag: str = IMAGE
) -> str:
    """Build ``context``'s Dockerfile and tag it ``tag``, streaming the build's own
    output as progress; returns the image ID."""
    progress(f"building {tag} from {context / 'Dockerfile'}")
    try:
        stream = client.api.build(path=str(context), tag=tag, rm=True, decode=True)
        image_id = _follow_build(stream, progress)
    except APIError as exc:
        raise HarnessError(f"docker build of {tag} failed: {exc.explanation or exc}") from None
    progress(f"built {tag} ({image_id[:19]})")
    return image_id


def _follow_build(stream: Iterable[dict[str, Any]], progress: Progress) -> str:
    """The Engine's build stream: ``stream`` lines are the build's output, ``error`` ends
    it, ``aux.ID`` names the image built."""
    image_id = ""
    for chunk in stream:
        if "error" in chunk:
            detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
            raise HarnessError(f"docker build failed: {detail.strip()}")
        line = (chunk.get("stream") or chunk.get("status") or "").strip()
        if line:
            progress(f"  {line}")
        image_id = chunk.get("aux", {}).get("ID", image_id)
    if not image_id:
        raise HarnessError("docker build ended without naming an image")
    return image_id


def require_image(client: docker.DockerClient, image: str) -> str:
    """The image's ID; a clear error when the engine does not have it."""
    try:
        return str(client.images.get(image).id)
    except ImageNotFound:
        raise HarnessError(
            f"image {image} is not in the Docker engine; build it first "
            f"(`gpulab up` builds {IMAGE}) or `docker pull {image}`"
        ) from None


def _worker_labels(node: NodeSpec) -> dict[str, str]:
    return {"gpulab.io/spec-node": node.name, **node_labels(node)}


def _profile_path(node: Any, relative: bool) -> str:
    path = profiles.resolve(node.profile)
    return f"./{path.relative_to(ROOT)}" if relative else str(path)


# what the Static memory manager reserves on NUMA node 0: kubelet insists that reservedMemory
# adds up to kube-reserved + system-reserved + the hard eviction threshold, so the
# threshold is set to the same amount (kind's evictionHard names no memory signal)
RESERVED_MEMORY = "100Mi"


def kubelet_patch(
    spec: ClusterSpec, cgroup_v1: bool = False, topology: bool = True
) -> dict[str, Any] | None:
    """The spec's kubelet settings as a KubeletConfiguration patch (None: kind's defaults).
    The static CPU manager needs CPUs reserved for the system, the Static memory manager
    memory, as kubelet insists; kubelet 1.35+ refuses a cgroup v1 host unless told not to
    (``failCgroupV1: false``). Without ``topology`` (a host with fewer NUMA nodes than the
    spec's GPUs claim, see ``topology_fits``) the Topology Manager settings are left out."""
    patch: dict[str, Any] = {}
    if spec.kubelet != KubeletConfig() and topology:
        patch = dict(yaml.safe_load(spec.kubelet.to_yaml()))
        if spec.kubelet.cpu_manager_policy == "static":
            patch["reservedSystemCPUs"] = "0"
        if spec.kubelet.memory_manager_policy == "Static":
            patch["reservedMemory"] = [{"numaNode": 0, "limits": {"memory": RESERVED_MEMORY}}]
            patch["evictionHard"] = {"memory.available": RESERVED_MEMORY}
    if cgroup_v1:
        patch = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            **patch,
            "failCgroupV1": False,
        }
    return patch or None


def host_is_cgroup_v1() -> bool:
    return not Path("/sys/fs/cgroup/cgroup.controllers").exists()


def host_numa_nodes() -> int:
    return len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) or 1


def topology_fits(spec: ClusterSpec, numa_nodes: int) -> bool:
    """Whether a real kubelet on this host can honour the spec's Topology Manager settings:
    kind's nodes share the host's NUMA nodes, and a GPU the profile puts on a NUMA node the
    host lacks would fail every pod under single-numa-node (TopologyAffinityError)."""
    wanted = [g.numa_node for n in spec.nodes if n.profile for g in profiles.load(n.profile).gpus]
    return max(wanted, default=0) < numa_nodes


def kind_config(
    spec: ClusterSpec,
    relative_paths: bool = True,
    machine_dir: Path | None = None,
    node_image: str = KIND_NODE_IMAGE,
    cgroup_v1: bool = False,
    restrict_oom_score_adj: bool = False,
    topology: bool = True,
) -> dict[str, Any]:
    """kind's Cluster config (kind.x-k8s.io/v1alpha4) for a spec: one worker per node,
    registered under the spec node's name (kubeadm's ``nodeRegistration.name``), so
    demos and tests address ``gpu-a100`` on every backend.

    Each GPU worker mounts its GPU profile; with ``machine_dir`` (where `up` writes them)
    also the lab's machine file (the node's NUMA layout) where the topology updater reads it.
    The lab's own node image (built offline, harness/images) carries CoreDNS v1.14.3, one
    patch ahead of what kubeadm v1.36.3 names, so kubeadm is told its tag. Where the node
    containers lack CAP_SYS_RESOURCE (``restrict_oom_score_adj``), no process in them may
    lower an OOM score, and runc fails every pod sandbox asking for -998: containerd is
    told to keep scores at or above its own, as kind's entrypoint does for rootless nodes.
    """
    nodes: list[dict[str, Any]] = [{"role": "control-plane", "image": node_image}]
    for node in spec.nodes:
        worker: dict[str, Any] = {
            "role": "worker",
            "image": node_image,
            "labels": _worker_labels(node),
            "kubeadmConfigPatches": [
                yaml.safe_dump(
                    {
                        "kind": "JoinConfiguration",
                        "nodeRegistration": {"name": node.name},
                        "timeouts": JOIN_TIMEOUTS,
                    },
                    sort_keys=False,
                )
            ],
        }
        if node.profile:
            worker["extraMounts"] = [
                {
                    "hostPath": _profile_path(node, relative_paths),
                    "containerPath": PROFILE_MOUNT,
                    "readOnly": True,
                }
            ]
            if machine_dir is not None:
                worker["extraMounts"].append(
                    {
                        "hostPath": str(machine_dir / f"{node.name}.yaml"),
                        "containerPath": f"/var/lib/kubelet/{MACHINE_INFO}",
                        "readOnly": True,
                    }
                )
        nodes.append(worker)
    config: dict[str, Any] = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": spec.name,
        "nodes": nodes,
    }
    patches = [
        yaml.safe_dump({"kind": "InitConfiguration", "timeouts": INIT_TIMEOUTS}, sort_keys=False)
    ]
    patch = kubelet_patch(spec, cgroup_v1, topology)
    if patch is not None:
        patches.append(yaml.safe_dump(patch, sort_keys=False))
    if node_image != KIND_NODE_IMAGE:
        from harness.binaries import COREDNS

        dns = {"kind": "ClusterConfiguration", "dns": {"imageTag": COREDNS.version}}
        patches.append(yaml.safe_dump(dns, sort_keys=False))
    config["kubeadmConfigPatches"] = patches
    if restrict_oom_score_adj:
        config["containerdConfigPatches"] = [
            '[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n'
        ]
    return config


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

    def cli(self) -> str:
        """kind: the binary the lab built from kind's module (harness/binaries.py), else
        one on PATH; k3d: the one on PATH."""
        if self.tool == "kind":
            built = KIND.binary("kind")
            if not verify(KIND):
                return str(built)
        return self.tool

    def commands_up(self) -> list[list[str]]:
        """The exact commands `up` runs, in order, after building the images and before
        loading the lab's (:meth:`commands_load`)."""
        name = self.spec.name
        if self.tool == "kind":
            return [
                [
                    self.cli(),
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
            ]
        return [
            ["k3d", "cluster", "create", "--config", str(self.dir / "k3d-config.yaml"), "--wait"],
            ["k3d", "kubeconfig", "write", name, "--output", str(self.kubeconfig)],
        ]

    def commands_load(self, *images: str, nodes: list[str] | None = None) -> list[str]:
        """``nodes``: the kind node containers to load into (all where None)."""
        images = images or (IMAGE,)
        if self.tool == "kind":
            where = ["--nodes", ",".join(nodes)] if nodes else []
            return [self.cli(), "load", "docker-image", *images, "--name", self.spec.name, *where]
        return ["k3d", "image", "import", *images, "--cluster", self.spec.name]

    def commands_down(self) -> list[list[str]]:
        if self.tool == "kind":
            return [
                [
                    self.cli(),
                    "delete",
                    "cluster",
                    "--name",
                    self.spec.name,
                    "--kubeconfig",
                    str(self.kubeconfig),
                ]
            ]
        return [["k3d", "cluster", "delete", self.spec.name]]

    def write_config(self, node_image: str = KIND_NODE_IMAGE) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.tool == "kind":
            machines = self.dir / "machines"
            machines.mkdir(exist_ok=True)
            for node in self.spec.nodes:
                if node.profile:
                    cpus, memory = int(parse_quantity(node.cpu)), int(parse_quantity(node.memory))
                    info = MachineInfo.of(node.name, node.profile, cpus, memory)
                    (machines / f"{node.name}.yaml").write_text(info.to_yaml())
            path = self.dir / "kind-config.yaml"
            config = kind_config(
                self.spec,
                relative_paths=False,
                machine_dir=machines,
                node_image=node_image,
                cgroup_v1=host_is_cgroup_v1(),
                restrict_oom_score_adj=CAP_SYS_RESOURCE in missing_capabilities(),
                topology=topology_fits(self.spec, host_numa_nodes()),
            )
            path.write_text(yaml.safe_dump(config, sort_keys=False))
        else:
            path = self.dir / "k3d-config.yaml"
            path.write_text(yaml.safe_dump(k3d_config(self.spec), sort_keys=False))
        return path

    def check_tools(self, which: Callable[[str], str | None] = shutil.which) -> None:
        """The Docker CLI (kind and k3d drive it) and, for k3d, k3d on PATH (kind is built
        from its module by the lab)."""
        for tool in ("docker", *(() if self.tool == "kind" else (self.tool,))):
            if which(tool) is None:
                raise HarnessError(
                    f"`{tool}` is not on PATH; the {self.tool} backend needs Docker and "
                    f"{self.tool} (see README: Backends), or use --backend local"
                )

    def up(self, progress: Progress) -> None:
        if self.tool == "kind":
            from harness import images

            built = images.ensure_images(progress, user=self.spec.name)
            self.check_tools()
            self._remove_stale(progress)
            self.write_config(built.node)
            if host_is_cgroup_v1():
                progress("this host runs cgroup v1: kubelet gets failCgroupV1: false")
            if self.spec.kubelet != KubeletConfig() and not topology_fits(
                self.spec, host_numa_nodes()
            ):
                progress(
                    f"this host has {host_numa_nodes()} NUMA node(s), fewer than the spec's "
                    "GPUs sit on: the spec's kubelet Topology Manager settings are left out "
                    "on kind (the local backend's node agent still applies them)"
                )
            to_load = built.load
        else:
            self.check_tools()
            build_image(engine(), progress)
            self.write_config()
            to_load = [IMAGE]
        started = time.monotonic()
        try:
            self._create(progress)
        except HarnessError as exc:
            if self.tool != "kind":
                raise
            # kubeadm init gives up when kube-apiserver restarts during its bootstrap (a
            # liveness probe failing on a loaded machine): kind deletes the nodes, try again
            progress(f"{exc}; creating the cluster once more")
            self._create(progress)
        progress(f"{self.tool} cluster created in {time.monotonic() - started:.0f}s")
        if to_load:  # the lab's node image has them already (harness/images)
            self.load_image(to_load, progress)
        if self.tool == "kind":
            self._install_fake_driver(progress)
        pki.create_ca(self.pki_dir())
        self._wait_api(progress)
        self._apply(["base"], progress)
        self._wait_nodes(progress)
        names = addons.for_real_kubelets(
            list(self.spec.addons), any(n.profile for n in self.spec.nodes)
        )
        if names != list(self.spec.addons):
            progress(
                "the spec deploys no device plugin, and a real kubelet advertises GPUs only "
                "through one: NVIDIA's device plugin (the device-plugin addon) is deployed too"
            )
        addons.start_all(names, self, progress)

    def _create(self, progress: Progress) -> None:
        for argv in self.commands_up():
            progress(f"$ {' '.join(argv)}")
            self.run(argv)

    def node_containers(self) -> dict[str, Any]:
        """kind: the Docker container of each node, by node name (the spec node's name,
        which kubeadm passed to kubelet as --hostname-override; the control plane's is its
        container's name)."""
        found = {}
        for container in engine().containers.list(
            filters={"label": f"io.x-k8s.kind.cluster={self.spec.name}"}
        ):
            _, out = container.exec_run(["cat", "/var/lib/kubelet/kubeadm-flags.env"])
            match = re.search(r"--hostname-override=([\w.-]+)", out.decode(errors="replace"))
            found[match.group(1) if match else container.name] = container
        return found

    def _install_fake_driver(self, progress: Progress) -> None:
        """What a GPU node's driver install leaves on a real host: the NVIDIA device nodes.
        Device specs a plugin returns name them (HAMi's always), and containerd refuses a
        missing one; nothing opens them (NVML is the shim)."""
        containers = self.node_containers()
        for node in self.spec.nodes:
            if not node.profile:
                continue
            made = fakegpu_render.device_nodes(profiles.load(node.profile))
            script = "mkdir -p /dev/nvidia-caps\n" + "\n".join(
                f"[ -e {path} ] || mknod -m 666 {path} c {major} {minor}"
                for path, major, minor in made
            )
            code, out = containers[node.name].exec_run(["sh", "-ec", script])
            if code != 0:
                raise HarnessError(f"creating {node.name}'s device nodes failed: {out.decode()}")
        progress("fake NVIDIA driver: device nodes created on every GPU node")

    def _remove_stale(self, progress: Progress) -> None:
        """A kind cluster of this name whose nodes no longer run (a stopped engine, a
        reboot) cannot be resumed: delete it so `up` starts cold."""
        stale = engine().containers.list(
            all=True, filters={"label": f"io.x-k8s.kind.cluster={self.spec.name}"}
        )
        if stale:
            progress(f"removing the stopped kind cluster {self.spec.name!r} left from before")
            for argv in self.commands_down():
                self.run(argv)

    def ensure_addon(self, name: str, progress: Progress) -> None:
        """Deploy a chapter's components (manifests/<name>/) on the running cluster."""
        addons.start(name, self, progress)

    def _apply(self, dirs: list[str], progress: Progress) -> None:
        from harness.apply import MANIFESTS

        self.apply([MANIFESTS / d for d in dirs], progress)

    def apply(self, paths: list[Path], progress: Progress) -> None:
        """Apply manifests with serving-cert Secrets and caBundles from our CA."""
        from harness.apply import ServiceTransform, apply

        ca = pki.KeyPair(self.pki_dir() / "ca.crt", self.pki_dir() / "ca.key")
        for attempt in range(1, APPLY_ATTEMPTS + 1):
            if attempt > 1:  # up() waited before the first apply; each addon's need not
                self._wait_api(progress)
            try:
                apply(self.api(), paths, progress, ServiceTransform(ca, self.pki_dir()))
                return
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if attempt == APPLY_ATTEMPTS:
                    raise HarnessError(
                        f"kube-apiserver kept dropping connections while applying ({exc}); "
                        "see `docker exec <control-plane> crictl ps -a` for its restarts"
                    ) from None
                # server-side apply is idempotent: apply everything again once it answers
                progress(f"kube-apiserver dropped the connection ({type(exc).__name__}); again")

    def _wait_api(self, progress: Progress) -> None:
        """kube-apiserver answers /readyz three times in a row. kubelet restarts the static
        pod when its liveness probe fails, which a loaded 2-core machine makes happen."""
        streak: list[bool] = []

        def steady() -> bool:
            try:
                self.api().call_api("/readyz", "GET", _preload_content=False, _request_timeout=5)
                streak.append(True)
            except (urllib3.exceptions.HTTPError, OSError, client.ApiException):
                if not streak or streak[-1]:
                    progress("kube-apiserver is not answering; waiting (kubelet restarts it)")
                streak.append(False)
            return streak[-3:] == [True] * 3

        try:
            wait_for(steady, API_TIMEOUT, "kube-apiserver", interval=2)
        except WaitTimeout:
            raise HarnessError(
                f"the {self.tool} cluster's kube-apiserver did not answer steadily for "
                f"{API_TIMEOUT:.0f}s; `gpulab down` and `up` again on a less loaded machine"
            ) from None

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

    def load_image(self, images: list[str], progress: Progress) -> None:
        """`kind load docker-image` / `k3d image import`, once the engine has the images.
        kind: into the workers only (the control plane runs no lab pod: it is tainted)."""
        client = engine()
        for image in images:
            require_image(client, image)
        workers = None
        if self.tool == "kind":
            workers = sorted(
                c.name
                for c in client.containers.list(
                    filters={
                        "label": [
                            f"io.x-k8s.kind.cluster={self.spec.name}",
                            "io.x-k8s.kind.role=worker",
                        ]
                    }
                )
            )
        argv = self.commands_load(*images, nodes=workers)
        progress(f"$ {' '.join(argv)}")
        started = time.monotonic()
        self.run(argv)
        progress(f"loaded {', '.join(images)} in {time.monotonic() - started:.0f}s")

    def down(self, progress: Progress) -> None:
        answers, why = engine_status()
        if not answers:  # the lab's dockerd was stopped with its last cluster: none runs
            progress(f"no {self.tool} cluster {self.spec.name!r} runs ({why})")
            self.kubeconfig.unlink(missing_ok=True)
            return
        for argv in self.commands_down():
            progress(f"$ {' '.join(argv)}")
            self.run(argv)
        self.kubeconfig.unlink(missing_ok=True)
        if self.tool == "kind":
            from harness.engine import release

            release(progress, self.spec.name)

    def running(self) -> bool:
        """The cluster's control plane runs (a kubeconfig alone may outlive the engine)."""
        if not self.kubeconfig.exists():
            return False
        try:
            nodes = engine().containers.list(
                filters={"label": f"io.x-k8s.kind.cluster={self.spec.name}", "status": "running"}
            )
        except HarnessError:
            return False
        return bool(nodes) if self.tool == "kind" else True

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
