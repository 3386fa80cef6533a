"""The pure parts of the operands: dcgm-exporter's exposition and collectors file, GFD's
label bookkeeping, the validator's status files and GPU resource check."""

from __future__ import annotations

import pytest

from gpulab.errors import CLIError
from gpulab.gpuoperator import dcgm, gfd, validator

GPU0 = dcgm.Entity(0, "GPU-a", "00000000:07:00.0", "nvidia0", "NVIDIA A100-SXM4-40GB")


def test_metrics_are_rendered_as_dcgm_exporter_renders_them() -> None:
    counters = [c for c in dcgm.default_counters() if c.field in dcgm.READABLE]
    samples = [
        dcgm.Sample(
            GPU0,
            {
                "DCGM_FI_DEV_GPU_TEMP": 30,
                "DCGM_FI_DEV_FB_USED": 0,
                "DCGM_FI_DRIVER_VERSION": "550.54.15",
            },
        ),
        dcgm.Sample(
            dcgm.Entity(
                0,
                "GPU-a",
                "00000000:07:00.0",
                "nvidia0",
                "NVIDIA A100-SXM4-40GB",
                mig_profile="1g.10gb",
                gpu_instance_id=3,
            ),
            {"DCGM_FI_DEV_FB_USED": 0, "DCGM_FI_DRIVER_VERSION": "550.54.15"},
        ),
    ]
    text = dcgm.render(counters, samples, "gpu-a100")
    base = 'gpu="0",UUID="GPU-a",pci_bus_id="00000000:07:00.0",device="nvidia0",modelName="NVIDIA A100-SXM4-40GB"'  # noqa: E501
    assert text.splitlines() == [
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).",
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
        f'DCGM_FI_DEV_GPU_TEMP{{{base},Hostname="gpu-a100",DCGM_FI_DRIVER_VERSION="550.54.15"}} 30',
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
        f'DCGM_FI_DEV_FB_USED{{{base},Hostname="gpu-a100",DCGM_FI_DRIVER_VERSION="550.54.15"}} 0',
        f'DCGM_FI_DEV_FB_USED{{{base},GPU_I_PROFILE="1g.10gb",GPU_I_ID="3",Hostname="gpu-a100",'
        'DCGM_FI_DRIVER_VERSION="550.54.15"} 0',
    ]


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
        "DCGM_FI_DEV_XID_ERRORS,  gauge, Value of the last XID error, encountered.\n"
    )
    assert dcgm.parse_counters(text) == [
        dcgm.Counter("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
        dcgm.Counter("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
        dcgm.Counter(
            "DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error, encountered."
        ),
    ]
    with pytest.raises(CLIError, match="line 2: unknown DCGM field 'DCGM_FI_DEV_WARP_SPEED'"):
        dcgm.parse_counters("# x\nDCGM_FI_DEV_WARP_SPEED, gauge, fast\n")
    with pytest.raises(CLIError, match="line 1: unknown metric type 'gaug'"):
        dcgm.parse_counters("DCGM_FI_DEV_GPU_TEMP, gaug, t\n")
    with pytest.raises(CLIError, match="line 1: expected 'field, type, help'"):
        dcgm.parse_counters("DCGM_FI_DEV_GPU_TEMP\n")


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
