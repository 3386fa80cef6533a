"""Profile -> shim config rendering (gpulab.fakegpu.render)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.fakegpu import paths, render
from gpulab.fakegpu.profiles import MODELS, ProfileError, available, gpu_uuid, load, mig_uuid


def as_dict(text: str) -> dict[str, str]:
    lines = [x for x in text.splitlines() if x and not x.startswith("#")]
    return dict(x.split("=", 1) for x in lines)


@pytest.mark.parametrize("name", available())
def test_every_profile_renders_every_gpu(name: str) -> None:
    profile = load(name)
    conf = as_dict(render.render(profile, "node-x"))
    assert conf["version"] == "1"
    assert int(conf["gpu_count"]) == len(profile.gpus)
    for gpu in profile.gpus:
        p = f"gpu.{gpu.index}."
        assert conf[p + "uuid"] == gpu_uuid("node-x", gpu.index)
        assert conf[p + "name"] == gpu.model.name
        assert int(conf[p + "memory_mib"]) == gpu.model.memory_mib
        assert int(conf[p + "numa_node"]) == gpu.numa_node
        assert conf[p + "pci_bus_id"] == gpu.pci_bus_id
        peers = conf[p + "nvlink_peers"]
        assert tuple(int(x) for x in peers.split(",") if x) == gpu.nvlink_peers
        assert int(conf[p + "mig_count"]) == len(gpu.mig_instances)
        for j in range(len(gpu.mig_instances)):
            assert conf[f"{p}mig.{j}"].split(",")[0] == mig_uuid("node-x", gpu.index, j)


def test_uuids_depend_on_the_node_name() -> None:
    profile = load("t4-x1")
    a = as_dict(render.render(profile, "node-a"))
    b = as_dict(render.render(profile, "node-b"))
    assert a["gpu.0.uuid"] != b["gpu.0.uuid"]
    assert a["gpu.0.serial"] != b["gpu.0.serial"]


def test_state_dir_and_versions() -> None:
    conf = as_dict(render.render(load("h100-80gb-x8"), "n", state_dir=Path("/tmp/s/n")))
    assert conf["state_dir"] == "/tmp/s/n"
    assert conf["nvml_version"] == "12.550.54.15"
    assert conf["gpu.0.architecture"] == "9"  # NVML_DEVICE_ARCH_HOPPER
    assert conf["gpu.0.nvlinks"] == "18"
    assert conf["gpu.4.cpus"] == "32-63"  # NUMA node 1


@pytest.mark.parametrize(
    ("model", "profile", "expected"),
    [
        ("A100-SXM4-40GB", "1g.5gb", (0, 19)),
        ("A100-SXM4-40GB", "1g.10gb", (9, 15)),  # PROFILE_1_SLICE_REV2
        ("A100-SXM4-40GB", "2g.10gb", (1, 14)),
        ("A100-SXM4-40GB", "3g.20gb", (2, 9)),
        ("A100-SXM4-40GB", "4g.20gb", (3, 5)),
        ("A100-SXM4-40GB", "7g.40gb", (4, 0)),
        ("A100-SXM4-80GB", "1g.10gb", (0, 19)),
        ("A100-SXM4-80GB", "1g.20gb", (9, 15)),
        ("H100-80GB-HBM3", "3g.40gb", (2, 9)),
    ],
)
def test_gi_profile_ids(model: str, profile: str, expected: tuple[int, int]) -> None:
    m = MODELS[model]
    assert render.gi_profile_ids(m, m.mig_profile(profile)) == expected


def test_every_model_has_board_facts() -> None:
    assert {m.name for m in MODELS.values()} == set(render.BOARDS)


def test_write_is_atomic_and_readable(tmp_path: Path) -> None:
    out = render.write(load("t4-x4"), "n1", tmp_path / "d" / "config")
    assert as_dict(out.read_text())["gpu_count"] == "4"
    assert out.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in out.parent.iterdir()] == ["config"]  # no temp file left


def test_bad_node_names_are_rejected(tmp_path: Path) -> None:
    for bad in ("", "Node_A", "../etc", "a/b"):
        with pytest.raises(ProfileError, match="not a valid Kubernetes node name"):
            paths.node_dir(tmp_path, bad)
    assert paths.node_dir(tmp_path, "gpu-node-1.lab") == tmp_path.resolve() / "gpu-node-1.lab"
