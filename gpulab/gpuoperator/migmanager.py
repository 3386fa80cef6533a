"""``gpulab nvidia-mig-manager``: applies the node's ``nvidia.com/mig.config`` through NVML.

Mirrors NVIDIA mig-parted v0.15.0:

- ``cmd/nvidia-mig-manager/main.go``: ``setupMigConfig`` (the user's CONFIG_FILE if set;
  else a config built from the GPUs' own MIG profiles - ``pkg/mig/builder`` - written to
  ``/etc/nvidia-mig-manager/generated-config.yaml`` and published as the ConfigMap
  ``<node>-mig-config``, owned by the MIG manager's pod; DEFAULT_CONFIG_FILE, the
  operator's ``default-mig-parted-config``, only when NVML lists no MIG profile), then
  ``ContinuouslySyncMigConfigChanges`` (each new value of the node's
  ``nvidia.com/mig.config`` is applied once; a failed one waits for the next value);
- ``pkg/mig/reconfigure/reconfigure.go`` ``Run``: ``validateMigConfig`` →
  ``isConfigAlreadyApplied`` → ``checkMigModeChangeRequired`` (after a reboot the mode
  must have changed) → ``mig.config.state=pending`` → ``shutdownKubernetesGPUClients``
  (each GPU client's ``nvidia.com/gpu.deploy.<client>`` label, and
  ``gpu.deploy.client`` when the node has it, set to ``paused-for-mig-change`` unless
  ``false``) → ``waitForPodsToBeDeleted`` (the operator's clients, then every DaemonSet
  pod whose nodeSelector has ``gpu.deploy.client``) → ``applyMigModeChange`` →
  ``applyMigConfig`` → ``restartValidatorPod`` → ``restartKubernetesGPUClients`` →
  ``setState(success)``. Its failure paths as upstream has them: a failure before the
  change, or in applying the config, ends in ``setState(failed)``, which resumes the
  clients only until a change has once succeeded in this process
  (``NoRestartK8sDaemonsetsOnExit`` stays set: after that, a failed change leaves them
  ``paused-for-mig-change``); a timeout waiting for the clients' pods, or a failure to
  restart the validator, returns without ``setState`` (the node stays ``pending``, the
  clients paused); a failed MIG mode change is not fatal (``applyMigConfig`` sets the
  mode again) unless WITH_REBOOT is set, which makes it ``mig.config.state=rebooting``
  and reboots the node; after the reboot a mode that still did not change fails.

The NVML calls are mig-parted's (``pkg/mig/mode``: ``nvmlDeviceSetMigMode``;
``pkg/mig/config``: ``ClearMigConfig`` destroys every compute then GPU instance,
``SetMigConfig`` creates a GPU instance and its compute instance per MIG device, largest
first), made with pynvml on the node's NVML (the shim, which keeps the result for the
device plugin's next start).

Deliberate differences: the mig-parted steps run in-process instead of as
``nvidia-mig-parted`` commands; ``applyMigConfig`` first checks that every GPU can hold
its layout, and if applying fails every GPU gets its old MIG mode and devices back
(mig-parted tries every ordering and leaves a GPU it could not fill without MIG
devices); the failure's reason is a Warning Event on the node (upstream: the pod's log);
the generated config file lives in the pod's emptyDir (the local backend's pods have no
image filesystem); a reboot is simulated: the node's pods are not restarted, the MIG
manager's process exits (its container restarts, as after the node's reboot); no host
systemd services are stopped (the lab's nodes have none); no CDI spec is written.
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
from kubernetes.client.rest import ApiException

from gpulab.deviceplugin.rm import mig_profile_name
from gpulab.errors import CLIError
from gpulab.gpuoperator import migparted, nodelabels
from gpulab.gpuoperator.migparted import GiProfile, Gpu, MigConfigError, Target
from gpulab.informer import NODES, Handlers, Informer, ListWatch
from gpulab.trace import ObjectRef, Tracer
from gpulab.wait import WaitTimeout, wait_for
from gpulab.workqueue import WorkQueue, run_worker

_log = logging.getLogger("gpulab.gpuoperator.migmanager")

PENDING, SUCCESS, FAILED, REBOOTING = "pending", "success", "failed", "rebooting"
PAUSED = "paused-for-mig-change"
# the GPU clients reconfigure.go pauses
CLIENT_LABELS = tuple(
    nodelabels.DEPLOY_PREFIX + c
    for c in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm")
)
CLIENT_LABEL = nodelabels.DEPLOY_PREFIX + "client"
# waitForPodsToBeDeleted: the operator's clients' pods, by what its errors call them
CLIENT_PODS = (
    ("app=nvidia-device-plugin-daemonset", "device-plugin"),
    ("app=gpu-feature-discovery", "gpu-feature-discovery"),
    ("app=nvidia-dcgm-exporter", "dcgm-exporter"),
    ("app=nvidia-dcgm", "dcgm"),
)
VALIDATION_PODS = (
    ("app=nvidia-cuda-validator", "cuda-validator"),
    ("app=nvidia-device-plugin-validator", "plugin-validator"),
)
VALIDATOR_POD = "app=nvidia-operator-validator"
POD_DELETION_TIMEOUT = 300.0  # 5 * time.Minute
GENERATED_CONFIG_FILE = Path("/etc/nvidia-mig-manager/generated-config.yaml")
NODE_CONFIGMAP_LABELS = {"app.kubernetes.io/component": "nvidia-mig-manager"}
NODE_NAME_LABEL = "nvidia.com/node-name"


def node_configmap_name(node: str) -> str:
    """``createNodeConfigMap``'s name for the config built on ``node``."""
    return f"{node}-mig-config"


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


# ---------------------------------------------------------------- setupMigConfig


class ReconfigureError(RuntimeError):
    """A step failed; the message is the one-line reason the node's Event carries."""


@dataclass
class Options:
    node: str
    namespace: str  # DEFAULT_GPU_CLIENTS_NAMESPACE
    config_file: Path | None = None  # CONFIG_FILE: the user's config
    default_config_file: Path | None = None  # DEFAULT_CONFIG_FILE: the operator's ConfigMap
    generated_config_file: Path = GENERATED_CONFIG_FILE
    pod_name: str = ""  # POD_NAME, POD_NAMESPACE: the owner of <node>-mig-config
    pod_namespace: str = ""
    with_reboot: bool = False  # WITH_REBOOT
    pod_deletion_timeout: float = POD_DELETION_TIMEOUT
    poll_interval: float = 0.5  # upstream polls every 1 s (the gpu.deploy.client pods: 5 s)


def setup_mig_config(
    opts: Options, gpus: list[Gpu], core: client.CoreV1Api, tracer: Tracer
) -> Path:
    """``setupMigConfig``: the config file every change is read from (CLIError: none)."""
    ref = ObjectRef("Node", opts.node)
    if opts.config_file is not None:
        if not opts.config_file.is_file():
            raise CLIError(
                f"failed to setup MIG config: failed to read custom config {opts.config_file}"
            )
        tracer.step("setupMigConfig", ref, f"Using custom config: {opts.config_file}")
        return opts.config_file
    try:
        text = migparted.config_yaml(migparted.build_config(gpus))
    except migparted.NoProfilesDiscoveredError as exc:
        default = opts.default_config_file
        if default is not None and default.is_file():
            tracer.step("setupMigConfig", ref, f"{exc}: using default config {default}")
            return default
        raise CLIError(
            "failed to setup MIG config: dynamic generation failed and no default config "
            f"available: {exc}"
        ) from None
    except MigConfigError as exc:
        raise CLIError(
            f"failed to setup MIG config: failed to generate MIG config: {exc}"
        ) from None
    path = opts.generated_config_file  # GENERATED_CONFIG_FILE, where the pod has it mounted
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    name = node_configmap_name(opts.node)
    try:
        publish_node_configmap(core, opts, text)
    except (ApiException, ReconfigureError) as exc:
        why = exc if isinstance(exc, ReconfigureError) else f"{exc.status} {exc.reason}"
        tracer.step("setupMigConfig", ref, f"Generated config {GENERATED_CONFIG_FILE}; Failed "
                    f"to create node ConfigMap: {why}", warning=True)  # fmt: skip
        return path
    tracer.step("setupMigConfig", ref, f"Generated config {GENERATED_CONFIG_FILE} from the "
                f"GPUs' MIG profiles; ConfigMap {opts.pod_namespace}/{name}")  # fmt: skip
    return path


def publish_node_configmap(core: client.CoreV1Api, opts: Options, text: str) -> None:
    """``createNodeConfigMap``: ``<node>-mig-config`` in the pod's namespace, owned by the
    MIG manager's pod (it goes with the pod), created or else updated."""
    if not opts.pod_namespace:
        raise ReconfigureError("POD_NAMESPACE environment variable not set")
    if not opts.pod_name:
        raise ReconfigureError("POD_NAME environment variable not set")
    pod = core.read_namespaced_pod(opts.pod_name, opts.pod_namespace)
    name = node_configmap_name(opts.node)
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": opts.pod_namespace,
            "labels": {**NODE_CONFIGMAP_LABELS, NODE_NAME_LABEL: opts.node},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod.metadata.name,
                    "uid": pod.metadata.uid,
                }
            ],
        },
        "data": {"config.yaml": text},
    }
    try:
        core.create_namespaced_config_map(opts.pod_namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        existing = core.read_namespaced_config_map(name, opts.pod_namespace)
        body["metadata"]["resourceVersion"] = existing.metadata.resource_version
        core.replace_namespaced_config_map(name, opts.pod_namespace, body)


# ---------------------------------------------------------------- reconfigure


@dataclass
class ExitFlags:
    """reconfigure.go's ``NoRestartK8sDaemonsetsOnExit``: a package variable the first
    ``restartKubernetesGPUClients`` sets and nothing resets while the process lives; once
    set, ``setState`` no longer resumes the GPU clients."""

    no_restart_k8s_daemonsets_on_exit: bool = False


@dataclass
class Reconfigure:
    """``reconfigure.Reconfigure``: one run for one value of nvidia.com/mig.config."""

    opts: Options
    config_file: Path
    core: client.CoreV1Api
    nvml: Nvml
    tracer: Tracer
    selected: str
    flags: ExitFlags
    reboot: Callable[[], None]
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef("Node", self.opts.node)

    def step(self, name: str, message: str, warning: bool = False, **detail: Any) -> None:
        self.tracer.step(name, self.ref, message, warning=warning, config=self.selected,
                         **detail)  # fmt: skip

    def run(self) -> str:
        """``Run``: returns the node's mig.config.state as the run leaves it."""
        node = self.core.read_node(self.opts.node)
        self.labels = dict(node.metadata.labels or {})
        current_state = self.labels.get(nodelabels.MIG_CONFIG_STATE_LABEL, "")
        try:
            targets, gpus = self.validate()
        except MigConfigError as exc:
            return self.set_state(FAILED, str(exc))
        if migparted.config_applied(targets, gpus):
            self.step("isConfigAlreadyApplied", f"{self.selected} is already applied")
            return self.set_state(SUCCESS)
        if current_state == REBOOTING and not migparted.mode_applied(targets, gpus):
            return self.set_state(  # checkMigModeChangeRequired
                FAILED, "MIG mode change did not take effect after rebooting"
            )
        self.set_label(nodelabels.MIG_CONFIG_STATE_LABEL, PENDING)
        self.step("setState", f"{nodelabels.MIG_CONFIG_STATE_LABEL}={PENDING}")
        self.shutdown_clients()
        try:
            self.wait_for_pods_deleted()
        except ReconfigureError as exc:
            return self.stuck(
                "waitForPodsToBeDeleted", f"failed to wait for pods to be deleted: {exc}"
            )
        try:
            self.apply_mode_change(targets, gpus)
        except ReconfigureError as exc:
            if self.opts.with_reboot:
                self.set_label(nodelabels.MIG_CONFIG_STATE_LABEL, REBOOTING)
                self.step("setState", f"{nodelabels.MIG_CONFIG_STATE_LABEL}={REBOOTING}: {exc}; "
                          "rebooting the node", warning=True)  # fmt: skip
                self.reboot()
                return REBOOTING
            self.step("applyMigModeChange", f"{exc}; without WITH_REBOOT applyMigConfig "
                      "goes on (it sets the mode too)", warning=True)  # fmt: skip
        try:
            self.apply_config(targets)
        except ReconfigureError as exc:
            self.restore(gpus)
            return self.set_state(FAILED, f"failed to apply MIG configuration: {exc}")
        try:
            self.delete_pods(VALIDATOR_POD)  # restartValidatorPod
        except ApiException as exc:
            return self.stuck("restartValidatorPod", f"failed to restart validator pod: "
                              f"{exc.status} {exc.reason}")  # fmt: skip
        self.restart_clients()
        return self.set_state(SUCCESS)

    def stuck(self, step: str, message: str) -> str:
        """A failure ``Run`` returns without ``setState``: the state stays pending and the
        clients stay paused until the next value of nvidia.com/mig.config."""
        self.step(step, f"{message}; {nodelabels.MIG_CONFIG_STATE_LABEL} stays {PENDING}, "
                  "the GPU clients stay paused", warning=True)  # fmt: skip
        return PENDING

    def validate(self) -> tuple[dict[int, Target], list[Gpu]]:
        """``validateMigConfig`` (``assert --valid-config``: the file parses, the name is in
        it), and which GPU gets which layout."""
        try:
            text = self.config_file.read_text()
        except OSError as exc:
            raise MigConfigError(f"cannot read {self.config_file}: {exc.strerror}") from None
        specs = migparted.select(migparted.parse_spec(text), self.selected)
        gpus = self.nvml.gpus()
        self.step("validateMigConfig", f"selected mig-config {self.selected} is valid")
        return migparted.layout(specs, gpus), gpus

    def set_label(self, key: str, value: str) -> None:
        self.set_labels({key: value})

    def set_labels(self, labels: Mapping[str, str]) -> None:
        self.core.patch_node(self.opts.node, {"metadata": {"labels": dict(labels)}})

    def shutdown_clients(self) -> None:
        """``shutdownKubernetesGPUClients``: their DaemonSets leave the node."""
        paused = client_labels(self.labels, maybe_set_paused)
        self.set_labels(paused)
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

    def _client_daemonset_pods(self) -> list[client.V1Pod]:
        """``waitForPodsWithNodeSelector``: DaemonSet pods on the node, in any namespace,
        whose nodeSelector has ``nvidia.com/gpu.deploy.client`` - a third-party GPU client
        the MIG manager pauses too."""
        pods = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.opts.node}"
        ).items
        return [
            p
            for p in pods
            if CLIENT_LABEL in (p.spec.node_selector or {})
            and any(
                r.kind == "DaemonSet" and r.controller for r in p.metadata.owner_references or []
            )
        ]

    def _wait_gone(self, pods: Callable[[], list[client.V1Pod]], what: str) -> None:
        try:
            wait_for(lambda: not pods(), self.opts.pod_deletion_timeout,
                     f"{what} on {self.opts.node}", self.opts.poll_interval)  # fmt: skip
        except WaitTimeout as exc:
            raise ReconfigureError(f"{what} did not shutdown: {exc}") from None

    def wait_for_pods_deleted(self) -> None:
        """``waitForPodsToBeDeleted``: the device plugin, GFD, dcgm-exporter and dcgm pods
        and the DaemonSet pods selecting gpu.deploy.client are gone; the validation
        workload pods are deleted."""
        for selector, what in CLIENT_PODS:
            self._wait_gone(lambda s=selector: self._pods(s), f"{what} pod")
        self._wait_gone(self._client_daemonset_pods, "third-party gpu client pods")
        for selector, what in VALIDATION_PODS:
            try:
                self.delete_pods(selector)
            except ApiException as exc:
                raise ReconfigureError(
                    f"failed to delete {what} pod: {exc.status} {exc.reason}"
                ) from None
        self.step("waitForPodsToBeDeleted", "the GPU clients' pods are gone from the node")

    def delete_pods(self, selector: str) -> None:
        for pod in self._pods(selector):
            self.core.delete_namespaced_pod(pod.metadata.name, self.opts.namespace)

    def _set_modes(
        self, targets: Mapping[int, Target], gpus: list[Gpu], only_changed: bool
    ) -> None:
        """``ApplyMigMode``: on every selected MIG-capable GPU, its MIG devices cleared if
        MIG is on, then the wanted mode."""
        for gpu in gpus:
            target = targets.get(gpu.index)
            if target is None:
                continue
            if not gpu.mig_capable:
                if target.mig_enabled and not target.all_devices:
                    raise ReconfigureError(
                        f"GPU {gpu.index}: cannot set MIG mode on non MIG-capable GPU"
                    )
                continue
            if only_changed and gpu.mig_enabled == target.mig_enabled:
                continue
            try:
                if gpu.mig_enabled:
                    self.nvml.clear(gpu)
                self.nvml.set_mode(gpu, target.mig_enabled)
            except self.nvml.N.NVMLError as exc:
                raise ReconfigureError(f"GPU {gpu.index}: error setting MIG mode: {exc}") from None

    def apply_mode_change(self, targets: Mapping[int, Target], gpus: list[Gpu]) -> None:
        """``applyMigModeChange``: ``apply --mode-only``, then ``assert --mode-only`` (a
        mode NVML leaves pending a GPU reset did not change)."""
        start = len(self.nvml.calls)
        try:
            self._set_modes(targets, gpus, only_changed=False)
        finally:
            calls = self.nvml.calls[start:]
            self.step("applyMigModeChange", _summary(calls), calls=calls)
        now = self.nvml.gpus()
        if not migparted.mode_applied(targets, now):
            pending = [g.index for g in now if g.index in targets and g.mig_capable
                       and g.mig_enabled != targets[g.index].mig_enabled]  # fmt: skip
            raise ReconfigureError(f"MIG mode change did not take effect on GPU(s) {pending}")

    def apply_config(self, targets: Mapping[int, Target]) -> None:
        """``applyMigConfig`` (mig-parted ``apply``: the mode, then the MIG devices): each
        MIG-enabled GPU gets its devices, largest first (``SetMigConfig``: clear what is
        there, then create); (lab) a layout a GPU cannot hold fails before any is made."""
        start = len(self.nvml.calls)
        try:
            gpus = self.nvml.gpus()
            self._set_modes(targets, gpus, only_changed=True)
            gpus = self.nvml.gpus()
            problems = migparted.check(targets, gpus)
            if problems:
                raise ReconfigureError(f"{self.selected}: {problems[0]}")
            for gpu in gpus:
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
        finally:
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
        self.step("restore", "(lab: mig-parted would leave the GPUs as the failure left them) "
                  "the previous MIG layout is back: " + _summary(calls), calls=calls)  # fmt: skip

    def restart_clients(self) -> None:
        """``restartKubernetesGPUClients``: sets NoRestartK8sDaemonsetsOnExit first."""
        self.flags.no_restart_k8s_daemonsets_on_exit = True
        restored = client_labels(self.labels, maybe_set_true)
        self.set_labels(restored)
        self.step(
            "restartKubernetesGPUClients",
            ", ".join(f"{k}={v}" for k, v in sorted(restored.items())),
        )

    def set_state(self, state: str, reason: str = "") -> str:
        """``setState``: the clients' labels back to true (absent ones too) unless
        NoRestartK8sDaemonsetsOnExit is set, then the state label."""
        if not self.flags.no_restart_k8s_daemonsets_on_exit:
            self.set_labels(client_labels(self.labels, maybe_set_true))
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
    """``start``: set the config up, then follow the node's label; each new value is
    applied once, in order."""

    def __init__(self, api: client.ApiClient, opts: Options, tracer: Tracer) -> None:
        self.api = api
        self.opts = opts
        self.tracer = tracer
        self.queue = WorkQueue()
        self.flags = ExitFlags()
        self.config_file: Path | None = None
        self.applied = ""
        self._stop = threading.Event()
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

    def _nvml(self) -> Nvml:
        nvml = Nvml()
        nvml.N.nvmlInit()
        return nvml

    def setup(self) -> None:
        nvml = self._nvml()
        try:
            gpus = nvml.gpus()
        finally:
            nvml.N.nvmlShutdown()
        self.config_file = setup_mig_config(
            self.opts, gpus, client.CoreV1Api(self.api), self.tracer
        )

    def reboot(self) -> None:
        """``chroot /host reboot`` (lab: the node is simulated; the MIG manager's process
        exits, and its container is restarted as after the reboot)."""
        self.tracer.step("reboot", ObjectRef("Node", self.opts.node), "Rebooting the node... "
                         "(lab: the MIG manager's container exits and restarts)")  # fmt: skip
        self._stop.set()

    def reconcile(self, _key: str) -> float | None:
        node = self.informer.store.get(self.opts.node)
        value = _mig_config(node)
        if not value or value == self.applied or self.config_file is None:
            return None  # SyncableMigConfig.Get blocks until a new, non-empty value
        self.tracer.step("Reconfigure", ObjectRef("Node", self.opts.node),
                         f"Updating to MIG config: {value}", config=value)  # fmt: skip
        nvml = self._nvml()
        try:
            Reconfigure(self.opts, self.config_file, client.CoreV1Api(self.api), nvml,
                        self.tracer, value, self.flags, self.reboot).run()  # fmt: skip
        finally:
            nvml.N.nvmlShutdown()
        self.applied = value  # an API error above is retried with back-off instead
        return None

    def run(self, stop: threading.Event) -> None:
        """Until ``stop`` is set: by a signal, or by a (simulated) reboot."""
        self._stop = stop
        self.setup()
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
