"""The kind and k3d backends cannot run here (no Docker engine): these tests pin the exact
commands they run and the configs they render, to the tools' documented interfaces."""

from pathlib import Path

import pytest
import yaml

from harness.docker import IMAGE, PROFILE_MOUNT, ROOT, DockerCluster, k3d_config, kind_config
from harness.errors import HarnessError
from harness.spec import load


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    return tmp_path / "gpulab" / "gpulab"


def test_kind_up_runs_build_create_load_in_order(state: Path) -> None:
    ran: list[list[str]] = []
    cluster = DockerCluster("kind", load("default"), runner=ran.append)
    assert cluster.commands_up() == [
        ["docker", "build", "-t", IMAGE, "-f", str(ROOT / "Dockerfile"), str(ROOT)],
        [
            "kind",
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
        ["kind", "load", "docker-image", "gpulab:dev", "--name", "gpulab"],
    ]
    assert cluster.commands_down() == [
        ["kind", "delete", "cluster", "--name", "gpulab", "--kubeconfig", str(state / "kubeconfig")]
    ]
    cluster.down(lambda _m: None)
    assert ran == cluster.commands_down()


def test_k3d_up_runs_build_create_kubeconfig_import(state: Path) -> None:
    cluster = DockerCluster("k3d", load("default"), runner=lambda _a: None)
    cmds = cluster.commands_up()
    assert [c[:3] for c in cmds] == [
        ["docker", "build", "-t"],
        ["k3d", "cluster", "create"],
        ["k3d", "kubeconfig", "write"],
        ["k3d", "image", "import"],
    ]
    assert cmds[1][3:] == ["--config", str(state / "k3d-config.yaml"), "--wait"]
    assert cmds[2][3:] == ["gpulab", "--output", str(state / "kubeconfig")]
    assert cmds[3][3:] == [IMAGE, "--cluster", "gpulab"]
    assert cluster.commands_down() == [["k3d", "cluster", "delete", "gpulab"]]


def test_checked_in_kind_config_is_the_rendered_default_spec() -> None:
    checked_in = yaml.safe_load((ROOT / "kind-config.yaml").read_text())
    assert checked_in == kind_config(load("default"))


def test_kind_config_mounts_each_workers_profile(state: Path) -> None:
    cfg = kind_config(load("default"), relative_paths=False)
    assert cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in cfg["nodes"]]
    assert roles == ["control-plane"] + ["worker"] * 5
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
    cluster = DockerCluster("kind", load("default"), runner=lambda _a: None)
    with pytest.raises(HarnessError, match=r"`kind` is not on PATH.*--backend local"):
        cluster.check_tools(which=lambda tool: None if tool == "kind" else "/usr/bin/docker")


def test_hami_on_kind_points_to_the_local_backend(state: Path) -> None:
    cluster = DockerCluster("kind", load("default"), runner=lambda _a: None)
    with pytest.raises(HarnessError, match=r"HAMi chapter runs on the local backend"):
        cluster.ensure_addon("hami", lambda _m: None)


def test_gpulab_backend_overrides_the_docker_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness import backends

    monkeypatch.setattr(backends, "docker_available", lambda: True)
    monkeypatch.setenv("GPULAB_BACKEND", "local")
    assert backends.default_backend() == "local"
    monkeypatch.delenv("GPULAB_BACKEND")
    assert backends.default_backend() == "kind"
    monkeypatch.setenv("GPULAB_BACKEND", "minikube")
    with pytest.raises(HarnessError, match="GPULAB_BACKEND='minikube'"):
        backends.default_backend()
