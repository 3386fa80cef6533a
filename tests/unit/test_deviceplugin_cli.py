"""`gpulab device-plugin` / `gpulab node-agent` argument checks (one-line errors, exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.cli import main


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("NODE_NAME", raising=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--mig-strategy", "auto"],
            "unknown MIG strategy 'auto'; use one of: none, single, mixed",
        ),
        (["--replicas", "0"], "--replicas must be >= 1, got 0"),
        (["--hami", "--mig-strategy", "mixed"], "--hami shares whole GPUs"),
        (["--hami"], "--hami reads and writes HAMi's annotations: pass --kubeconfig"),
        (["--hami-split-count", "0"], "--hami-split-count must be >= 1"),
    ],
)
def test_device_plugin_rejects_bad_flags(args, message, tmp_path: Path, capsys) -> None:
    code = main(["device-plugin", "--node-name", "n1", "--socket-dir", str(tmp_path), *args])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpulab: error: ") and message in err
    assert "\n" not in err


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
