"""The MIG manager's reconfigure flow (mig-parted v0.15.0 pkg/mig/reconfigure) with a fake
node API and fake NVML: the label sequence, the NVML calls, and the failure paths that
must leave the GPUs and the clients as they were."""

from __future__ import annotations

import io
import json
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_gpuoperator_migparted import a100_40

from gpulab.gpuoperator import migmanager as mm
from gpulab.gpuoperator import nodelabels as nl
from gpulab.gpuoperator.migparted import Gpu
from gpulab.trace import Tracer
from harness.apply import MANIFESTS

NODE = "gpu-a100"
SHIPPED = MANIFESTS / "gpu-operator/assets/state-mig-manager/0400_configmap.yaml"


class NvmlError(Exception):
    pass


class FakeNvml:
    """Two A100-40GB GPUs; ``fail_on`` makes the n-th create call fail."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.N = types.SimpleNamespace(NVMLError=NvmlError)
        self.state = {0: a100_40(0), 1: a100_40(1)}
        self.calls: list[str] = []
        self.fail_on = fail_on
        self.creates = 0

    def gpus(self) -> list[Gpu]:
        return [self.state[i] for i in sorted(self.state)]

    def clear(self, gpu: Gpu) -> None:
        self.state[gpu.index] = replace(self.state[gpu.index], current={})
        self.calls.append(f"clear {gpu.index}")

    def set_mode(self, gpu: Gpu, enabled: bool) -> None:
        self.state[gpu.index] = replace(self.state[gpu.index], mig_enabled=enabled)
        self.calls.append(f"mode {gpu.index} {int(enabled)}")

    def create(self, gpu: Gpu, profile: Any) -> None:
        self.creates += 1
        if self.creates == self.fail_on:
            raise NvmlError("Insufficient resources")
        g = self.state[gpu.index]
        current = dict(g.current)
        current[profile.name] = current.get(profile.name, 0) + 1
        self.state[gpu.index] = replace(g, current=current)
        self.calls.append(f"create {gpu.index} {profile.name}")


class FakeCore:
    """The node's labels; pods are gone as soon as asked."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = dict(labels)
        self.history: list[dict[str, str]] = []
        self.deleted: list[str] = []

    def read_node(self, name: str) -> Any:
        return types.SimpleNamespace(metadata=types.SimpleNamespace(labels=dict(self.labels)))

    def patch_node(self, name: str, body: dict) -> None:
        patch = body["metadata"]["labels"]
        self.history.append(patch)
        self.labels.update(patch)

    def list_namespaced_pod(self, ns: str, label_selector: str, field_selector: str) -> Any:
        pods = []
        if label_selector == mm.VALIDATOR_POD:
            pods = [types.SimpleNamespace(metadata=types.SimpleNamespace(name="validator-x"))]
        return types.SimpleNamespace(items=pods)

    def list_pod_for_all_namespaces(self, field_selector: str) -> Any:
        return types.SimpleNamespace(items=[])

    def delete_namespaced_pod(self, name: str, ns: str) -> None:
        self.deleted.append(name)


LABELS = {
    nl.DEPLOY_PREFIX + "device-plugin": "true",
    nl.DEPLOY_PREFIX + "gpu-feature-discovery": "true",
    nl.DEPLOY_PREFIX + "dcgm-exporter": "false",  # a user's false stays false
    nl.DEPLOY_PREFIX + "client": "true",
    nl.MIG_CONFIG_STATE_LABEL: "success",
}


SHIPPED_TEXT = yaml.safe_load(SHIPPED.read_text())["data"]["config.yaml"]


def run(
    selected: str, nvml: FakeNvml, config: Path, labels: dict | None = None
) -> tuple[str, FakeCore, list[dict]]:
    """One Reconfigure.run: (final state, the node API, the traced steps)."""
    core = FakeCore(labels or LABELS)
    stream = io.StringIO()
    opts = mm.Options(NODE, config, "gpu-operator", pod_deletion_timeout=1)
    tracer = Tracer("nvidia-mig-manager", stream=stream)
    state = mm.Reconfigure(opts, core, nvml, tracer, selected).run()
    return state, core, [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    path = tmp_path / "config-default.yaml"
    path.write_text(SHIPPED_TEXT)
    return path


def test_a_new_config_pauses_the_clients_applies_through_nvml_and_resumes_them(
    shipped: Path,
) -> None:
    nvml = FakeNvml()
    state, core, steps = run("all-1g.10gb", nvml, shipped)
    assert state == mm.SUCCESS
    assert core.history[0] == {nl.MIG_CONFIG_STATE_LABEL: "pending"}
    paused = core.history[1]
    assert paused[nl.DEPLOY_PREFIX + "device-plugin"] == mm.PAUSED
    assert paused[nl.DEPLOY_PREFIX + "dcgm-exporter"] == "false"
    assert paused[nl.DEPLOY_PREFIX + "client"] == mm.PAUSED
    assert core.history[2][nl.DEPLOY_PREFIX + "device-plugin"] == "true"
    assert core.history[-1] == {nl.MIG_CONFIG_STATE_LABEL: "success"}
    assert core.labels[nl.DEPLOY_PREFIX + "dcgm-exporter"] == "false"
    assert core.deleted == ["validator-x"]  # restartValidatorPod
    assert nvml.calls[:2] == ["mode 0 1", "mode 1 1"]
    assert nvml.calls.count("create 0 1g.10gb") == 4
    assert {g.index: g.current for g in nvml.gpus()} == {0: {"1g.10gb": 4}, 1: {"1g.10gb": 4}}
    assert [s["step"] for s in steps] == [
        "validateMigConfig", "setState", "shutdownKubernetesGPUClients", "waitForPodsToBeDeleted",
        "applyMigModeChange", "applyMigConfig", "restartKubernetesGPUClients", "setState",
    ]  # fmt: skip


def test_a_config_already_applied_is_success_without_touching_anything(shipped: Path) -> None:
    nvml = FakeNvml()
    state, core, steps = run("all-disabled", nvml, shipped)
    assert state == mm.SUCCESS
    assert core.history == [{nl.MIG_CONFIG_STATE_LABEL: "success"}]
    assert nvml.calls == []
    assert steps[1]["step"] == "isConfigAlreadyApplied"


@pytest.mark.parametrize(
    ("selected", "config", "reason"),
    [
        ("all-bogus", None, "selected mig-config not present: all-bogus"),
        ("broken", "version: v1\nmig-configs:\n  broken: [{devices: all\n",
         "unmarshal error: not valid YAML"),
        ("too-big", "version: v1\nmig-configs:\n  too-big:\n  - {devices: all, mig-enabled: true, "
         "mig-devices: {3g.20gb: 2, 2g.10gb: 1}}\n",
         "too-big: GPU 0 (NVIDIA A100-SXM4-40GB) cannot hold 1x 2g.10gb + 2x 3g.20gb"),
    ],
)  # fmt: skip
def test_a_config_that_cannot_be_applied_fails_and_changes_nothing_else(
    selected: str, config: str | None, reason: str, shipped: Path
) -> None:
    nvml = FakeNvml()
    if config is not None:
        shipped.write_text(config)
    state, core, steps = run(selected, nvml, shipped)
    assert state == mm.FAILED
    assert core.history == [{nl.MIG_CONFIG_STATE_LABEL: "failed"}]  # no client was paused
    assert nvml.calls == []
    (last,) = [s for s in steps if s["step"] == "setState"]
    assert reason in last["message"] and "\n" not in last["message"]


def test_a_failed_apply_restores_the_gpus_old_mig_devices_and_the_clients(
    shipped: Path,
) -> None:
    nvml = FakeNvml(fail_on=6)  # GPU 0's four, then the second of GPU 1
    nvml.state[1] = replace(nvml.state[1], mig_enabled=True, current={"3g.20gb": 2})
    nvml.state[0] = replace(nvml.state[0], mig_enabled=True)
    state, core, steps = run("all-1g.10gb", nvml, shipped)
    assert state == mm.FAILED
    assert nvml.gpus()[1].current == {"3g.20gb": 2}  # restored
    assert core.labels[nl.DEPLOY_PREFIX + "device-plugin"] == "true"
    assert core.labels[nl.MIG_CONFIG_STATE_LABEL] == "failed"
    assert "GPU 1: error setting MIG config: Insufficient resources" in steps[-1]["message"]


def test_the_pause_and_resume_values() -> None:
    assert mm.maybe_set_paused("true") == mm.PAUSED
    assert mm.maybe_set_paused("") == mm.PAUSED
    assert mm.maybe_set_paused("false") == "false"
    assert mm.maybe_set_true(mm.PAUSED) == "true"
    assert mm.client_labels({}, mm.maybe_set_true) == dict.fromkeys(mm.CLIENT_LABELS, "true")
