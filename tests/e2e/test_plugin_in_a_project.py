"""The pytest plugin in a user's own project: a throwaway project in tmp_path whose test
uses `gpulab_cluster` (the k8s fixture's API) runs with `pytest -p gpulab` and passes; the
cluster it brought up is down afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from harness.local import LocalCluster
from harness.spec import load

pytestmark = pytest.mark.local_backend

SPEC = {
    "name": "gpulab-plugin-user",
    "ports": {
        "apiserver": 28443,
        "etcd": 28379,
        "etcdPeer": 28380,
        "controllerManager": 28257,
        "scheduler": 28259,
    },
    "addons": ["device-plugin"],
    "nodes": [{"name": "t4", "profile": "t4-x1"}, {"name": "cpu-only"}],
}

USER_TEST = textwrap.dedent(
    """
    import pytest


    @pytest.mark.gpulab(keep=True)
    def test_the_lab_cluster_has_a_gpu_node(gpulab_cluster):
        nodes = gpulab_cluster.kubectl(["get", "nodes"])
        gpus = {
            n["metadata"]["name"]: n["status"]["allocatable"].get("nvidia.com/gpu")
            for n in nodes["items"]
        }
        assert gpus == {"t4": "1", "cpu-only": None}
        gpulab_cluster.wait("node/t4", "condition=Ready", timeout=30)
        assert gpulab_cluster.version() == (1, 36)


    def test_apply_a_dict_and_read_it_back(gpulab_cluster):
        gpulab_cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "hello", "namespace": "default"},
                "data": {"greeting": "hi"},
            }
        )
        cm = gpulab_cluster.kubectl(["get", "configmap", "hello", "-n", "default"])
        assert cm["data"] == {"greeting": "hi"}
        assert "t4" in gpulab_cluster.kubectl(["get", "nodes"], as_dict=False)
    """
)


def test_a_fresh_project_gets_a_lab_cluster_from_the_fixture(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    spec_path = project / "lab.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC))
    (project / "test_lab.py").write_text(USER_TEST)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # only what -p loads
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "gpulab",
            "-q",
            "-s",  # the harness's progress shows which clusters came up
            f"--gpulab-spec={spec_path}",
            "--gpulab-backend=local",
            "test_lab.py",
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout
    # the kept cluster served both tests and was taken down at the end of the session
    assert proc.stdout.count("bringing up cluster 'gpulab-plugin-user'") == 1
    assert LocalCluster(load(spec_path)).processes() == []
