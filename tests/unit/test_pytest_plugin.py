"""The plugin's options and marker, in a subprocess pytest run that needs no cluster."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.pytest_plugin import GpulabManager, LabOptions

TESTS = textwrap.dedent(
    """
    import pytest

    @pytest.mark.local_backend
    def test_needs_host_processes():
        pass

    def test_runs_anywhere():
        pass
    """
)


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_x.py").write_text(TESTS)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "gpulab", "-rs", "-q", *args, "test_x.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_local_backend_tests_are_skipped_with_the_reason_on_an_existing_cluster(
    tmp_path: Path,
) -> None:
    proc = _run(tmp_path, "--k8s-kubeconfig-override=/clusters/real.kubeconfig")
    assert proc.returncode == 0, proc.stdout
    assert "1 passed, 1 skipped" in proc.stdout
    assert "needs the local backend's host processes" in proc.stdout
    assert "the existing cluster of /clusters/real.kubeconfig" in proc.stdout


def test_local_backend_tests_are_skipped_on_kind(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--gpulab-backend=kind")
    assert "1 passed, 1 skipped" in proc.stdout
    assert "this run targets the kind backend" in proc.stdout


def test_local_backend_tests_run_on_the_local_backend(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--gpulab-backend=local")
    assert "2 passed" in proc.stdout


def test_an_existing_cluster_means_the_external_backend() -> None:
    assert LabOptions(backend="local", kubeconfig=Path("k")).backend_name == "external"
    assert LabOptions(backend="kind").backend_name == "kind"


def test_the_manager_takes_its_name_from_the_lab_spec() -> None:
    manager = GpulabManager(provider_config="e2e", backend="local")
    assert manager.cluster_name == "gpulab-e2e"
    assert manager.kubeconfig == manager.backend.kubeconfig
    with pytest.raises(HarnessError, match=r"mark it @pytest\.mark\.local_backend"):
        GpulabManager(provider_config="e2e", backend="kind").local  # noqa: B018
