"""``gpulab nvidia-mig-manager``: applies the node's ``nvidia.com/mig.config`` through NVML.

Mirrors NVIDIA mig-parted v0.15.0 ``cmd/nvidia-mig-manager/main.go`` (watch the node's
``nvidia.com/mig.config`` label - ``ContinuouslySyncMigConfigChanges`` - and apply each
new value) and ``pkg/mig/reconfigure/reconfigure.go`` (``Run``: ``validateMigConfig`` →
``isConfigAlreadyApplied`` → ``nvidia.com/mig.config.state=pending`` →
``shutdownKubernetesGPUClients`` (each GPU client's ``nvidia.com/gpu.deploy.<client>``
label set to ``paused-for-mig-change`` unless it is ``false``) → ``waitForPodsToBeDeleted``
→ ``applyMigModeChange`` → ``applyMigConfig`` → ``restartValidatorPod`` →
``restartKubernetesGPUClients`` → ``setState(success)``; any failure ends in
``setState(failed)``, which re-enables the clients). The NVML calls are mig-parted's
(``pkg/mig/mode``: ``nvmlDeviceSetMigMode``; ``pkg/mig/config``: ``ClearMigConfig`` destroys
every compute then GPU instance, ``SetMigConfig`` creates a GPU instance and its compute
instance per MIG device, largest first), made with pynvml on the node's NVML (the shim,
which keeps the result for the device plugin's next start).

Deliberate differences: the config is the ConfigMap's file (``CONFIG_FILE``, else
``DEFAULT_CONFIG_FILE``; v0.15.0 first generates one from the GPUs' profiles and keeps the
ConfigMap as its fallback); the mig-parted steps run in-process instead of as
``nvidia-mig-parted`` commands; before anything changes, a layout a GPU cannot hold fails
(mig-parted would clear the GPU and leave it without MIG devices), and if applying still
fails every GPU gets its old MIG mode and devices back; a failure before the clients
were paused changes no label but the state; the failure's reason is an Event on the
node (upstream: the pod's log); no host systemd services are stopped (the lab's nodes
have none); no CDI spec is written.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from gpulab.deviceplugin.rm import mig_profile_name
from gpulab.gpuoperator import migparted, nodelabels
from gpulab.gpuoperator.migparted import GiProfile, Gpu, MigConfigError, Target
from gpulab.informer import NODES, Handlers, Informer, ListWatch
from gpulab.trace import ObjectRef, Tracer
from gpulab.wait import WaitTimeout, wait_for
from gpulab.workqueue import WorkQueue, run_worker

_log = logging.getLogger("gpulab.gpuoperator.migmanager")

PENDING, SUCCESS, FAILED = "pending", "success", "failed"
PAUSED = "paused-for-mig-change"
# the GPU clients reconfigure.go pauses, and the pods it waits for
CLIENT_LABELS = tuple(
    nodelabels.DEPLOY_PREFIX + c
    for c in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm")
)
CLIENT_LABEL = nodelabels.DEPLOY_PREFIX + "client"
CLIENT_PODS = (
    "app=nvidia-device-plugin-daemonset",
    "app=gpu-feature-discovery",
    "app=nvidia-dcgm-exporter",
    "app=nvidia-dcgm",
)
VALIDATION_PODS = ("app=nvidia-cuda-validator", "app=nvidia-device-plugin-validator")
VALIDATOR_POD = "app=nvidia-operator-validator"
POD_DELETION_TIMEOUT = 300.0


def maybe_set_paused(value: str) -> str:
    return "false" if value == "false" else PAUSED


def maybe_set_true(value: str) -> str:
    return "false" if value == "false" else "true"


def client_labels(labels: Mapping[str, str], change: Callable[[str], str]) -> dict[str, str]:
    """The GPU clients' deploy labels as ``change`` makes them (``gpu.deploy.client`` only
    when the node has it)."""
    out = {key: change(labels.get(key, "")) for key in CLIENT_LABELS}
    if labels.get(CLIENT_LABEL):
        out[CLIENT_LABEL] = change(labels[CLIENT_LABEL])
    return out


# ---------------------------------------------------------------- NVML


class Nvml:
    """The NVML calls of mig-parted, through pynvml; ``calls`` records them for the trace."""

    def __init__(self) -> None:
        import pynvml

        self.N = pynvml
        self.calls: list[str] = []

    def _handle(self, index: int) -> Any:
        return self.N.nvmlDeviceGetHandleByIndex(index)

    def gpus(self) -> list[Gpu]:
        N = self.N
        out = []
        for index in range(N.nvmlDeviceGetCount()):
            h = self._handle(index)
            total = N.nvmlDeviceGetMemoryInfo(h).total // 2**20
            try:
                mode, _pending = N.nvmlDeviceGetMigMode(h)
                capable = True
            except N.NVMLError_NotSupported:
                mode, capable = 0, False
            profiles = {}
            if capable:
                for enum in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
                    try:
                        info = N.nvmlDeviceGetGpuInstanceProfileInfo(h, enum)
                    except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
                        continue
                    name = mig_profile_name(info.sliceCount, info.memorySizeMB, total)
                    profiles[name] = GiProfile(
                        name, info.id, info.sliceCount, info.memorySizeMB, info.instanceCount
                    )
            current: dict[str, int] = {}
            if capable and mode:
                for gi, profile in self._instances(h, profiles):
                    if self._compute_instances(gi):
                        current[profile.name] = current.get(profile.name, 0) + 1
            out.append(
                Gpu(
                    index=index,
                    name=N.nvmlDeviceGetName(h),
                    device_id=N.nvmlDeviceGetPciInfo(h).pciDeviceId,
                    mig_capable=capable,
                    mig_enabled=bool(mode),
                    memory_mib=total,
                    profiles=profiles,
                    current=current,
                )
            )
        return out

    def _instances(self, h: Any, profiles: Mapping[str, GiProfile]) -> list[tuple[Any, GiProfile]]:
        """``WalkGpuInstances``: every GPU instance, with its profile."""
        found = []
        for profile in profiles.values():
            arr = (self.N.c_nvmlGpuInstance_t * 8)()
            count = ctypes.c_uint()
            self.N.nvmlDeviceGetGpuInstances(h, profile.gi_id, arr, ctypes.byref(count))
            found += [(arr[i], profile) for i in range(count.value)]
        return found

    def _compute_instances(self, gi: Any) -> list[Any]:
        """``WalkComputeInstances``."""
        N = self.N
        out = []
        for ci_profile in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_profile, N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
                continue
            arr = (N.c_nvmlComputeInstance_t * 8)()
            count = ctypes.c_uint()
            N.nvmlGpuInstanceGetComputeInstances(gi, info.id, arr, ctypes.byref(count))
            out += [arr[i] for i in range(count.value)]
        return out

    def clear(self, gpu: Gpu) -> None:
        """``ClearMigConfig``: every compute instance, then its GPU instance."""
        h = self._handle(gpu.index)
        for gi, _profile in self._instances(h, gpu.profiles):
            for ci in self._compute_instances(gi):
                self.N.nvmlComputeInstanceDestroy(ci)
                self.calls.append(f"GPU {gpu.index}: nvmlComputeInstanceDestroy")
            self.N.nvmlGpuInstanceDestroy(gi)
            self.calls.append(f"GPU {gpu.index}: nvmlGpuInstanceDestroy")

    def set_mode(self, gpu: Gpu, enabled: bool) -> None:
        """``SetMigMode``."""
        self.N.nvmlDeviceSetMigMode(self._handle(gpu.index), 1 if enabled else 0)
        self.calls.append(f"GPU {gpu.index}: nvmlDeviceSetMigMode({int(enabled)})")

    def create(self, gpu: Gpu, profile: GiProfile) -> None:
        """One MIG device: a GPU instance and its full-size compute instance."""
        N = self.N
        gi = N.nvmlDeviceCreateGpuInstance(self._handle(gpu.index), profile.gi_id)
        self.calls.append(f"GPU {gpu.index}: nvmlDeviceCreateGpuInstance({profile.name})")
        ci_profile = next(
            p
            for p in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
            if _ci_slices(N, gi, p) == profile.slices
        )
        info = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, ci_profile, N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        )
        N.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
        self.calls.append(f"GPU {gpu.index}: nvmlGpuInstanceCreateComputeInstance")


def _ci_slices(N: Any, gi: Any, ci_profile: int) -> int:
    try:
        info = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, ci_profile, N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        )
    except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
        return 0
    return int(info.sliceCount)


# ---------------------------------------------------------------- reconfigure


class ReconfigureError(RuntimeError):
    """A step failed; the message is the one-line reason the node's Event carries."""


@dataclass
class Options:
    node: str
    config_file: Path
    namespace: str  # DEFAULT_GPU_CLIENTS_NAMESPACE
    pod_deletion_timeout: float = POD_DELETION_TIMEOUT


@dataclass
class Reconfigure:
    """``reconfigure.Reconfigure``: one run for one value of nvidia.com/mig.config."""

    opts: Options
    core: client.CoreV1Api
    nvml: Nvml
    tracer: Tracer
    selected: str
    labels: dict[str, str] = field(default_factory=dict)
    paused: bool = False

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef("Node", self.opts.node)

    def step(self, name: str, message: str, **detail: Any) -> None:
        self.tracer.step(name, self.ref, message, config=self.selected, **detail)

    def run(self) -> str:
        """``Run``: returns the final state (success | failed)."""
        node = self.core.read_node(self.opts.node)
        self.labels = dict(node.metadata.labels or {})
        try:
            targets, gpus = self.validate()
            if migparted.config_applied(targets, gpus):
                self.step("isConfigAlreadyApplied", f"{self.selected} is already applied")
                return self.set_state(SUCCESS)
            self.set_label(nodelabels.MIG_CONFIG_STATE_LABEL, PENDING)
            self.step("setState", f"{nodelabels.MIG_CONFIG_STATE_LABEL}={PENDING}")
            self.shutdown_clients()
            self.wait_for_pods_deleted()
            try:
                self.apply_mode_change(targets, gpus)
                self.apply_config(targets)
            except ReconfigureError:
                self.restore(gpus)
                raise
            self.delete_pods(VALIDATOR_POD)  # restartValidatorPod
            self.restart_clients()
            return self.set_state(SUCCESS)
        except (MigConfigError, ReconfigureError, WaitTimeout) as exc:
            return self.set_state(FAILED, str(exc))

    def validate(self) -> tuple[dict[int, Target], list[Gpu]]:
        """``validateMigConfig`` (the file parses, the name is in it), and the lab's check
        that every selected GPU can hold its layout."""
        try:
            text = self.opts.config_file.read_text()
        except OSError as exc:
            raise MigConfigError(f"cannot read {self.opts.config_file}: {exc.strerror}") from None
        specs = migparted.select(migparted.parse_spec(text), self.selected)
        gpus = self.nvml.gpus()
        targets = migparted.layout(specs, gpus)
        problems = migparted.check(targets, gpus)
        if problems:
            raise MigConfigError(f"{self.selected}: {problems[0]}")
        self.step("validateMigConfig", f"selected mig-config {self.selected} is valid")
        return targets, gpus

    def set_label(self, key: str, value: str) -> None:
        self.set_labels({key: value})

    def set_labels(self, labels: Mapping[str, str]) -> None:
        self.core.patch_node(self.opts.node, {"metadata": {"labels": dict(labels)}})

    def shutdown_clients(self) -> None:
        """``shutdownKubernetesGPUClients``: their DaemonSets leave the node."""
        paused = client_labels(self.labels, maybe_set_paused)
        self.set_labels(paused)
        self.paused = True
        self.step(
            "shutdownKubernetesGPUClients",
            ", ".join(f"{k}={v}" for k, v in sorted(paused.items())),
        )

    def _pods(self, selector: str) -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(
            self.opts.namespace,
            label_selector=selector,
            field_selector=f"spec.nodeName={self.opts.node}",
        ).items

    def wait_for_pods_deleted(self) -> None:
        """``waitForPodsToBeDeleted``: the device plugin, GFD, dcgm-exporter and dcgm pods
        and the DaemonSet pods selecting gpu.deploy.client are gone; the validation
        workload pods are deleted."""
        for selector in CLIENT_PODS:
            wait_for(
                lambda s=selector: not self._pods(s),
                self.opts.pod_deletion_timeout,
                f"{selector} pods on {self.opts.node} to shut down",
                interval=0.5,
            )

        def no_client_pods() -> bool:
            pods = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.opts.node}"
            ).items
            return not any(
                CLIENT_LABEL in (p.spec.node_selector or {})
                and any(
                    r.kind == "DaemonSet" and r.controller
                    for r in p.metadata.owner_references or []
                )
                for p in pods
            )

        wait_for(no_client_pods, self.opts.pod_deletion_timeout, "gpu.deploy.client pods", 0.5)
        for selector in VALIDATION_PODS:
            self.delete_pods(selector)
        self.step("waitForPodsToBeDeleted", "the GPU clients' pods are gone from the node")

    def delete_pods(self, selector: str) -> None:
        for pod in self._pods(selector):
            self.core.delete_namespaced_pod(pod.metadata.name, self.opts.namespace)

    def _nvml(self, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except self.nvml.N.NVMLError as exc:
            raise ReconfigureError(f"{what}: {exc}") from None

    def apply_mode_change(self, targets: Mapping[int, Target], gpus: list[Gpu]) -> None:
        """``applyMigModeChange`` (mig-parted ``apply --mode-only``): on every selected
        MIG-capable GPU, clear its MIG devices if MIG is on, set the wanted mode."""
        start = len(self.nvml.calls)
        for gpu in gpus:
            target = targets.get(gpu.index)
            if target is None or not gpu.mig_capable:
                continue
            if gpu.mig_enabled:
                self._nvml(
                    f"GPU {gpu.index}: clearing MIG devices", lambda g=gpu: self.nvml.clear(g)
                )
            self._nvml(
                f"GPU {gpu.index}: setting MIG mode",
                lambda g=gpu, t=target: self.nvml.set_mode(g, t.mig_enabled),
            )
        calls = self.nvml.calls[start:]
        self.step("applyMigModeChange", _summary(calls), calls=calls)

    def apply_config(self, targets: Mapping[int, Target]) -> None:
        """``applyMigConfig`` (mig-parted ``apply``): each MIG-enabled GPU gets its MIG
        devices, largest first (``SetMigConfig``: clear what is there, then create)."""
        start = len(self.nvml.calls)
        for gpu in self.nvml.gpus():
            target = targets.get(gpu.index)
            if target is None or not gpu.mig_capable or not target.mig_enabled:
                continue
            if gpu.current == target.devices:
                continue
            try:
                if gpu.current:
                    self.nvml.clear(gpu)
                for name in migparted.flatten(target.devices):
                    self.nvml.create(gpu, gpu.profiles[name])
            except self.nvml.N.NVMLError as exc:
                raise ReconfigureError(
                    f"GPU {gpu.index}: error setting MIG config: {exc}"
                ) from None
        calls = self.nvml.calls[start:]
        self.step("applyMigConfig", _summary(calls), calls=calls)

    def restore(self, before: list[Gpu]) -> None:
        """(lab) Every GPU back as it was before the change: MIG mode and MIG devices."""
        start = len(self.nvml.calls)
        now = {g.index: g for g in self.nvml.gpus()}
        for old in before:
            gpu = now[old.index]
            if not gpu.mig_capable or (gpu.mig_enabled, gpu.current) == (
                old.mig_enabled,
                old.current,
            ):
                continue
            if gpu.current:
                self.nvml.clear(gpu)
            if gpu.mig_enabled != old.mig_enabled:
                self.nvml.set_mode(gpu, old.mig_enabled)
            for name in migparted.flatten(old.current):
                self.nvml.create(gpu, gpu.profiles[name])
        calls = self.nvml.calls[start:]
        self.step("restore", "the previous MIG layout is back: " + _summary(calls), calls=calls)

    def restart_clients(self) -> None:
        """``restartKubernetesGPUClients``."""
        restored = client_labels(self.labels, maybe_set_true)
        self.set_labels(restored)
        self.paused = False
        self.step(
            "restartKubernetesGPUClients",
            ", ".join(f"{k}={v}" for k, v in sorted(restored.items())),
        )

    def set_state(self, state: str, reason: str = "") -> str:
        """``setState``: the clients back (if they were paused), then the state label."""
        if self.paused:
            self.set_labels(client_labels(self.labels, maybe_set_true))
            self.paused = False
        self.set_label(nodelabels.MIG_CONFIG_STATE_LABEL, state)
        message = f"{nodelabels.MIG_CONFIG_STATE_LABEL}={state}"
        self.step("setState", f"{message}: {reason}" if reason else message,
                  warning=state == FAILED)  # fmt: skip
        return state


def _summary(calls: list[str]) -> str:
    """ "GPU 0: nvmlDeviceSetMigMode(1) x1, ..." - the calls, counted."""
    counted: dict[str, int] = {}
    for call in calls:
        counted[call] = counted.get(call, 0) + 1
    return "; ".join(f"{c} x{n}" if n > 1 else c for c, n in counted.items()) or "no NVML call"


# ---------------------------------------------------------------- the manager loop


class MigManager:
    """``start``: follow the node's label; each new value is applied once, in order."""

    def __init__(self, api: client.ApiClient, opts: Options, tracer: Tracer) -> None:
        self.api = api
        self.opts = opts
        self.tracer = tracer
        self.queue = WorkQueue()
        self.applied = ""
        self.informer = Informer(
            ListWatch(api, NODES, field_selector=f"metadata.name={opts.node}"),
            Handlers(
                on_add=lambda _n: self.queue.add(opts.node),
                on_update=lambda old, new: (
                    _mig_config(old) != _mig_config(new) and self.queue.add(opts.node)
                ),
            ),
            name="mig-config-sync",
        )

    def reconcile(self, _key: str) -> float | None:
        node = self.informer.store.get(self.opts.node)
        value = _mig_config(node)
        if not value or value == self.applied:
            return None  # SyncableMigConfig.Get blocks until a new, non-empty value
        self.tracer.step("Reconfigure", ObjectRef("Node", self.opts.node),
                         f"Updating to MIG config: {value}", config=value)  # fmt: skip
        nvml = Nvml()
        nvml.N.nvmlInit()
        try:
            Reconfigure(self.opts, client.CoreV1Api(self.api), nvml, self.tracer, value).run()
        finally:
            nvml.N.nvmlShutdown()
        self.applied = value  # an API error above is retried with back-off instead
        return None

    def run(self, stop: threading.Event) -> None:
        self.informer.start()
        worker = threading.Thread(
            target=run_worker, args=(self.queue, self.reconcile, "mig-manager"), daemon=True
        )
        worker.start()
        try:
            stop.wait()
        finally:
            self.queue.shutdown()
            self.informer.stop()


def _mig_config(node: Mapping[str, Any] | None) -> str:
    return (((node or {}).get("metadata") or {}).get("labels") or {}).get(
        nodelabels.MIG_CONFIG_LABEL, ""
    )
