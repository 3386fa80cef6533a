"""The GPU Operator's operands against their real peers, without a cluster: dcgm-exporter
scraped over HTTP, the MIG manager's NVML layer repartitioning GPUs on the shim and the
device plugin's NVML inventory seeing it in the next process, the validator's toolkit
and cuda checks writing their markers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpulab.fakegpu import faults, nvml, paths, profiles
from gpulab.wait import wait_for

NODE = "gpu-node-1"
A100 = "a100-sxm4-40gb-x8"
GPULAB = [str(Path(sys.executable).parent / "gpulab")]


@pytest.fixture(scope="module")
def shim() -> Path:
    subprocess.run(["make", "-s", "-C", str(paths.SHIM_DIR)], check=True)
    assert paths.SHIM_LIB.is_file()
    return paths.SHIM_LIB


def env_for(state_dir: Path, profile: str = A100) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_GPU", "KUBE"))}
    return {**env, **nvml.shim_env(NODE, profile, state_dir)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_exporter(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [*GPULAB, "dcgm-exporter", "-a", f"127.0.0.1:{port}", "-k"],
        env={**env, "NODE_NAME": NODE},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        try:
            return httpx.get(f"{url}/health", timeout=1).text == "OK"
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 30, "dcgm-exporter to serve /health", 0.2)
    except BaseException:
        proc.kill()
        raise
    return proc, url


@pytest.fixture
def exporter(shim: Path, tmp_path: Path) -> Iterator[str]:
    proc, url = start_exporter(env_for(tmp_path))
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def series(text: str, field: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith(field + "{") and "GPU_I_ID" not in line:
            labels, value = line[len(field) + 1 :].rsplit("} ", 1)
            out[dict(kv.split("=", 1) for kv in labels.split(","))["UUID"].strip('"')] = value
    return out


def test_dcgm_exporter_serves_every_gpu_with_dcgm_names_and_follows_xids(
    exporter: str, tmp_path: Path
) -> None:
    text = httpx.get(f"{exporter}/metrics", timeout=5).text
    uuids = {profiles.gpu_uuid(NODE, i) for i in range(8)}
    assert set(series(text, "DCGM_FI_DEV_GPU_TEMP")) == uuids
    assert set(series(text, "DCGM_FI_DEV_FB_FREE").values()) == {"40960"}
    assert set(series(text, "DCGM_FI_DEV_XID_ERRORS").values()) == {"0"}
    assert "DCGM_FI_DEV_SM_CLOCK" not in text  # NVML gives no clocks on the shim
    line = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_FB_USED{"))
    assert line.endswith(" 0") and f'Hostname="{NODE}"' in line and 'device="nvidia0"' in line
    faults.inject_xid(tmp_path / NODE, 5, 48)
    uuid = profiles.gpu_uuid(NODE, 5)

    def xid() -> str:
        return series(httpx.get(f"{exporter}/metrics", timeout=5).text, "DCGM_FI_DEV_XID_ERRORS")[
            uuid
        ]

    wait_for(lambda: xid() == "48", 10, "the Xid in DCGM_FI_DEV_XID_ERRORS")
    assert httpx.get(f"{exporter}/nothing", timeout=5).status_code == 404


def test_dcgm_exporter_on_mig_gpus_has_only_per_instance_rows(shim: Path, tmp_path: Path) -> None:
    """``-d f``: GPUs 0-3 hold 4 MIG devices each, GPUs 4-7 seven: 44 rows per field, every
    one an instance's, none a whole GPU's."""
    proc, url = start_exporter(env_for(tmp_path, "a100-80gb-mig-x8"))
    try:
        text = httpx.get(f"{url}/metrics", timeout=5).text
    finally:
        proc.terminate()
        proc.wait(10)
    rows = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_FB_FREE{")]
    assert len(rows) == 4 * 4 + 4 * 7
    assert all('GPU_I_PROFILE="' in r and 'GPU_I_ID="' in r for r in rows)
    assert not series(text, "DCGM_FI_DEV_GPU_TEMP")  # no whole-GPU row of any field
    profiles_of_gpu0 = sorted(
        r.split('GPU_I_PROFILE="')[1].split('"')[0] for r in rows if r.startswith(
            'DCGM_FI_DEV_FB_FREE{gpu="0",')
    )  # fmt: skip
    assert profiles_of_gpu0 == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    temps = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    assert len(temps) == len(rows)  # the device-wide fields are reported per instance too
    assert "DCGM_FI_DEV_GPU_UTIL" not in text  # NVML has no utilisation per MIG device


def run_python(code: str, env: dict[str, str]) -> object:
    argv = [sys.executable, "-c", textwrap.dedent(code)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_mig_managers_nvml_calls_repartition_and_the_next_plugin_sees_it(
    shim: Path, tmp_path: Path
) -> None:
    env = env_for(tmp_path)
    got = run_python(
        """
        import json
        from gpulab.gpuoperator.migmanager import Nvml
        n = Nvml()
        n.N.nvmlInit()
        before = n.gpus()
        for gpu in before:
            n.set_mode(gpu, True)
        for gpu in n.gpus():
            for _ in range(4):
                n.create(gpu, gpu.profiles["1g.10gb"])
        after = n.gpus()
        print(json.dumps({"before": [[g.mig_capable, g.mig_enabled, g.current] for g in before],
                          "after": [g.current for g in after], "calls": len(n.calls),
                          "profiles": sorted(before[0].profiles)}))
        """,
        env,
    )
    assert got["before"] == [[True, False, {}]] * 8
    assert got["profiles"] == ["1g.10gb", "1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    assert got["after"] == [{"1g.10gb": 4}] * 8
    assert got["calls"] == 8 + 8 * 4 * 2
    # a device plugin started now reads the new layout from NVML
    seen = run_python(
        """
        import json
        from gpulab.deviceplugin import nvml
        nvml.init()
        gpus = nvml.read_inventory()
        print(json.dumps([[g.mig_enabled, sorted(m.profile for m in g.migs)] for g in gpus]))
        """,
        env,
    )
    assert seen == [[True, ["1g.10gb"] * 4]] * 8
    # and clearing puts it back
    got = run_python(
        """
        import json
        from gpulab.gpuoperator.migmanager import Nvml
        n = Nvml()
        n.N.nvmlInit()
        for gpu in n.gpus():
            n.clear(gpu)
            n.set_mode(gpu, False)
        print(json.dumps([[g.mig_enabled, g.current] for g in n.gpus()]))
        """,
        env,
    )
    assert got == [[False, {}]] * 8


def validator(
    component: str, env: dict[str, str], out: Path, *extra: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*GPULAB, "nvidia-validator", "--component", component, "--node-name", NODE,
         "--output-dir", str(out), *extra],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_the_validator_writes_markers_once_the_driver_answers(shim: Path, tmp_path: Path) -> None:
    out, toolkit = tmp_path / "validations", tmp_path / "usr-local-nvidia"
    (toolkit / "toolkit").mkdir(parents=True)
    (toolkit / "toolkit" / "nvidia-container-runtime").write_text("simulated\n")
    env = env_for(tmp_path)
    done = validator("toolkit", env, out, "--toolkit-install-dir", str(toolkit))
    assert done.returncode == 0, done.stderr
    assert (out / "toolkit-ready").exists()
    assert "8 GPU(s) (NVIDIA A100-SXM4-40GB)" in done.stdout
    done = validator("cuda", {**env, "WITH_WORKLOAD": "false"}, out)
    assert done.returncode == 0 and (out / "cuda-ready").exists()
    # no driver (no shim config): no marker, one line saying what is missing
    (out / "cuda-ready").unlink()
    done = validator(
        "cuda", {**env, "WITH_WORKLOAD": "false", "FAKE_GPU_CONFIG": str(tmp_path / "none")}, out
    )
    assert done.returncode == 2 and not (out / "cuda-ready").exists()
    assert done.stderr.strip().splitlines()[-1] == (
        "gpulab: error: cuda is not ready: NVML does not answer"
    )
    done = validator("cuda", env, out)  # WITH_WORKLOAD defaults to true, as upstream
    assert done.returncode == 2
    assert (
        "the lab has no CUDA to run a validation workload with: set WITH_WORKLOAD=false"
        in done.stderr
    )
