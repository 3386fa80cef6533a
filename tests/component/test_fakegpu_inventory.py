"""The harness's prediction of a node's inventory equals what NVML reads through the shim."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from gpulab.fakegpu import inventory, nvml, paths, profiles

NODE = "gpu-node-1"

READ = """
import json
from dataclasses import asdict
from gpulab.deviceplugin import nvml
nvml.init()
print(json.dumps([asdict(g) for g in nvml.read_inventory()]))
"""


@pytest.fixture(scope="module")
def shim() -> Path:
    subprocess.run(["make", "-s", "-C", str(paths.SHIM_DIR)], check=True)
    return paths.SHIM_LIB


def _normalise(data: object) -> object:
    """JSON turns int keys and tuples into strings and lists; do the same to both sides."""
    return json.loads(json.dumps(data))


@pytest.mark.parametrize("name", profiles.available())
def test_prediction_equals_the_nvml_read(shim: Path, tmp_path: Path, name: str) -> None:
    env = {**nvml.shim_env(NODE, name, tmp_path)}
    import os

    proc = subprocess.run(
        [sys.executable, "-c", READ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    read = json.loads(proc.stdout)
    predicted = [asdict(g) for g in inventory.gpu_infos(profiles.load(name), NODE)]
    assert read == _normalise(predicted)
