from pathlib import Path

import pytest
import yaml

from harness.errors import HarnessError
from harness.spec import DEFAULT_PORTS, load, node_object, parse


def test_default_spec_expands_and_gives_capacity_from_profiles() -> None:
    spec = load("default")
    names = [n.name for n in spec.nodes]
    assert names == ["gpu-a100", "gpu-a100-mig", "gpu-h100", "gpu-t4", "cpu-only"]
    a100 = node_object(spec.nodes[0])
    assert a100["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert a100["metadata"]["labels"]["gpulab.io/gpu-profile"] == "a100-sxm4-40gb-x8"
    assert a100["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    t4 = node_object(spec.nodes[3])
    assert t4["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    cpu = node_object(spec.nodes[4])
    assert "nvidia.com/gpu" not in cpu["status"]["capacity"]
    assert cpu["status"]["capacity"]["cpu"] == "32"


def test_count_expands_to_numbered_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.spec import PORT_OFFSET_ENV

    monkeypatch.delenv(PORT_OFFSET_ENV, raising=False)  # a helper's shell exports one
    spec = parse({"nodes": [{"name": "t4", "count": 3, "profile": "t4-x1"}]})
    assert [n.name for n in spec.nodes] == ["t4-0", "t4-1", "t4-2"]
    assert spec.ports == DEFAULT_PORTS


def test_unknown_profile_names_the_node_and_the_choices() -> None:
    with pytest.raises(HarnessError, match=r"nodes\[0\] \(n1\): unknown GPU profile 'a200'.*t4-x4"):
        parse({"nodes": [{"name": "n1", "profile": "a200"}]})


def test_duplicate_node_name_is_rejected() -> None:
    with pytest.raises(HarnessError, match="duplicate node name 'n1-0'"):
        parse({"nodes": [{"name": "n1", "count": 2}, {"name": "n1-0"}]})


@pytest.mark.parametrize(
    ("ports", "message"),
    [
        ({"apiserver": 80}, "1024..65535"),
        ({"apiserver": 21379}, "must all differ"),
        ({"kubelet": 10250}, "unknown port 'kubelet'"),
    ],
)
def test_bad_ports(ports: dict, message: str) -> None:
    with pytest.raises(HarnessError, match=message):
        parse({"ports": ports, "nodes": [{"name": "n"}]})


def test_spec_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [ {name: x\n")
    with pytest.raises(HarnessError, match=r"bad.yaml: not valid YAML"):
        load(bad)
    with pytest.raises(HarnessError, match="no cluster spec 'nope'"):
        load("nope")


def test_port_offset_shifts_every_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.spec import PORT_OFFSET_ENV

    monkeypatch.setenv(PORT_OFFSET_ENV, "300")
    spec = parse({"name": "x", "nodes": [{"name": "n"}]})
    assert spec.ports == {k: v + 300 for k, v in DEFAULT_PORTS.items()}
    monkeypatch.setenv(PORT_OFFSET_ENV, "lots")
    with pytest.raises(HarnessError, match="must be an integer"):
        parse({"name": "x", "nodes": [{"name": "n"}]})


def test_shipped_specs_keep_their_ports_apart_and_out_of_the_ephemeral_range() -> None:
    """Two specs sharing a port could not run side by side (the e2e suite runs several);
    a port in 32768-60999 may be held for a moment by any client connection."""
    from harness.spec import available

    owner: dict[int, str] = {}
    for name in available():
        for port in load(name).ports.values():
            assert port < 32768 - 1000, f"{name}: port {port} is too close to the ephemeral range"
            assert port not in owner, f"{name} and {owner.get(port)} both use port {port}"
            owner[port] = name


def test_every_shipped_spec_has_its_own_cluster_name() -> None:
    """Two specs of one name would stop each other's clusters (each e2e spec is its own,
    so make test never stops a trainer's workshop cluster)."""
    from harness.spec import available

    owner: dict[str, str] = {}
    for name in available():
        cluster = load(name).name
        assert cluster not in owner, f"{name} and {owner[cluster]} are both {cluster}"
        owner[cluster] = name


@pytest.mark.parametrize(
    ("copy", "original"),
    [("scheduling-demo-e2e", "scheduling"), ("volcano-demo-e2e", "volcano")],
)
def test_a_demos_e2e_copy_keeps_the_demos_shape(copy: str, original: str) -> None:
    from harness.spec import SPEC_DIR

    def shape(name: str) -> dict[str, object]:
        raw = yaml.safe_load((SPEC_DIR / f"{name}.yaml").read_text())
        return {k: v for k, v in raw.items() if k not in ("name", "ports")}

    assert shape(copy) == shape(original)
