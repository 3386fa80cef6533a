"""The NVML reader's sysfs fallback for the NUMA node (what upstream's GetNumaNode reads)."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from gpulab.deviceplugin import nvml


@pytest.fixture
def no_nvml_numa(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    def unsupported(_handle: object) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetNumaNodeId", unsupported)
    monkeypatch.setattr(nvml, "SYSFS_PCI", tmp_path)
    return tmp_path


def test_numa_node_from_sysfs_when_nvml_has_none(no_nvml_numa: Path) -> None:
    device = no_nvml_numa / "0000:0f:00.0"  # the bus ID without its leading 0000, lowercase
    device.mkdir()
    (device / "numa_node").write_text("1\n")
    assert nvml._numa_node(object(), "00000000:0F:00.0") == 1
    (device / "numa_node").write_text("-1\n")  # no NUMA affinity
    assert nvml._numa_node(object(), "00000000:0F:00.0") is None
    assert nvml._numa_node(object(), "00000000:99:00.0") is None  # no such device
