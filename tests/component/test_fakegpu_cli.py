"""`gpulab fake-gpu ...` commands and the nvidia-smi over the shim."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab import cli
from gpulab.fakegpu import commands, faults, paths
from gpulab.fakegpu.profiles import ProfileError, gpu_uuid, mig_uuid


@pytest.fixture(scope="module", autouse=True)
def shim() -> None:
    subprocess.run(["make", "-s", "-C", str(paths.SHIM_DIR)], check=True)


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    commands.add_commands(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def smi(tmp_path: Path, *argv: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_GPU")}
    proc = subprocess.run(
        [sys.executable, "-m", "gpulab", "fake-gpu", "smi", "--state-dir", str(tmp_path), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_registered_in_the_gpulab_cli() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "fake-gpu" in sub.choices


def test_render_to_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.conf"
    argv = ["fake-gpu", "render", "--profile", "t4-x4", "--node", "n1", "-o", str(out)]
    assert run([*argv, "--state-dir", str(tmp_path)]) == 0
    text = out.read_text()
    assert f"gpu.3.uuid={gpu_uuid('n1', 3)}" in text
    assert f"state_dir={tmp_path.resolve() / 'n1'}" in text
    assert capsys.readouterr().out.strip() == str(out)


def test_inject_clear_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = ["--node", "n1", "--state-dir", str(tmp_path)]
    run(["fake-gpu", "render", "--profile", "t4-x4", *node])
    run(["fake-gpu", "inject", *node, "--gpu", "2", "--off-bus"])
    run(["fake-gpu", "inject", *node, "--gpu", "1", "--xid", "13"])
    run(["fake-gpu", "inject", *node, "--gpu", "0", "--ecc-dbe"])
    out = capsys.readouterr().out
    assert "GPU 2: injected Xid 79 (GPU has fallen off the bus)" in out
    assert "Xid 13 (Graphics Engine Exception) (non-fatal for the device plugin)" in out
    ndir = tmp_path / "n1"
    assert {
        g: [(f.event_type, f.event_data) for f in fs] for g, fs in faults.active(ndir).items()
    } == {
        2: [(faults.EVENT_XID_CRITICAL, 79)],
        1: [(faults.EVENT_XID_CRITICAL, 13)],
        0: [(faults.EVENT_DOUBLE_BIT_ECC, 0), (faults.EVENT_XID_CRITICAL, 48)],
    }
    run(["fake-gpu", "status", *node])
    status = capsys.readouterr().out.splitlines()
    assert status[0].startswith("GPU 0: unhealthy")
    assert status[1].startswith("GPU 1: healthy (Xid 13")
    assert status[2].startswith("GPU 2: unhealthy (Xid 79")
    assert status[3] == "GPU 3: healthy"

    run(["fake-gpu", "clear", *node, "--gpu", "2"])
    assert sorted(faults.active(ndir)) == [0, 1]
    run(["fake-gpu", "clear", *node])
    assert faults.active(ndir) == {}


def test_inject_rejects_unknown_gpu_and_unrendered_node(tmp_path: Path) -> None:
    node = ["--node", "n1", "--state-dir", str(tmp_path)]
    with pytest.raises(ProfileError, match="render"):
        run(["fake-gpu", "inject", *node, "--gpu", "0", "--xid", "79"])
    run(["fake-gpu", "render", "--profile", "t4-x1", *node])
    with pytest.raises(ProfileError, match=r"has 1 GPUs; --gpu must be 0..0"):
        run(["fake-gpu", "inject", *node, "--gpu", "1", "--xid", "79"])
    assert faults.active(tmp_path / "n1") == {}


def test_smi_list_shows_gpus_and_mig_devices(tmp_path: Path) -> None:
    out = smi(tmp_path, "-L", "--profile", "a100-80gb-mig-x8", "--node", "n1").splitlines()
    assert out[0] == f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {gpu_uuid('n1', 0)})"
    assert out[1] == f"  MIG 3g.40gb     Device  0: (UUID: {mig_uuid('n1', 0, 0)})"
    assert out[4] == f"  MIG 1g.10gb     Device  3: (UUID: {mig_uuid('n1', 0, 3)})"
    assert out[5].startswith("GPU 1: ")
    assert len(out) == 8 + 4 * 4 + 4 * 7


def test_smi_table_and_faults(tmp_path: Path) -> None:
    smi(tmp_path, "--profile", "mixed", "--node", "n2")
    faults.inject_xid(tmp_path / "n2", 1, 79)
    table = smi(tmp_path, "--node", "n2")  # the rendered config is reused
    assert "Driver Version: 550.54.15" in table and "CUDA Version: 12.4" in table
    assert table.count("NVIDIA A100-SXM4-40GB") == 2 and table.count("Tesla T4") == 2
    assert "00000000:47:00.0" in table and "0MiB / 15360MiB" in table
    assert "GPU 1: Xid 79 (GPU has fallen off the bus)" in table
    assert "MIG devices" not in table
