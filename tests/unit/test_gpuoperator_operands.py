"""The pure parts of the operands: dcgm-exporter's exposition and collectors file, GFD's
label bookkeeping, the validator's status files and GPU resource check."""

from __future__ import annotations

import dataclasses
import socket
import types

import pytest

from gpulab.errors import CLIError
from gpulab.gpuoperator import dcgm, gfd, validator

GPU0 = dcgm.Entity(0, "GPU-a", "00000000:07:00.0", "nvidia0", "NVIDIA A100-SXM4-40GB")
GPU1 = dcgm.Entity(1, "GPU-b", "00000000:0F:00.0", "nvidia1", "NVIDIA A100-SXM4-40GB")


def test_metrics_are_rendered_as_dcgm_exporter_renders_them() -> None:
    counters = [c for c in dcgm.default_counters() if c.field in dcgm.READABLE]
    instance = dataclasses.replace(GPU0, mig_profile="1g.10gb", gpu_instance_id=3)
    samples = [
        dcgm.Sample(GPU1, {"DCGM_FI_DEV_GPU_TEMP": 31, "DCGM_FI_DRIVER_VERSION": "550.54.15"}),
        dcgm.Sample(instance, {"DCGM_FI_DEV_FB_USED": 0, "DCGM_FI_DRIVER_VERSION": "550.54.15"}),
    ]
    text = dcgm.render(counters, samples, "gpu-a100")
    base = 'UUID="GPU-a",pci_bus_id="00000000:07:00.0",device="nvidia0",modelName="NVIDIA A100-SXM4-40GB"'  # noqa: E501
    base1 = base.replace("GPU-a", "GPU-b").replace("nvidia0", "nvidia1").replace("07", "0F")
    assert text.splitlines() == [
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).",
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="1",{base1},Hostname="gpu-a100",'
        'DCGM_FI_DRIVER_VERSION="550.54.15"} 31',
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
        f'DCGM_FI_DEV_FB_USED{{gpu="0",{base},GPU_I_PROFILE="1g.10gb",GPU_I_ID="3",'
        'Hostname="gpu-a100",DCGM_FI_DRIVER_VERSION="550.54.15"} 0',
    ]


class FakeNvml:
    """pynvml's calls the Reader makes: GPU 0 holds two MIG devices, GPU 1 none."""

    class NVMLError(Exception):
        pass

    NVML_TEMPERATURE_GPU = 0
    nvmlMemory_v2 = 2

    def __init__(self) -> None:
        self.devices = {
            "gpu0": {"uuid": "GPU-a", "bus": "00000000:07:00.0", "name": GPU0.model, "mb": 40960},
            "gpu1": {"uuid": "GPU-b", "bus": "00000000:0F:00.0", "name": GPU0.model, "mb": 40960},
            "gpu0/1": {"name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "gi": 1, "mb": 19968},
            "gpu0/2": {"name": "NVIDIA A100-SXM4-40GB MIG 1g.10gb", "gi": 5, "mb": 9856},
        }
        self.migs = {"gpu0": ["gpu0/1", "gpu0/2"], "gpu1": []}

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return self.devices[h]["uuid"]

    def nvmlDeviceGetPciInfo(self, h: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(busId=self.devices[h]["bus"])

    def nvmlDeviceGetName(self, h: str) -> str:
        return self.devices[h]["name"]

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        if "/" in h:
            raise self.NVMLError("Not Supported")  # device-wide: asked of the GPU only
        return 30 + int(h[-1])

    def nvmlDeviceGetUtilizationRates(self, h: str) -> types.SimpleNamespace:
        if "/" in h:
            raise self.NVMLError("Not Supported")  # as NVML: none per MIG device
        return types.SimpleNamespace(gpu=7, memory=1)

    def nvmlDeviceGetMemoryInfo(self, h: str, version: int) -> types.SimpleNamespace:
        total = self.devices[h]["mb"] * 2**20
        return types.SimpleNamespace(total=total, free=total, used=0, reserved=0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: str) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: str, j: int) -> str:
        if j >= len(self.migs[h]):
            raise self.NVMLError("Not Found")
        return self.migs[h][j]

    def nvmlDeviceGetGpuInstanceId(self, m: str) -> int:
        return self.devices[m]["gi"]


def test_a_gpu_with_mig_devices_is_seen_only_through_them() -> None:
    """``-d f``: no whole-GPU row for GPU 0, every field per instance; GPU 1 is whole."""
    reader = dcgm.Reader()
    reader.N = FakeNvml()  # type: ignore[assignment]
    reader.last_xid[0] = 43
    rows = {(s.entity.gpu, s.entity.mig_profile, s.entity.gpu_instance_id): s.values
            for s in reader.samples()}  # fmt: skip
    assert list(rows) == [(0, "3g.20gb", 1), (0, "1g.10gb", 5), (1, "", 0)]
    assert rows[(0, "1g.10gb", 5)] == {
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
        "DCGM_FI_DEV_GPU_TEMP": 30,  # its GPU's
        "DCGM_FI_DEV_XID_ERRORS": 43,  # its GPU's
        "DCGM_FI_DEV_FB_FREE": 9856,  # its own
        "DCGM_FI_DEV_FB_USED": 0,
        "DCGM_FI_DEV_FB_RESERVED": 0,
    }
    assert rows[(1, "", 0)]["DCGM_FI_DEV_GPU_UTIL"] == 7
    assert rows[(1, "", 0)]["DCGM_FI_DEV_FB_FREE"] == 40960
    counters = [c for c in dcgm.default_counters() if c.field in dcgm.READABLE]
    text = dcgm.render(counters, reader.samples(), "gpu-a100")
    gpu0 = [line for line in text.splitlines() if line.startswith("DCGM_") and 'gpu="0"' in line]
    assert len(gpu0) == 2 * 5  # temp, xid and the three FB fields, per instance
    assert all('GPU_I_ID="' in line for line in gpu0)


def test_the_default_counters_are_dcgm_exporters_and_name_the_issues_fields() -> None:
    fields = [c.field for c in dcgm.default_counters()]
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                 "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_TEMP"):  # fmt: skip
        assert name in fields and name in dcgm.READABLE
    assert len(fields) == len(set(fields))


def test_a_collectors_file_is_parsed_and_bad_lines_named() -> None:
    text = (
        "# Format\n# DCGM FIELD, Prometheus metric type, help message\n\n"
        "DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).\n"
        "DCGM_FI_DRIVER_VERSION,  label, Driver Version\n"
        'DCGM_FI_DEV_XID_ERRORS,  gauge,"Value of the last ""XID"" error, encountered."\n'
        "DCGM_EXP_XID_ERRORS_COUNT, counter, reported XIDs during last window\n"
        "dcgm_sm_clock, gauge, a legacy name go-dcgm still resolves\n"
        "DCGM_FI_PROF_SM_ACTIVE, gauge, a profiling field: skipped without DCP\n"
    )
    assert [(c.field, c.help) for c in dcgm.parse_counters(text)] == [
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
        ("DCGM_FI_DRIVER_VERSION", "Driver Version"),
        ("DCGM_FI_DEV_XID_ERRORS", 'Value of the last "XID" error, encountered.'),
        ("DCGM_EXP_XID_ERRORS_COUNT", "reported XIDs during last window"),
        ("dcgm_sm_clock", "a legacy name go-dcgm still resolves"),
    ]
    with pytest.raises(CLIError, match="unknown ExporterCounter field 'DCGM_FI_DEV_WARP_SPEED'"):
        dcgm.parse_counters("# x\nDCGM_FI_DEV_WARP_SPEED, gauge, fast\n")
    with pytest.raises(CLIError, match="could not find Prometheus metric type 'gaug'"):
        dcgm.parse_counters("DCGM_FI_DEV_GPU_TEMP, gaug, t\n")
    with pytest.raises(CLIError, match=r"failed to parse line 0 \(`\[DCGM_FI_DEV_GPU_TEMP\]`\)"):
        dcgm.parse_counters("DCGM_FI_DEV_GPU_TEMP\n")
    # an unquoted comma in the help is a fourth field: refused, not joined back
    with pytest.raises(CLIError, match="record on line 2: wrong number of fields"):
        dcgm.parse_counters("DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_FB_USED, gauge, a, b\n")
    with pytest.raises(CLIError, match=r"line 0 .*expected 3 fields"):
        dcgm.parse_counters("DCGM_FI_DEV_FB_USED, gauge, used, in MiB\n")
    # a quote only opens a quoted field at its first character, as Go's csv.Reader reads it
    with pytest.raises(CLIError, match='line 1, column 29: bare " in non-quoted-field'):
        dcgm.parse_counters('DCGM_FI_DEV_FB_USED, gauge, "used, in MiB"\n')
    with pytest.raises(CLIError, match='line 1, column 5: extraneous or missing " in quoted'):
        dcgm.parse_counters('A,"b"c,d\n')
    with pytest.raises(CLIError, match="record on line 4: wrong number of fields"):
        dcgm.parse_counters('# x\n\nA,"b""c",d\n   \n')  # a line of spaces is a record


def test_every_field_of_upstreams_default_counters_is_known_commented_or_not() -> None:
    """etc/default-counters.csv's commented-out rows are fields one may turn on."""
    for name in ("DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
                 "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_RETIRED_PENDING",
                 "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_VBIOS_VERSION",
                 "DCGM_FI_DEV_INFOROM_IMAGE_VER", "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
                 *(c.field for c in dcgm.default_counters())):  # fmt: skip
        assert name in dcgm.field_ids(), name
    assert dcgm.field_ids()["DCGM_FI_DEV_FB_USED"] == 252


@pytest.mark.parametrize(
    ("kubernetes", "remote", "node_name", "host"),
    [
        (True, "nvidia-dcgm:5555", "gpu-a100", "gpu-a100"),
        (False, None, "gpu-a100", "gpu-a100"),
        (False, "nvidia-dcgm:5555", "gpu-a100", "nvidia-dcgm"),
        (False, "[::1]:5555", None, "::1"),
        (True, None, None, socket.gethostname()),
    ],
)
def test_the_hostname_label(
    kubernetes: bool, remote: str | None, node_name: str | None, host: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    if node_name:
        monkeypatch.setenv("NODE_NAME", node_name)
    else:
        monkeypatch.delenv("NODE_NAME", raising=False)
    assert dcgm.hostname(kubernetes, remote) == host


@pytest.mark.parametrize(
    ("value", "address"), [(":9400", ("0.0.0.0", 9400)), ("127.3.4.5:9500", ("127.3.4.5", 9500))]
)
def test_listen_address(value: str, address: tuple) -> None:
    assert dcgm.listen_address(value) == address


def test_a_bad_listen_address() -> None:
    with pytest.raises(CLIError, match="invalid listen address '9400'"):
        dcgm.listen_address("9400")


def test_gfd_keeps_its_labels_and_drops_the_ones_it_no_longer_produces() -> None:
    node = {"nvidia.com/mig-1g.10gb.count": "32", "nvidia.com/gpu.product": "A100",
            "nvidia.com/gpu.deploy.driver": "true"}  # fmt: skip
    annotations = {
        gfd.FEATURE_LABELS_ANNOTATION: "nvidia.com/gpu.product,nvidia.com/mig-1g.10gb.count"
    }
    patch, listed = gfd.label_changes(node, annotations, {"nvidia.com/gpu.product": "A100",
                                                          "nvidia.com/gpu.count": "8"})  # fmt: skip
    assert patch == {"nvidia.com/gpu.count": "8", "nvidia.com/mig-1g.10gb.count": None}
    assert listed == "nvidia.com/gpu.count,nvidia.com/gpu.product"  # never the operator's


@pytest.mark.parametrize(("text", "seconds"), [("60s", 60), ("1m", 60), ("500ms", 0.5)])
def test_gfd_sleep_interval(text: str, seconds: float) -> None:
    assert gfd.parse_duration(text) == seconds
    with pytest.raises(CLIError, match="invalid sleep interval 'often'"):
        gfd.parse_duration("often")


def test_the_driver_status_file_is_what_the_mig_manager_sources() -> None:
    text = validator.driver_status(False, "/var/lib/fake-gpu/gpu-a100")
    assert text.splitlines() == [
        "IS_HOST_DRIVER=false",
        "NVIDIA_DRIVER_ROOT=/var/lib/fake-gpu/gpu-a100",
        "DRIVER_ROOT_CTR_PATH=/run/nvidia/driver",
        "NVIDIA_DEV_ROOT=/var/lib/fake-gpu/gpu-a100",
        "DEV_ROOT_CTR_PATH=/run/nvidia/driver",
    ]


@pytest.mark.parametrize(
    ("capacity", "resource"),
    [
        ({"cpu": "64"}, None),
        ({"nvidia.com/gpu": "0"}, None),
        ({"nvidia.com/gpu": "8"}, "nvidia.com/gpu"),
        ({"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "32"}, "nvidia.com/mig-1g.10gb"),
    ],
)
def test_the_plugin_validation_looks_for_a_gpu_resource(
    capacity: dict, resource: str | None
) -> None:
    assert validator.gpu_resource(capacity) == resource
