"""The local backend's HAMi pieces: what HAMi-mode nodes advertise, the hami-scheduler's
KubeSchedulerConfiguration, the HAMi cluster specs, and Allocate on kwok's Running pods."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from gpulab.deviceplugin.hami import pending_pod
from gpulab.hami import annotations as ha
from harness.addons.device_plugin import expected_resources
from harness.addons.hami import scheduler_config
from harness.spec import DEFAULT_PORTS, load, parse

NODE = "gpu-t4-0"


def test_hami_nodes_advertise_split_count_shares_per_gpu() -> None:
    spec = {
        "nodes": [{"name": "n", "profile": "a100-sxm4-40gb-x8", "devicePlugin": {"hami": True}}]
    }
    assert expected_resources(parse(spec).nodes[0]) == {"nvidia.com/gpu": 8 * 10}


def test_hami_scheduler_config_points_at_the_host_extender_and_trusts_the_cluster_ca() -> None:
    cluster = SimpleNamespace(dir=Path("/state"), pki=Path("/state/pki"))
    config = scheduler_config(cluster, 9443)  # type: ignore[arg-type]
    assert config["profiles"] == [{"schedulerName": "hami-scheduler"}]
    assert config["clientConnection"] == {"kubeconfig": "/state/scheduler.kubeconfig"}
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "https://127.0.0.1:9443"
    assert extender["tlsConfig"] == {"caFile": "/state/pki/ca.crt"}
    assert (extender["filterVerb"], extender["bindVerb"]) == ("filter", "bind")


def test_hami_specs_run_beside_the_other_clusters() -> None:
    used = {p for name in ("default", "e2e") for p in load(name).ports.values()}
    assert set(DEFAULT_PORTS.values()) <= used
    for name in ("hami", "hami-e2e"):
        spec = load(name)
        assert spec.addons == ("hami",)  # HAMi's own device plugin, not NVIDIA's
        assert not set(spec.ports.values()) & used
        used |= set(spec.ports.values())
        assert all(n.device_plugin.hami for n in spec.nodes if n.profile)


def _pod(phase: str) -> dict[str, object]:
    annos = {
        ha.ASSIGNED_NODE: NODE,
        ha.BIND_TIME: "1",
        ha.BIND_PHASE: ha.BIND_ALLOCATING,
        ha.DEVICES_TO_ALLOCATE: "GPU-a,NVIDIA,3000,30:;",
    }
    return {
        "metadata": {"name": phase, "namespace": "ns", "annotations": annos},
        "status": {"phase": phase},
    }


def test_allocate_finds_a_pod_kwok_already_marked_running_but_not_a_finished_one() -> None:
    assert pending_pod([_pod("Running")], NODE)["metadata"]["name"] == "Running"  # type: ignore[index]
    assert pending_pod([_pod("Failed"), _pod("Succeeded")], NODE) is None
