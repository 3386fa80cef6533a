"""HAMi's MIG mode on the NVML shim: the device plugin (gpulab.deviceplugin.hami, .hamimig)
discovers the allowlisted profiles, resets the idle GPUs, registers them as mode ``mig``,
and at Allocate creates through NVML exactly the instances the extender's Fit reserved
(gpulab.hami.score); a container given the MIG UUID sees that MIG device; the reconciler
destroys the instance of a pod that finished. One subprocess (NVML state is per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from gpulab.fakegpu import nvml, paths
from harness.apply import MANIFESTS

NODE = "gpu-a100-mig"

PLUGIN = """
    import io, json
    from gpulab.deviceplugin import nvml
    from gpulab.deviceplugin.hami import HamiAllocator, MigContext, NodeConfig, node_devices
    from gpulab.deviceplugin.hamimig import MigInstanceManager, gpu_profiles, supports_mig
    from gpulab.deviceplugin.rm import Device
    from gpulab.hami import annotations as ha
    from gpulab.hami.config import load_device_config
    from gpulab.hami.device import CardFilter, ContainerRequest
    from gpulab.hami.fake import FakeCluster
    from gpulab.hami.nodes import cards_of
    from gpulab.hami.score import FitOptions, fit_node
    from gpulab.trace import Tracer

    NODE = "gpu-a100-mig"
    nvml.init()
    gpus = nvml.read_inventory()
    allow = load_device_config(DEVICE_CONFIG).mig_profile_allowlist
    context = MigContext(MigInstanceManager(), {g.uuid: g.index for g in gpus})
    out = {"supported": supports_mig([g.name for g in gpus], allow)}
    out["reset"] = context.start([], out["supported"])
    profiles = gpu_profiles([(g.index, g.uuid, g.name) for g in gpus], allow)
    registered = node_devices(gpus, lambda u: True, 10, profiles)
    out["registration"] = json.loads(ha.encode_node_devices(registered[:1]))

    # what the extender's Filter writes for two pods on GPU 0, one after the other
    cards = cards_of(registered[:1])
    fc = FakeCluster()
    fc.add_node({"metadata": {"name": NODE, "annotations": {}}})
    opts = FitOptions(cards=CardFilter.of({"nvidia.com/vgpu-mode": "mig"}))
    devices = {f"{g.uuid}-0": Device(f"{g.uuid}-0", g.uuid, g.index, (f"/dev/nvidia{g.minor}",), 0)
               for g in gpus}
    alloc = HamiAllocator(None, NODE, Tracer("device-plugin", None, stream=io.StringIO()),
                          NodeConfig(operating_mode="mig"), cluster=fc, mig=context)
    out["pods"] = {}
    for name, mem in (("one-g", 3000), ("three-g", 15000)):
        found = fit_node(NODE, cards, (ContainerRequest(nums=1, memreq=mem),), 0, opts)
        (share,) = found.devices[0]
        cards[0].mig_in_use.append(share.mig[1:])
        annos = {ha.ASSIGNED_NODE: NODE, ha.BIND_TIME: "1", ha.BIND_PHASE: "allocating",
                 ha.DEVICES_TO_ALLOCATE: ha.encode_pod_devices(found.devices),
                 ha.DEVICES_ALLOCATED: ha.encode_pod_devices(found.devices),
                 ha.MIG_ALLOCATIONS: ha.dump_mig_allocations(ha.mig_allocations(found.devices))}
        meta = {"name": name, "namespace": "ns", "uid": name, "annotations": annos}
        fc.add_pod({"metadata": meta, "spec": {"nodeName": NODE, "containers": [{"name": "cuda"}]},
                    "status": {"phase": "Running"}})
        fc.patch_node_annotations(NODE, {ha.NODE_LOCK: f"2026-01-01T00:00:00Z,ns,{name}"})
        (got,) = alloc.allocate([[f"{share.uuid}-0"]], devices)
        pod = fc.get_pod("ns", name)["metadata"]["annotations"]
        out["pods"][name] = {"share": [share.usedmem, share.usedcores, list(share.mig)],
                             "envs": got.envs, "phase": pod[ha.BIND_PHASE],
                             "runtime": json.loads(pod[ha.MIG_ALLOCATIONS])}
    # one-g finished: the reconciler destroys its instance, three-g's stays
    done = fc.get_pod("ns", "one-g")
    done["status"] = {"phase": "Succeeded"}
    fc.update_pod(done)
    context.reconcile(fc.list_pods_on_node(NODE))
    out["left"] = sorted(i.mig_uuid for k, i in context.manager._by_key.items())
    print(json.dumps(out))
"""

CONTAINER = """
    import json
    from gpulab.deviceplugin import nvml
    nvml.init()
    print(json.dumps([[g.name, [[m.uuid, m.profile, m.memory_mib] for m in g.migs]]
                      for g in nvml.read_inventory()]))
"""


def run(code: str, env: dict[str, str]) -> object:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_GPU", "NVIDIA_"))}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**full, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def shim() -> None:
    subprocess.run(["make", "-s", "-C", str(paths.SHIM_DIR)], check=True)


def test_the_plugin_creates_the_reserved_instances_and_a_container_sees_its_own(
    shim: None, tmp_path: Path
) -> None:
    env = nvml.shim_env(NODE, "a100-sxm4-40gb-x8", tmp_path)
    doc = yaml.safe_load((MANIFESTS / "hami" / "device-configmap.yaml").read_text())
    config = tmp_path / "device-config.yaml"
    config.write_text(doc["data"]["device-config.yaml"])  # the chart's migProfileAllowlist
    got = run(f"DEVICE_CONFIG = {str(config)!r}\n" + textwrap.dedent(PLUGIN), env)
    assert isinstance(got, dict)
    assert got["supported"] and got["reset"] == list(range(8))  # no pod held any GPU
    (gpu0,) = got["registration"]
    assert gpu0["mode"] == "mig" and gpu0["count"] == 7  # 1g.5gb: 7 instances at most
    assert [p["name"] for p in gpu0["migProfiles"]] == ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
    one = gpu0["migProfiles"][0]
    assert one["placements"] == [{"start": s, "size": 1} for s in range(7)]
    # 1g.5gb at the highest start, then 3g.20gb where it still fits: the low half
    one_g, three_g = got["pods"]["one-g"], got["pods"]["three-g"]
    assert one_g["share"][2] == ["1g.5gb", 6, 1] and three_g["share"][2] == ["3g.20gb", 0, 4]
    assert one_g["share"][0] == one["memoryMB"]  # charged the profile's memory
    for pod in (one_g, three_g):
        assert pod["phase"] == "success"
        (allocation,) = pod["runtime"]
        assert pod["envs"] == {"NVIDIA_VISIBLE_DEVICES": allocation["migUUID"]}
        assert allocation["gpuInstanceID"] >= 1 and allocation["computeInstanceID"] == 0
    # the container of three-g, given its MIG UUID, sees GPU 0 with that one MIG device
    mig = three_g["runtime"][0]["migUUID"]
    seen = run(CONTAINER, {**env, "NVIDIA_VISIBLE_DEVICES": mig})
    assert seen == [["NVIDIA A100-SXM4-40GB", [[mig, "3g.20gb", 19968]]]]
    # one-g finished: its instance is gone, three-g's is left
    assert got["left"] == [mig]
