"""`gpulab device-plugin` / `config-manager` / `node-agent` argument checks (one-line
errors, exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.cli import main


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("KUBERNETES_SERVICE_HOST", "NODE_NAME", "MIG_STRATEGY", "CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)


def _run(tmp_path: Path, *args: str) -> int:
    return main(["device-plugin", "--node-name", "n1", "--socket-dir", str(tmp_path), *args])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--mig-strategy", "auto"],
            "unknown MIG strategy 'auto'; use one of: none, single, mixed",
        ),
        (["--shared-devices-allocation-policy", "x"], "invalid --shared-devices-allocation-policy"),
        (["--hami"], "--hami reads and writes HAMi's annotations: pass --kubeconfig"),
    ],
)
def test_device_plugin_rejects_bad_flags(args, message, tmp_path: Path, capsys) -> None:
    assert _run(tmp_path, *args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpulab: error: ") and message in err
    assert "\n" not in err


def test_a_bad_hami_node_config_fails_before_nvml(tmp_path: Path, capsys) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: "
        "'https://127.0.0.1:1'}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\nusers: [{name: u, user: {token: t}}]\n"
    )
    bad = tmp_path / "config.json"
    bad.write_text('{"nodeconfig": [{"name": "n1", "operatingmode": "mps"}]}')
    args = ("--hami", "--kubeconfig", str(kubeconfig), "--node-config-file", str(bad))
    assert _run(tmp_path, *args) == 2
    err = capsys.readouterr().err.strip()
    assert f"{bad}: node n1: operatingmode 'mps' is not simulated" in err


def test_a_bad_config_file_fails_before_nvml(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}")
    assert _run(tmp_path, "--config-file", str(bad)) == 2
    err = capsys.readouterr().err
    assert f"{bad}: sharing.timeSlicing.resources[0].replicas: number of replicas" in err
    assert _run(tmp_path, "--config-file", str(tmp_path / "missing.yaml")) == 2
    assert "unable to load config" in capsys.readouterr().err


def test_mig_strategy_from_the_environment_is_checked(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIG_STRATEGY", "weird")
    assert _run(tmp_path) == 2
    assert "unknown MIG strategy 'weird'" in capsys.readouterr().err


def test_device_plugin_needs_a_node_name(tmp_path: Path, capsys) -> None:
    assert main(["device-plugin", "--socket-dir", str(tmp_path)]) == 2
    assert "--node-name is required (or set $NODE_NAME)" in capsys.readouterr().err


def test_socket_dir_must_exist(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope"
    assert main(["device-plugin", "--node-name", "n1", "--socket-dir", str(missing)]) == 2
    assert f"--socket-dir {missing} is not a directory" in capsys.readouterr().err
    code = main(
        ["node-agent", "--node-name", "n1", "--socket-dir", str(missing), "--kubeconfig", "k"]
    )
    assert code == 2
    assert "is not a directory" in capsys.readouterr().err


def test_config_manager_runs_as_an_init_step_only(tmp_path: Path, capsys) -> None:
    args = ["config-manager", "--node-name", "n1", "--config-file-srcdir", str(tmp_path),
            "--config-file-dst", str(tmp_path / "c.yaml")]  # fmt: skip
    assert main(args) == 2
    assert "pass --oneshot" in capsys.readouterr().err
    assert main(["config-manager", "--oneshot", "--node-name", "n1"]) == 2
    assert "invalid <config-file-srcdir>" in capsys.readouterr().err
