"""The MIG manager of mig-parted v0.15.0 with a fake node API and fake NVML: setupMigConfig
(the config built from the GPUs, published as <node>-mig-config), and reconfigure.go's
Run - the label sequence, the NVML calls, and every failure path as upstream has it (what
setState resumes, what it leaves paused, where Run returns without setState, WITH_REBOOT)."""

from __future__ import annotations

import threading
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from test_gpuoperator_migparted import a100_40, t4

from gpulab.errors import CLIError
from gpulab.gpuoperator import migmanager as mm
from gpulab.gpuoperator import migparted
from gpulab.gpuoperator import nodelabels as nl
from gpulab.gpuoperator.migparted import Gpu
from harness.apply import MANIFESTS

NODE = "gpu-a100"
NS = "gpu-operator"
SHIPPED = MANIFESTS / "gpu-operator/assets/state-mig-manager/0400_configmap.yaml"
SHIPPED_TEXT = yaml.safe_load(SHIPPED.read_text())["data"]["config.yaml"]
DP, GFD, DCGM_EXPORTER = (nl.DEPLOY_PREFIX + c for c in ("device-plugin", "gpu-feature-discovery",
                                                          "dcgm-exporter"))  # fmt: skip
STATE = nl.MIG_CONFIG_STATE_LABEL


class NvmlError(Exception):
    pass


class FakeNvml:
    """Two A100-40GB GPUs. ``fail_create`` makes that create call fail; ``fail_mode``
    that set_mode call; with ``mode_sticks`` False a mode change stays pending (NVML
    accepts it, the GPU needs a reset) until :meth:`reboot`."""

    def __init__(self, fail_create: int | None = None, fail_mode: int | None = None,
                 mode_sticks: bool = True) -> None:  # fmt: skip
        self.N = types.SimpleNamespace(NVMLError=NvmlError)
        self.state = {0: a100_40(0), 1: a100_40(1)}
        self.pending: dict[int, bool] = {}
        self.calls: list[str] = []
        self.fail_create, self.fail_mode, self.mode_sticks = fail_create, fail_mode, mode_sticks
        self.creates = self.modes = 0

    def gpus(self) -> list[Gpu]:
        return [self.state[i] for i in sorted(self.state)]

    def clear(self, gpu: Gpu) -> None:
        self.state[gpu.index] = replace(self.state[gpu.index], current={})
        self.calls.append(f"clear {gpu.index}")

    def set_mode(self, gpu: Gpu, enabled: bool) -> None:
        self.modes += 1
        if self.modes == self.fail_mode:
            raise NvmlError("In use by another client")
        self.calls.append(f"mode {gpu.index} {int(enabled)}")
        if self.mode_sticks:
            self.state[gpu.index] = replace(self.state[gpu.index], mig_enabled=enabled)
        else:
            self.pending[gpu.index] = enabled

    def create(self, gpu: Gpu, profile: Any) -> None:
        self.creates += 1
        g = self.state[gpu.index]
        if self.creates == self.fail_create or not g.mig_enabled:
            raise NvmlError("Insufficient resources" if g.mig_enabled else "Not Supported")
        current = dict(g.current)
        current[profile.name] = current.get(profile.name, 0) + 1
        self.state[gpu.index] = replace(g, current=current)
        self.calls.append(f"create {gpu.index} {profile.name}")

    def reboot(self) -> None:
        """A boot: pending modes take effect, no GPU instance survives."""
        for index, enabled in self.pending.items():
            self.state[index] = replace(self.state[index], mig_enabled=enabled, current={})
        self.pending.clear()


def _pod(name: str, selector: dict[str, str] | None = None, owner: str = "DaemonSet") -> Any:
    ref = types.SimpleNamespace(kind=owner, controller=True)
    return types.SimpleNamespace(
        metadata=types.SimpleNamespace(name=name, uid=f"uid-{name}", owner_references=[ref]),
        spec=types.SimpleNamespace(node_selector=selector or {}),
    )


class FakeCore:
    """The node's labels and the pods on it. A client pod goes ``polls`` lists after its
    deploy label left ``true`` (None: never); other pods stay."""

    def __init__(self, labels: dict[str, str], polls: int | None = 0) -> None:
        self.labels = dict(labels)
        self.history: list[dict[str, str]] = []
        self.deleted: list[str] = []
        self.polls = polls
        self.lists: dict[str, int] = {}
        self.others: list[Any] = []  # pods in any namespace on the node
        self.configmaps: dict[str, dict] = {}
        self.validation_pods: list[Any] = []  # app=nvidia-cuda-validator
        self.undeletable = ""

    def read_node(self, name: str) -> Any:
        return types.SimpleNamespace(metadata=types.SimpleNamespace(labels=dict(self.labels)))

    def patch_node(self, name: str, body: dict) -> None:
        patch = body["metadata"]["labels"]
        self.history.append(patch)
        self.labels.update(patch)

    def _gone(self, key: str) -> bool:
        if self.labels.get(DP) == "true":
            return False
        self.lists[key] = self.lists.get(key, 0) + 1
        return self.polls is not None and self.lists[key] > self.polls

    def list_namespaced_pod(self, ns: str, label_selector: str, field_selector: str) -> Any:
        assert field_selector == f"spec.nodeName={NODE}"
        if label_selector == mm.VALIDATOR_POD:
            return types.SimpleNamespace(items=[_pod("validator-x")])
        if label_selector == "app=nvidia-cuda-validator":
            return types.SimpleNamespace(items=list(self.validation_pods))
        if label_selector in (s for s, _ in mm.CLIENT_PODS) and not self._gone(label_selector):
            return types.SimpleNamespace(items=[_pod(label_selector)])
        return types.SimpleNamespace(items=[])

    def list_pod_for_all_namespaces(self, field_selector: str) -> Any:
        return types.SimpleNamespace(items=list(self.others))

    def delete_namespaced_pod(self, name: str, ns: str) -> None:
        if name == self.undeletable:
            raise ApiException(status=503, reason="Service Unavailable")
        self.deleted.append(name)

    def read_namespaced_pod(self, name: str, ns: str) -> Any:
        return _pod(name)

    def create_namespaced_config_map(self, ns: str, body: dict) -> None:
        if body["metadata"]["name"] in self.configmaps:
            raise ApiException(status=409, reason="AlreadyExists")
        self.configmaps[body["metadata"]["name"]] = body

    def read_namespaced_config_map(self, name: str, ns: str) -> Any:
        return types.SimpleNamespace(metadata=types.SimpleNamespace(resource_version="7"))

    def replace_namespaced_config_map(self, name: str, ns: str, body: dict) -> None:
        self.configmaps[name] = body


LABELS = {
    DP: "true",
    GFD: "true",
    DCGM_EXPORTER: "false",  # a user's false stays false
    nl.DEPLOY_PREFIX + "client": "true",
    STATE: "success",
}
RESUMED = {**mm.client_labels(LABELS, mm.maybe_set_true)}


class Steps(list):
    """The steps a component traces, each as {step, message, warning} (a Tracer's part)."""

    def step(self, step: str, regarding: Any, message: str, *, warning: bool = False,
             **detail: Any) -> None:  # fmt: skip
        self.append({"step": step, "message": message, "warning": warning})


class Run:
    """One process of the MIG manager: runs share its ExitFlags, as they share the
    package variable upstream."""

    def __init__(self, config: Path, with_reboot: bool = False) -> None:
        self.flags = mm.ExitFlags()
        self.config = config
        self.opts = mm.Options(NODE, NS, with_reboot=with_reboot, pod_deletion_timeout=0.3,
                               poll_interval=0.05)  # fmt: skip
        self.reboots = 0

    def __call__(self, selected: str, nvml: FakeNvml, core: FakeCore) -> tuple[str, Steps]:
        steps = Steps()
        state = mm.Reconfigure(self.opts, self.config, core, nvml, steps, selected,  # type: ignore[arg-type]
                               self.flags, self.reboot).run()  # fmt: skip
        return state, steps

    def reboot(self) -> None:
        self.reboots += 1


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    path = tmp_path / "config-default.yaml"
    path.write_text(SHIPPED_TEXT)
    return path


def _steps(steps: list[dict]) -> list[str]:
    return [s["step"] for s in steps]


def test_a_new_config_pauses_the_clients_applies_through_nvml_and_resumes_them(
    shipped: Path,
) -> None:
    nvml, core, run = FakeNvml(), FakeCore(LABELS, polls=2), Run(shipped)
    state, steps = run("all-1g.10gb", nvml, core)
    assert state == mm.SUCCESS
    assert core.history[0] == {STATE: "pending"}
    paused = core.history[1]
    assert paused[DP] == mm.PAUSED and paused[nl.DEPLOY_PREFIX + "client"] == mm.PAUSED
    assert paused[DCGM_EXPORTER] == "false"
    assert core.lists["app=nvidia-device-plugin-daemonset"] == 3  # it waited for the pod
    assert core.history[2:] == [RESUMED, {STATE: "success"}]  # setState: no second resume
    assert run.flags.no_restart_k8s_daemonsets_on_exit
    assert core.deleted == ["validator-x"]  # restartValidatorPod
    assert nvml.calls[:2] == ["mode 0 1", "mode 1 1"]
    assert nvml.calls.count("create 0 1g.10gb") == 4
    assert {g.index: g.current for g in nvml.gpus()} == {0: {"1g.10gb": 4}, 1: {"1g.10gb": 4}}
    assert _steps(steps) == [
        "validateMigConfig", "setState", "shutdownKubernetesGPUClients", "waitForPodsToBeDeleted",
        "applyMigModeChange", "applyMigConfig", "restartKubernetesGPUClients", "setState",
    ]  # fmt: skip


def test_a_config_already_applied_is_success_and_setstate_resumes_every_client(
    shipped: Path,
) -> None:
    """setState writes the clients' labels while no change has succeeded in the process:
    absent ones (dcgm, nvsm) become true."""
    nvml, core = FakeNvml(), FakeCore(LABELS)
    state, steps = Run(shipped)("all-disabled", nvml, core)
    assert state == mm.SUCCESS
    assert core.history == [RESUMED, {STATE: "success"}]
    assert RESUMED[nl.DEPLOY_PREFIX + "nvsm"] == "true" and RESUMED[DCGM_EXPORTER] == "false"
    assert nvml.calls == []
    assert _steps(steps) == ["validateMigConfig", "isConfigAlreadyApplied", "setState"]


@pytest.mark.parametrize(
    ("selected", "config", "reason"),
    [
        ("all-bogus", None, "selected mig-config not present: all-bogus"),
        ("broken", "version: v1\nmig-configs:\n  broken: [{devices: all\n",
         "unmarshal error: not valid YAML"),
    ],
)  # fmt: skip
def test_a_config_that_does_not_validate_fails_before_any_client_is_paused(
    selected: str, config: str | None, reason: str, shipped: Path
) -> None:
    nvml, core = FakeNvml(), FakeCore(LABELS)
    if config is not None:
        shipped.write_text(config)
    state, steps = Run(shipped)(selected, nvml, core)
    assert state == mm.FAILED
    assert core.history == [RESUMED, {STATE: "failed"}]
    assert nvml.calls == []
    (last,) = [s for s in steps if s["step"] == "setState"]
    assert reason in last["message"] and "\n" not in last["message"] and last["warning"]


TOO_BIG = (
    "version: v1\nmig-configs:\n  too-big:\n  - {devices: all, mig-enabled: true, "
    "mig-devices: {3g.20gb: 2, 2g.10gb: 1}}\n" + SHIPPED_TEXT.partition("mig-configs:\n")[2]
)


def test_a_layout_the_gpus_cannot_hold_fails_in_apply_after_the_clients_were_paused(
    shipped: Path,
) -> None:
    """mig-parted finds it out in `apply`; (lab) before creating anything, and the old
    layout is restored. The first failure in a process resumes the clients."""
    shipped.write_text(TOO_BIG)
    nvml, core, run = FakeNvml(), FakeCore(LABELS), Run(shipped)
    state, steps = run("too-big", nvml, core)
    assert state == mm.FAILED
    assert core.history[:2] == [{STATE: "pending"}, mm.client_labels(LABELS, mm.maybe_set_paused)]
    assert core.history[2:] == [RESUMED, {STATE: "failed"}]
    assert steps[-1]["message"].endswith(
        "failed to apply MIG configuration: too-big: GPU 0 (NVIDIA A100-SXM4-40GB) cannot "
        "hold 1x 2g.10gb + 2x 3g.20gb: 8 compute slices > 7"
    )
    assert not any(c.startswith("create") for c in nvml.calls)
    layout = {g.index: (g.mig_enabled, g.current) for g in nvml.gpus()}
    assert layout == {0: (False, {}), 1: (False, {})}


def test_after_a_successful_change_a_failed_one_leaves_the_clients_paused(shipped: Path) -> None:
    """NoRestartK8sDaemonsetsOnExit stays set: "my device plugin vanished after a failed
    MIG change"; the next change that succeeds brings the clients back."""
    shipped.write_text(TOO_BIG)
    nvml, core, run = FakeNvml(), FakeCore(LABELS), Run(shipped)
    assert run("all-1g.10gb", nvml, core)[0] == mm.SUCCESS
    core.history.clear()
    assert run("too-big", nvml, core)[0] == mm.FAILED
    assert core.history == [
        {STATE: "pending"}, mm.client_labels(LABELS, mm.maybe_set_paused), {STATE: "failed"},
    ]  # fmt: skip
    assert core.labels[DP] == mm.PAUSED  # no device plugin on the node any more
    assert nvml.gpus()[0].current == {"1g.10gb": 4}  # (lab) the layout is back
    assert run("all-3g.20gb", nvml, core)[0] == mm.SUCCESS
    assert core.labels[DP] == "true" and core.labels[DCGM_EXPORTER] == "false"


def test_a_failure_while_applying_restores_the_old_mig_devices(shipped: Path) -> None:
    nvml, core = FakeNvml(fail_create=6), FakeCore(LABELS)  # GPU 0's four, then GPU 1's 2nd
    nvml.state[1] = replace(nvml.state[1], mig_enabled=True, current={"3g.20gb": 2})
    nvml.state[0] = replace(nvml.state[0], mig_enabled=True)
    state, steps = Run(shipped)("all-1g.10gb", nvml, core)
    assert state == mm.FAILED
    assert nvml.gpus()[1].current == {"3g.20gb": 2}  # restored
    assert "restore" in _steps(steps)
    assert core.labels[DP] == "true" and core.labels[STATE] == "failed"
    assert "GPU 1: error setting MIG config: Insufficient resources" in steps[-1]["message"]


@pytest.mark.parametrize(
    ("third_party", "what"),
    [
        (None, "device-plugin pod did not shutdown"),
        (_pod("my-plugin", {nl.DEPLOY_PREFIX + "client": "true"}),
         "third-party gpu client pods did not shutdown"),
    ],
)  # fmt: skip
def test_a_client_pod_that_does_not_go_leaves_the_node_pending_and_paused(
    third_party: Any, what: str, shipped: Path
) -> None:
    """waitForPodsToBeDeleted's error returns from Run without setState."""
    core = FakeCore(LABELS, polls=None if third_party is None else 0)
    if third_party is not None:
        core.others.append(third_party)
    nvml, run = FakeNvml(), Run(shipped)
    state, steps = run("all-1g.10gb", nvml, core)
    assert state == mm.PENDING
    assert core.history == [{STATE: "pending"}, mm.client_labels(LABELS, mm.maybe_set_paused)]
    assert core.labels[DP] == mm.PAUSED and nvml.calls == []
    assert steps[-1]["step"] == "waitForPodsToBeDeleted" and steps[-1]["warning"]
    assert f"failed to wait for pods to be deleted: {what}: timed out" in steps[-1]["message"]
    assert not run.flags.no_restart_k8s_daemonsets_on_exit


def test_only_daemonset_pods_selecting_gpu_deploy_client_are_waited_for(shipped: Path) -> None:
    core = FakeCore(LABELS)
    core.others += [
        _pod("a-job", {nl.DEPLOY_PREFIX + "client": "true"}, owner="Job"),
        _pod("other-ds", {"kubernetes.io/os": "linux"}),
    ]
    assert Run(shipped)("all-1g.10gb", FakeNvml(), core)[0] == mm.SUCCESS


@pytest.mark.parametrize(
    ("pod", "step", "message"),
    [
        ("cuda-validator", "waitForPodsToBeDeleted",
         "failed to wait for pods to be deleted: failed to delete cuda-validator pod: 503"),
        ("validator-x", "restartValidatorPod", "failed to restart validator pod: 503"),
    ],
)  # fmt: skip
def test_a_pod_that_cannot_be_deleted_leaves_the_node_pending(
    pod: str, step: str, message: str, shipped: Path
) -> None:
    """Both errors return from Run without setState, the clients paused."""
    core = FakeCore(LABELS)
    core.validation_pods = [_pod("cuda-validator")]
    core.undeletable = pod
    state, steps = Run(shipped)("all-1g.10gb", FakeNvml(), core)
    assert state == mm.PENDING
    assert core.labels[DP] == mm.PAUSED and core.labels[STATE] == "pending"
    assert steps[-1]["step"] == step and steps[-1]["message"].startswith(message)


def test_a_failed_mode_change_is_not_fatal_without_with_reboot(shipped: Path) -> None:
    """applyMigModeChange's error is ignored; applyMigConfig sets the mode again."""
    nvml, core = FakeNvml(fail_mode=1), FakeCore(LABELS)
    state, steps = Run(shipped)("all-1g.10gb", nvml, core)
    assert state == mm.SUCCESS
    warned = [s for s in steps if s["step"] == "applyMigModeChange" and s["warning"]]
    assert "GPU 0: error setting MIG mode: In use by another client" in warned[0]["message"]
    assert {g.index: g.current for g in nvml.gpus()} == {0: {"1g.10gb": 4}, 1: {"1g.10gb": 4}}


def test_a_mode_change_pending_a_reset_fails_in_apply_without_with_reboot(shipped: Path) -> None:
    nvml, core = FakeNvml(mode_sticks=False), FakeCore(LABELS)
    state, steps = Run(shipped)("all-1g.10gb", nvml, core)
    assert state == mm.FAILED
    assert "MIG mode change did not take effect on GPU(s) [0, 1]" in " ".join(
        s["message"] for s in steps if s["step"] == "applyMigModeChange"
    )
    assert "GPU 0: error setting MIG config: Not Supported" in steps[-1]["message"]


def test_with_reboot_a_failed_mode_change_reboots_and_the_next_run_finishes_it(
    shipped: Path,
) -> None:
    nvml, core = FakeNvml(mode_sticks=False), FakeCore(LABELS)
    run = Run(shipped, with_reboot=True)
    state, steps = run("all-1g.10gb", nvml, core)
    assert (state, run.reboots) == (mm.REBOOTING, 1)
    assert core.labels[STATE] == mm.REBOOTING and core.labels[DP] == mm.PAUSED  # no setState
    assert steps[-1]["step"] == "setState" and "rebooting the node" in steps[-1]["message"]
    # after the boot the pending mode took effect; a new process (fresh flags) goes on
    nvml.reboot()
    state, steps = Run(shipped, with_reboot=True)("all-1g.10gb", nvml, core)
    assert state == mm.SUCCESS
    assert {g.index: g.current for g in nvml.gpus()} == {0: {"1g.10gb": 4}, 1: {"1g.10gb": 4}}
    assert core.labels[DP] == "true"


def test_after_a_reboot_a_mode_that_did_not_change_fails(shipped: Path) -> None:
    """checkMigModeChangeRequired: "MIG mode change did not take effect after rebooting"."""
    nvml, core = FakeNvml(mode_sticks=False), FakeCore({**LABELS, STATE: mm.REBOOTING})
    core.labels[DP] = mm.PAUSED  # as the reboot left it
    run = Run(shipped, with_reboot=True)
    state, steps = run("all-1g.10gb", nvml, core)
    assert (state, run.reboots) == (mm.FAILED, 0)
    assert steps[-1]["message"].endswith("MIG mode change did not take effect after rebooting")
    assert core.labels[DP] == "true" and nvml.calls == []


def test_a_reboot_traces_it_and_sets_the_stop_event_so_run_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """WITH_REBOOT's ``chroot /host reboot``, simulated: the process's run() returns (its
    container restarts, as after the node's reboot)."""
    steps = Steps()
    opts = mm.Options(NODE, NS, with_reboot=True)
    manager = mm.MigManager(client.ApiClient(), opts, steps)  # type: ignore[arg-type]
    started = threading.Event()
    monkeypatch.setattr(manager, "setup", started.set)  # no NVML, no API
    monkeypatch.setattr(manager.informer, "start", lambda: None)
    monkeypatch.setattr(manager.informer, "stop", lambda: None)
    stop = threading.Event()  # the process's: a signal sets it, or the reboot
    runner = threading.Thread(target=manager.run, args=(stop,), daemon=True)
    runner.start()
    assert started.wait(5)
    runner.join(timeout=0.2)
    assert runner.is_alive() and not stop.is_set()  # run() waits
    manager.reboot()
    runner.join(timeout=5)
    assert stop.is_set() and not runner.is_alive()
    assert [s["step"] for s in steps] == ["reboot"]
    assert steps[0]["message"].startswith("Rebooting the node...")


def test_the_pause_and_resume_values() -> None:
    assert mm.maybe_set_paused("true") == mm.PAUSED
    assert mm.maybe_set_paused("") == mm.PAUSED
    assert mm.maybe_set_paused("false") == "false"
    assert mm.maybe_set_true(mm.PAUSED) == "true"
    assert mm.client_labels({}, mm.maybe_set_true) == dict.fromkeys(mm.CLIENT_LABELS, "true")


# ---------------------------------------------------------------- setupMigConfig


def _setup(tmp_path: Path, gpus: list[Gpu], core: FakeCore, **opts: Any) -> tuple[Path, Steps]:
    steps = Steps()
    options = mm.Options(NODE, NS, generated_config_file=tmp_path / "etc" / "generated.yaml",
                         pod_name="mig-manager-abc", pod_namespace=NS, **opts)  # fmt: skip
    return mm.setup_mig_config(options, gpus, core, steps), steps  # type: ignore[arg-type]


def test_without_a_custom_config_the_config_is_built_from_the_gpus_and_published(
    tmp_path: Path, shipped: Path
) -> None:
    core = FakeCore(LABELS)
    path, steps = _setup(tmp_path, [a100_40(0), a100_40(1)], core, default_config_file=shipped)
    assert path == tmp_path / "etc" / "generated.yaml"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    text = path.read_text()
    assert migparted.parse_spec(text).mig_configs["all-1g.10gb"][0].mig_devices == {"1g.10gb": 4}
    cm = core.configmaps[f"{NODE}-mig-config"]
    assert cm["metadata"]["namespace"] == NS and cm["data"] == {"config.yaml": text}
    assert cm["metadata"]["labels"] == {"app.kubernetes.io/component": "nvidia-mig-manager",
                                        "nvidia.com/node-name": NODE}  # fmt: skip
    assert cm["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "mig-manager-abc", "uid": "uid-mig-manager-abc"}
    ]
    assert steps[-1]["message"].endswith(f"ConfigMap {NS}/{NODE}-mig-config")
    # a new pod on the node updates the ConfigMap the old one made
    _setup(tmp_path, [a100_40(0)], core)
    assert core.configmaps[f"{NODE}-mig-config"]["metadata"]["resourceVersion"] == "7"


def test_a_custom_config_is_used_as_it_is(tmp_path: Path, shipped: Path) -> None:
    core = FakeCore(LABELS)
    assert _setup(tmp_path, [a100_40(0)], core, config_file=shipped)[0] == shipped
    assert core.configmaps == {}
    with pytest.raises(CLIError, match="failed to read custom config"):
        _setup(tmp_path, [a100_40(0)], core, config_file=tmp_path / "missing.yaml")


def test_without_profiles_the_default_config_is_the_fallback(tmp_path: Path, shipped: Path) -> None:
    bare = Gpu(0, "NVIDIA A100-SXM4-40GB", 0x20B010DE, True)  # NVML listed no profile
    core = FakeCore(LABELS)
    assert _setup(tmp_path, [bare], core, default_config_file=shipped)[0] == shipped
    assert core.configmaps == {}
    with pytest.raises(CLIError, match="no default config available: no MIG profiles"):
        _setup(tmp_path, [bare], core, default_config_file=tmp_path / "missing.yaml")
    with pytest.raises(CLIError, match="failed to generate MIG config: no MIG-capable devices"):
        _setup(tmp_path, [t4(0)], core, default_config_file=shipped)


def test_a_configmap_that_cannot_be_published_is_only_a_warning(tmp_path: Path) -> None:
    steps = Steps()
    opts = mm.Options(NODE, NS, generated_config_file=tmp_path / "generated.yaml")  # no POD_*
    path = mm.setup_mig_config(opts, [a100_40(0)], FakeCore(LABELS), steps)  # type: ignore[arg-type]
    assert path.is_file()
    step = steps[-1]
    assert step["warning"]
    assert (
        "Failed to create node ConfigMap: POD_NAMESPACE environment variable not set"
        in (step["message"])
    )
