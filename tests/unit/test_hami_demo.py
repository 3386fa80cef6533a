"""The HAMi demo's narration (demos/hami.py) credits each annotation to the step that
writes it in v2.10.0: Filter the choice (node and both device annotations), Bind the phase
and time, Allocate the envs; after the smi pod's nvidia-smi a lab label says why used stays
0MiB and where the SM limit acts."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

from demos import hami as demo
from demos.common import console
from demos.hami import allocation_lines, smi_migs, smi_total_mib
from gpulab.fakegpu import inventory, profiles
from gpulab.fakegpu.smi import Row, format_list, format_table
from gpulab.hami import annotations as ha

CARD = "GPU-00000000-1111-2222-3333-444444444444"


def test_filter_is_credited_with_the_device_choice_and_bind_with_the_phase() -> None:
    devices = f"{CARD},NVIDIA,3000,30:;"
    pod = {
        "metadata": {
            "annotations": {
                ha.ASSIGNED_NODE: "gpu-t4-0",
                ha.DEVICES_TO_ALLOCATE: ";",
                ha.DEVICES_ALLOCATED: devices,
                ha.BIND_PHASE: ha.BIND_SUCCESS,
                ha.BIND_TIME: "1700000000",
                "gpulab.io/allocate-cuda": json.dumps(
                    {"envs": {"NVIDIA_VISIBLE_DEVICES": CARD, "CUDA_DEVICE_SM_LIMIT": "30"}}
                ),
            }
        },
        "spec": {"nodeName": "gpu-t4-0"},
    }
    filter_line, bind_line = allocation_lines(pod)
    assert filter_line.startswith("Filter wrote hami.io/vgpu-node=gpu-t4-0, ")
    assert ha.DEVICES_TO_ALLOCATE in filter_line and ha.DEVICES_ALLOCATED in filter_line
    assert filter_line.endswith(f"{CARD} 3000MiB 30%")
    assert bind_line == (
        "Bind wrote hami.io/bind-phase=allocating and hami.io/bind-time=1700000000, "
        "then bound the pod to gpu-t4-0"
    )
    assert ha.DEVICES_ALLOCATED not in bind_line


def test_the_demo_reads_nvidia_smi_as_printed() -> None:
    """What the outcome checks rest on: totals of the table, MIG devices of `-L`."""
    gpus = inventory.gpu_infos(profiles.load("a100-80gb-mig-x8"), "n1")
    table = format_table("550", 12040, [Row(g, 0, 30) for g in gpus[:1]], {})
    assert smi_total_mib(table) == [81920]  # the GPU's; its MIG rows are not totals
    listing = smi_migs(format_list([Row(g, 0, 30) for g in gpus]))
    assert listing[gpus[0].uuid] == [(m.profile, m.uuid) for m in gpus[0].migs]
    assert [p for p, _ in listing[gpus[0].uuid]] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert len(listing) == 8


SMI_LOG = """\
+-----------------------------------------+------------------------+----------------------+
|   0  Tesla T4                        On | 00000000:0F:00.0   Off |                    0 |
| N/A   31C    P0              N/A /  N/A |         0MiB / 3000MiB | 0%           Default |
+-----------------------------------------+------------------------+----------------------+
"""  # fake-nvidia-smi's table, cut (what HAMi-core's limit shows)


class FakeCore:
    """The smi pod's API: created, then read back Succeeded with its log."""

    def __init__(self, _api: Any = None) -> None:
        self.created: list[dict] = []

    def create_namespaced_pod(self, ns: str, body: dict) -> None:
        self.created.append(body)

    def read_namespaced_pod_log(self, name: str, ns: str, **kw: Any) -> Any:
        return types.SimpleNamespace(data=SMI_LOG.encode())


def test_the_smi_scene_labels_used_0mib_and_the_sm_limit_after_the_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(demo.client, "CoreV1Api", FakeCore)
    monkeypatch.setattr(demo, "let_pods_read_themselves", lambda api, ns: None)
    monkeypatch.setattr(demo, "read_pod", lambda api, ns, name: {"status": {"phase": "Succeeded"}})
    monkeypatch.setattr(demo, "allocation_lines", lambda pod: [])
    with console.capture() as captured:
        log = demo._smi_scene(None, types.SimpleNamespace(runs_containers=True))  # type: ignore[arg-type]
    assert log == SMI_LOG
    lines = [line.strip() for line in captured.get().splitlines()]
    label = lines.index(demo.SMI_LABEL.strip())
    assert label > lines.index(SMI_LOG.splitlines()[2])
    text = lines[label]
    assert text.startswith("(lab) used stays 0MiB") and "no CUDA runs here" in text
    assert "CUDA_DEVICE_SM_LIMIT" in text and "no nvidia-smi face" in text
