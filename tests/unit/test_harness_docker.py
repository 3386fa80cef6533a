"""The kind and k3d backends' commands and configs, pinned to the tools' documented
interfaces, and the Docker SDK's conversation with a fake Docker Engine: an HTTP server on
a unix socket answering the Engine API (/version, /build streamed in chunks,
/images/<name>/json), so the real SDK client, its transport and our code run unmocked.
The kind backend itself runs for real in tests/e2e/test_kind.py."""

import io
import json
import socketserver
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from harness.docker import (
    IMAGE,
    KIND_NODE_IMAGE,
    PROFILE_MOUNT,
    ROOT,
    DockerCluster,
    build_image,
    engine,
    engine_status,
    k3d_config,
    kind_config,
    topology_fits,
)
from harness.errors import HarnessError
from harness.spec import load

API = "1.45"


class FakeEngine(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The Docker Engine API as the SDK sees it: what it answers is set per test."""

    daemon_threads = True

    def __init__(self, path: Path) -> None:
        self.requests: list[dict[str, Any]] = []
        self.version_status = 200
        self.build_stream: list[dict[str, Any]] = []
        self.images: dict[str, str] = {}  # name -> ID
        super().__init__(str(path), EngineHandler)


class EngineHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeEngine

    def log_message(self, *args: Any) -> None:  # a unix socket has no client address
        pass

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> tuple[str, dict[str, list[str]]]:
        url = urlparse(self.path)
        path = url.path.removeprefix(f"/v{API}")
        body = b""
        if self.headers.get("Content-Length"):
            body = self.rfile.read(int(self.headers["Content-Length"]))
        elif self.headers.get("Transfer-Encoding") == "chunked":
            while size := int(self.rfile.readline().strip(), 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        query = parse_qs(url.query)
        self.server.requests.append(
            {"method": self.command, "path": path, "query": query, "body": body}
        )
        return path, query

    def do_GET(self) -> None:
        path, _ = self._route()
        if path == "/version":
            if self.server.version_status != 200:
                self._json(self.server.version_status, {"message": "engine is starting"})
            else:
                self._json(200, {"Version": "27.3.1", "ApiVersion": API, "Os": "linux"})
        elif path == "/containers/json":  # kind node containers: none in these tests
            self._json(200, [])
        elif path.startswith("/images/") and path.endswith("/json"):
            name = path[len("/images/") : -len("/json")]
            if name in self.server.images:
                self._json(200, {"Id": self.server.images[name], "RepoTags": [name]})
            else:
                self._json(404, {"message": f"No such image: {name}"})
        else:
            self._json(404, {"message": f"page not found: {path}"})

    def do_POST(self) -> None:
        path, query = self._route()
        if path != "/build":
            self._json(404, {"message": f"page not found: {path}"})
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for message in self.server.build_stream:  # one chunk per JSON message, as dockerd
            data = json.dumps(message).encode() + b"\r\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        if not any("error" in m for m in self.server.build_stream):
            self.server.images[query["t"][0]] = "sha256:" + "ab" * 32


@pytest.fixture
def fake_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeEngine]:
    sock = tmp_path / "docker.sock"
    server = FakeEngine(sock)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    return tmp_path / "gpulab" / "gpulab"


def test_kind_up_runs_create_then_load(state: Path, fake_engine: FakeEngine) -> None:
    ran: list[list[str]] = []
    cluster = DockerCluster("kind", load("default"), runner=ran.append)
    kind = cluster.cli()  # the kind the lab built from its module, else the one on PATH
    assert kind == "kind" or kind.endswith("/kind-v0.33.0/kind")
    assert cluster.commands_up() == [
        [
            kind,
            "create",
            "cluster",
            "--name",
            "gpulab",
            "--config",
            str(state / "kind-config.yaml"),
            "--kubeconfig",
            str(state / "kubeconfig"),
            "--wait",
            "120s",
        ],
    ]
    assert cluster.commands_load("gpulab:dev", "x:1") == [
        kind,
        "load",
        "docker-image",
        "gpulab:dev",
        "x:1",
        "--name",
        "gpulab",
    ]
    assert cluster.commands_down() == [
        [kind, "delete", "cluster", "--name", "gpulab", "--kubeconfig", str(state / "kubeconfig")]
    ]
    cluster.down(lambda _m: None)
    assert ran == cluster.commands_down()
    assert not (state / "kubeconfig").exists()


def test_kind_down_without_an_engine_says_no_cluster_runs(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lab stops its dockerd with its last kind cluster: a later `down` says so and runs
    nothing (`kind delete` would fail with a bare exit code)."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'none.sock'}")
    ran: list[list[str]] = []
    state.mkdir(parents=True)
    (state / "kubeconfig").write_text("stale")
    said: list[str] = []
    DockerCluster("kind", load("default"), runner=ran.append).down(said.append)
    assert ran == []
    assert said and said[0].startswith("no kind cluster 'gpulab' runs (no Docker engine answers")
    assert not (state / "kubeconfig").exists()


def test_k3d_up_runs_create_kubeconfig_then_import(state: Path) -> None:
    cluster = DockerCluster("k3d", load("default"), runner=lambda _a: None)
    cmds = cluster.commands_up()
    assert [c[:3] for c in cmds] == [["k3d", "cluster", "create"], ["k3d", "kubeconfig", "write"]]
    assert cmds[0][3:] == ["--config", str(state / "k3d-config.yaml"), "--wait"]
    assert cmds[1][3:] == ["gpulab", "--output", str(state / "kubeconfig")]
    assert cluster.commands_load() == ["k3d", "image", "import", IMAGE, "--cluster", "gpulab"]
    assert cluster.commands_down() == [["k3d", "cluster", "delete", "gpulab"]]


def test_checked_in_kind_config_is_the_rendered_default_spec() -> None:
    checked_in = yaml.safe_load((ROOT / "kind-config.yaml").read_text())
    assert checked_in == kind_config(load("default"))


def test_kind_config_mounts_each_workers_profile(state: Path) -> None:
    cfg = kind_config(load("default"), relative_paths=False)
    assert cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in cfg["nodes"]]
    assert roles == ["control-plane"] + ["worker"] * 5
    assert {n["image"] for n in cfg["nodes"]} == {KIND_NODE_IMAGE}
    assert KIND_NODE_IMAGE.startswith("kindest/node:v1.36.") and "@sha256:" in KIND_NODE_IMAGE
    a100 = cfg["nodes"][1]
    assert a100["labels"]["gpulab.io/spec-node"] == "gpu-a100"
    mount = a100["extraMounts"][0]
    assert mount["containerPath"] == PROFILE_MOUNT
    assert Path(mount["hostPath"]).is_absolute() and Path(mount["hostPath"]).exists()
    assert "extraMounts" not in cfg["nodes"][5]  # cpu-only has no profile


def test_k3d_config_targets_one_agent_per_spec_node() -> None:
    cfg = k3d_config(load("default"))
    assert (cfg["apiVersion"], cfg["kind"], cfg["agents"]) == ("k3d.io/v1alpha5", "Simple", 5)
    assert cfg["volumes"][0]["volume"].endswith(f"a100-sxm4-40gb-x8.yaml:{PROFILE_MOUNT}")
    assert cfg["volumes"][0]["nodeFilters"] == ["agent:0"]
    labels = {(lab["label"], lab["nodeFilters"][0]) for lab in cfg["options"]["k3s"]["nodeLabels"]}
    assert ("gpulab.io/spec-node=cpu-only", "agent:4") in labels


def test_missing_tool_is_one_clear_line(state: Path) -> None:
    cluster = DockerCluster("k3d", load("default"), runner=lambda _a: None)
    with pytest.raises(HarnessError, match=r"`k3d` is not on PATH.*--backend local"):
        cluster.check_tools(which=lambda tool: None if tool == "k3d" else "/usr/bin/docker")
    kind = DockerCluster("kind", load("default"), runner=lambda _a: None)
    kind.check_tools(which=lambda tool: None if tool == "kind" else "/usr/bin/docker")  # built
    with pytest.raises(HarnessError, match=r"`docker` is not on PATH"):
        kind.check_tools(which=lambda tool: None)


def test_kind_workers_register_under_their_spec_node_names() -> None:
    """kubeadm's nodeRegistration.name: `gpu-a100` on kind as on the local backend."""
    cfg = kind_config(load("default"))
    names = [
        yaml.safe_load(n["kubeadmConfigPatches"][0])["nodeRegistration"]["name"]
        for n in cfg["nodes"][1:]
    ]
    assert names == [n.name for n in load("default").nodes]
    assert all(
        yaml.safe_load(n["kubeadmConfigPatches"][0])["kind"] == "JoinConfiguration"
        for n in cfg["nodes"][1:]
    )


def test_the_offline_node_image_names_its_coredns_and_cgroup_v1_hosts_get_failcgroupv1() -> None:
    cfg = kind_config(load("default"), node_image="gpulab/kind-node:v1.36.3", cgroup_v1=True)
    assert {n["image"] for n in cfg["nodes"]} == {"gpulab/kind-node:v1.36.3"}
    init, kubelet, dns = (yaml.safe_load(p) for p in cfg["kubeadmConfigPatches"])
    assert init["timeouts"]["kubernetesAPICall"] == "5m0s"  # kubeadm's 1m ran out under load
    assert kubelet == {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
    }
    assert dns == {"kind": "ClusterConfiguration", "dns": {"imageTag": "v1.14.3"}}
    assert "containerdConfigPatches" not in cfg
    short = kind_config(load("default"), restrict_oom_score_adj=True)  # no CAP_SYS_RESOURCE
    (toml,) = short["containerdConfigPatches"]
    assert toml == '[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n'
    scheduling = kind_config(load("scheduling"), cgroup_v1=True)
    _init, patch = scheduling["kubeadmConfigPatches"]  # one KubeletConfiguration, both settings
    assert yaml.safe_load(patch)["failCgroupV1"] is False
    assert yaml.safe_load(patch)["topologyManagerPolicy"] == "single-numa-node"
    # the Static memory manager refuses to start without memory reserved (kubelet's
    # "you should specify the system reserved memory"): reserved == the eviction threshold
    assert yaml.safe_load(patch)["reservedMemory"] == [
        {"numaNode": 0, "limits": {"memory": "100Mi"}}
    ]
    assert yaml.safe_load(patch)["evictionHard"] == {"memory.available": "100Mi"}
    # a one-NUMA-node host cannot hold GPUs the profiles put on NUMA node 1
    assert not topology_fits(load("scheduling"), numa_nodes=1)
    assert topology_fits(load("scheduling"), numa_nodes=2)
    _init, patch = kind_config(load("scheduling"), cgroup_v1=True, topology=False)[
        "kubeadmConfigPatches"
    ]
    assert yaml.safe_load(patch) == {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
    }


# ---------------------------------------------------------------- the Docker Engine API


def test_engine_detection_names_the_engine(fake_engine: FakeEngine) -> None:
    assert engine_status() == (True, f"Docker Engine 27.3.1 (API {API})")
    assert fake_engine.requests[0]["path"] == "/version"  # the SDK asked for its API version


def test_no_engine_is_one_line_naming_the_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing.sock")
    ok, reason = engine_status()
    assert not ok
    assert reason.startswith(f"no Docker engine answers at unix://{tmp_path}/nothing.sock: ")
    assert "\n" not in reason


def test_an_engine_answering_an_error_is_not_available(fake_engine: FakeEngine) -> None:
    fake_engine.version_status = 500
    ok, reason = engine_status()
    assert not ok and "engine is starting" in reason


def test_local_stays_the_default_where_an_engine_answers(
    fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kind is chosen by name; an engine that answers does not switch demos and tests to it
    (the lab's own dockerd answers once the kind lane has started it)."""
    from harness import backends

    monkeypatch.delenv("GPULAB_BACKEND", raising=False)
    assert backends.default_backend() == "local"
    monkeypatch.setenv("GPULAB_BACKEND", "kind")
    assert backends.default_backend() == "kind"


def _context(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY hello /hello\n")
    (ctx / "hello").write_text("hi\n")
    return ctx


def test_build_streams_the_engines_output_and_tags_the_image(
    fake_engine: FakeEngine, tmp_path: Path
) -> None:
    fake_engine.build_stream = [
        {"stream": "Step 1/2 : FROM scratch\n"},
        {"stream": " ---> \n"},
        {"stream": "Step 2/2 : COPY hello /hello\n"},
        {"aux": {"ID": "sha256:" + "cd" * 32}},
        {"stream": "Successfully tagged gpulab:dev\n"},
    ]
    said: list[str] = []
    image_id = build_image(engine(), said.append, context=_context(tmp_path))
    assert image_id == "sha256:" + "cd" * 32
    assert said[1:5] == [
        "  Step 1/2 : FROM scratch",
        "  --->",
        "  Step 2/2 : COPY hello /hello",
        "  Successfully tagged gpulab:dev",
    ]
    build = next(r for r in fake_engine.requests if r["path"] == "/build")
    assert build["method"] == "POST" and build["query"]["t"] == [IMAGE]
    with tarfile.open(fileobj=io.BytesIO(build["body"])) as tar:  # the context, as sent
        assert sorted(tar.getnames()) == ["Dockerfile", "hello"]


def test_a_failing_build_says_why(fake_engine: FakeEngine, tmp_path: Path) -> None:
    fake_engine.build_stream = [
        {"stream": "Step 1/2 : FROM scratch\n"},
        {"errorDetail": {"message": "COPY failed: file not found"}, "error": "COPY failed"},
    ]
    with pytest.raises(HarnessError, match="docker build failed: COPY failed: file not found"):
        build_image(engine(), lambda _m: None, context=_context(tmp_path))
    assert IMAGE not in fake_engine.images


def test_kind_load_runs_only_once_the_engine_has_the_image(
    fake_engine: FakeEngine, state: Path
) -> None:
    ran: list[list[str]] = []
    cluster = DockerCluster("kind", load("default"), runner=ran.append)
    with pytest.raises(HarnessError, match=r"image gpulab:dev is not in the Docker engine"):
        cluster.load_image([IMAGE], lambda _m: None)
    assert ran == []  # kind load never ran for a missing image
    fake_engine.images[IMAGE] = "sha256:" + "ef" * 32
    cluster.load_image([IMAGE], lambda _m: None)
    assert ran == [cluster.commands_load(IMAGE)]
    assert any(r["path"] == f"/images/{IMAGE}/json" for r in fake_engine.requests)


def test_an_unknown_gpulab_backend_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness import backends

    monkeypatch.setenv("GPULAB_BACKEND", "minikube")
    with pytest.raises(HarnessError, match="GPULAB_BACKEND='minikube'"):
        backends.default_backend()


def test_kind_config_carries_the_specs_kubelet_settings_and_machine_files(tmp_path: Path) -> None:
    """The scheduling chapter's kubelets: Topology Manager settings as a kubeadm patch,
    the lab's machine file (NUMA layout) where the topology updater reads it."""
    spec = load("scheduling")
    cfg = kind_config(spec, relative_paths=False, machine_dir=tmp_path)
    _init, patch = cfg["kubeadmConfigPatches"]
    kubelet = yaml.safe_load(patch)
    assert kubelet["kind"] == "KubeletConfiguration"
    assert kubelet["topologyManagerPolicy"] == "single-numa-node"
    assert kubelet["reservedSystemCPUs"] == "0"  # the static CPU manager requires it
    gpu_worker = next(n for n in cfg["nodes"] if n.get("labels", {}).get("gpulab.io/gpu-profile"))
    machine = tmp_path / f"{gpu_worker['labels']['gpulab.io/spec-node']}.yaml"
    mount = {"hostPath": str(machine), "containerPath": "/var/lib/kubelet/machine.yaml"}
    assert {**mount, "readOnly": True} in gpu_worker["extraMounts"]
    (init,) = kind_config(load("default"))["kubeadmConfigPatches"]  # kind's kubelet defaults
    assert yaml.safe_load(init)["kind"] == "InitConfiguration"


def test_a_named_backend_never_silently_yields_to_the_recorded_one(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPULAB_BACKEND=kind on a cluster name that runs on local is refused in one line (it
    ran the demo on local before); once the local one is down, kind is used."""
    from harness import backends

    spec = load("default")
    state.mkdir(parents=True)
    (state / "backend").write_text("local")
    monkeypatch.setenv("GPULAB_BACKEND", "kind")
    monkeypatch.setattr("harness.local.LocalCluster.running", lambda _self: True)
    with pytest.raises(
        HarnessError, match=r"runs on the local backend, not kind: `gpulab down --spec default`"
    ):
        backends.backend_for(spec)
    assert backends.backend_for(spec, "local")[0] == "local"  # asked for what runs
    monkeypatch.setattr("harness.local.LocalCluster.running", lambda _self: False)
    assert backends.backend_for(spec)[0] == "kind"
    assert not (state / "backend").exists()  # the stopped local record is forgotten
    monkeypatch.delenv("GPULAB_BACKEND")
    (state / "backend").write_text("kind")
    assert backends.backend_for(spec)[0] == "kind"  # unnamed: the one it runs on
