"""The HAMi chapter's deployment pieces: what HAMi-mode nodes advertise, the hami-scheduler's
KubeSchedulerConfiguration under the pod runner's loopback rule, the extender's flags in
manifests/hami, the HAMi cluster specs, and Allocate on kwok's Running pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulab.cli import build_parser
from gpulab.deviceplugin.hami import waiting_pod
from gpulab.hami import annotations as ha
from gpulab.hami.commands import options
from harness.addons.device_plugin import expected_resources
from harness.apply import MANIFESTS, load_documents
from harness.podrunner.container import rewrite_addresses
from harness.spec import DEFAULT_PORTS, PORT_OFFSET_ENV, load, parse

NODE = "gpu-t4-0"


def test_hami_nodes_advertise_split_count_shares_per_gpu() -> None:
    spec = {
        "nodes": [{"name": "n", "profile": "a100-sxm4-40gb-x8", "devicePlugin": {"hami": True}}]
    }
    assert expected_resources(parse(spec).nodes[0]) == {"nvidia.com/gpu": 8 * 10}


def _doc(name: str, kind: str) -> dict[str, Any]:
    return next(d for d in load_documents([MANIFESTS / "hami" / name]) if d["kind"] == kind)


def test_the_scheduler_calls_the_extender_in_its_own_pod() -> None:
    config = yaml.safe_load(_doc("scheduler-config.yaml", "ConfigMap")["data"]["config.yaml"])
    assert config["profiles"] == [{"schedulerName": "hami-scheduler"}]
    (extender,) = config["extenders"]
    assert (extender["filterVerb"], extender["bindVerb"]) == ("filter", "bind")
    # the pod runner's loopback rule (its kube-scheduler adapter applies it to urlPrefix):
    # the extender container binds 0.0.0.0:9443, i.e. the pod's address
    pod_ip = "127.7.0.5"
    assert rewrite_addresses(extender["urlPrefix"], pod_ip) == f"https://{pod_ip}:9443"
    assert rewrite_addresses("--http_bind=0.0.0.0:9443", pod_ip) == f"--http_bind={pod_ip}:9443"


def test_every_hami_resource_is_managed_by_the_extender_and_ignored_by_kube_scheduler() -> None:
    """The chart's managedResources (NVIDIA entries, in its order): each resource name the
    device config gives, nvidia.com/priority included, ignored by kube-scheduler's own fit
    check, since no node advertises it (else a priority pod stays Pending)."""
    config = yaml.safe_load(_doc("scheduler-config.yaml", "ConfigMap")["data"]["config.yaml"])
    (extender,) = config["extenders"]
    device = yaml.safe_load(
        _doc("device-configmap.yaml", "ConfigMap")["data"]["device-config.yaml"]
    )
    keys = ("resourceCountName", "resourceMemoryName", "resourceCoreName",
            "resourceMemoryPercentageName", "resourcePriorityName")  # fmt: skip
    names = [device["nvidia"][k] for k in keys]
    assert names[-1] == "nvidia.com/priority"
    assert extender["managedResources"] == [{"name": n, "ignoredByScheduler": True} for n in names]


def test_hami_specs_run_beside_the_other_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_OFFSET_ENV, raising=False)  # the specs' own ports
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
    assert waiting_pod([_pod("Running")], NODE)["metadata"]["name"] == "Running"  # type: ignore[index]
    assert waiting_pod([_pod("Failed"), _pod("Succeeded")], NODE) is None


def test_the_deployments_extender_flags_are_the_releases(tmp_path: Path) -> None:
    deployment = _doc("deployment.yaml", "Deployment")
    ctr = next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"
    )
    config = tmp_path / "device-config.yaml"
    config.write_text(_doc("device-configmap.yaml", "ConfigMap")["data"]["device-config.yaml"])
    argv = [
        a if not a.startswith("--device-config-file") else f"--device-config-file={config}"
        for a in ctr["command"][1:]
    ]
    opts = options(build_parser().parse_args(argv))
    assert opts.http_bind == ("0.0.0.0", 9443) and opts.metrics_bind == ("0.0.0.0", 9395)
    assert opts.scheduler.scheduler_name == opts.webhook.scheduler_name == "hami-scheduler"
    assert (opts.scheduler.node_policy, opts.scheduler.gpu_policy) == ("binpack", "spread")
    assert opts.scheduler.node_lock_timeout.total_seconds() == 300
    assert opts.scheduler.node_lock_retry_timeout.total_seconds() == 28
    nvidia = opts.scheduler.nvidia
    assert (nvidia.default_gpu_num, nvidia.default_memory, nvidia.default_cores) == (1, 0, 0)
