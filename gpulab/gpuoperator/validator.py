"""``gpulab nvidia-validator``: the operator's validator, one component per run.

Mirrors NVIDIA gpu-operator v26.7.0 ``cmd/nvidia-validator/main.go``: each component
deletes its status file, validates, and writes the file again
(``/run/nvidia/validations/<component>-ready``) - the markers the other operands' init
containers wait for:

- ``driver``: is the driver the operator's (a driver DaemonSet owned by a ClusterPolicy)?
  Then wait for the driver container (``.driver-ctr-ready``) and check the driver works;
  with ``WITH_WAIT`` retry until it does. Writes ``driver-ready`` with
  ``IS_HOST_DRIVER``, ``NVIDIA_DRIVER_ROOT`` ... (the MIG manager sources it);
- ``toolkit``: the container stack works (upstream: nvidia-smi in a container the runtime
  set up) → ``toolkit-ready``;
- ``cuda``: a CUDA workload pod ran (``WITH_WORKLOAD``) → ``cuda-ready``;
- ``plugin``: the node advertises a GPU resource (``nvidia.com/gpu`` or
  ``nvidia.com/mig-*`` capacity), retried 30 times → ``plugin-ready``.

Lab: "the driver works" means the NVML shim initialises and lists the node's GPUs
(nvmlInit, nvmlDeviceGetCount - what nvidia-smi asks; the driver root is the shim's node
state); the toolkit check waits for the simulated toolkit's install in
``--toolkit-install-dir`` (upstream's validation pod could not even start before the
runtime was installed) and then asks NVML; there is no CUDA, so the cuda component
refuses ``WITH_WORKLOAD=true`` and otherwise checks NVML; the plugin check retries every
``--sleep-interval-seconds`` (upstream: a fixed 5 s). Each step is traced as an Event on
the node.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulab.errors import CLIError
from gpulab.trace import ObjectRef, Tracer

COMPONENTS = ("driver", "toolkit", "cuda", "plugin")
DRIVER_CTR_READY = ".driver-ctr-ready"
TOOLKIT_RUNTIME = Path("toolkit") / "nvidia-container-runtime"
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
PLUGIN_RETRIES = 30  # gpuResourceDiscoveryWaitRetries
DRIVER_COMPONENT_LABEL = "app.kubernetes.io/component=nvidia-driver"


class ValidationError(CLIError):
    """The component is not ready; the message says what is missing."""


@dataclass(frozen=True)
class Options:
    component: str
    node: str
    namespace: str
    output_dir: Path
    with_wait: bool = False
    with_workload: bool = True
    sleep_seconds: float = 5.0
    toolkit_install_dir: Path = Path("/usr/local/nvidia")


def status_file(opts: Options, component: str) -> Path:
    return opts.output_dir / f"{component}-ready"


def driver_status(is_host_driver: bool, driver_root: str) -> str:
    """``Driver.createStatusFile``: sourced by the MIG manager's entrypoint."""
    ctr_path = "/host" if is_host_driver else "/run/nvidia/driver"
    return "".join(
        f"{k}={v}\n"
        for k, v in (
            ("IS_HOST_DRIVER", str(is_host_driver).lower()),
            ("NVIDIA_DRIVER_ROOT", driver_root),
            ("DRIVER_ROOT_CTR_PATH", ctr_path),
            ("NVIDIA_DEV_ROOT", driver_root),
            ("DEV_ROOT_CTR_PATH", ctr_path),
        )
    )


def gpu_resource(capacity: Mapping[str, Any]) -> str | None:
    """``availableMIGResourceName`` / ``availableGenericResourceName``: a GPU resource the
    node has at least one of (MIG first)."""
    for prefix in ("nvidia.com/mig-", "nvidia.com/gpu"):
        for name, value in sorted(capacity.items()):
            if name.startswith(prefix) and _quantity(value) >= 1:
                return name
    return None


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def nvml_summary() -> str:
    """What nvidia-smi would show first: the GPUs NVML lists (raises NVMLError)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        names = {
            pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)
        }
        driver = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    return f"{count} GPU(s) ({', '.join(sorted(names))}), driver {driver}"


class Validator:
    """One run: ``validateComponent`` for ``opts.component``."""

    def __init__(
        self,
        opts: Options,
        api: Any,
        tracer: Tracer,
        sleep: Callable[[float], None],
        nvml: Callable[[], str] = nvml_summary,
    ) -> None:
        self.opts = opts
        self.api = api
        self.tracer = tracer
        self.sleep = sleep
        self.nvml = nvml
        self.node = ObjectRef("Node", opts.node)

    def run(self) -> str:
        if self.opts.component not in COMPONENTS:
            raise ValidationError(
                f"invalid component {self.opts.component!r}; the lab validates: "
                f"{', '.join(COMPONENTS)}"
            )
        self.opts.output_dir.mkdir(parents=True, exist_ok=True)
        path = status_file(self.opts, self.opts.component)
        path.unlink(missing_ok=True)  # deleteStatusFile
        content, detail = getattr(self, self.opts.component)()
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(content)
        tmp.replace(path)
        message = f"{self.opts.component}: {detail} → {path.name}"
        self.tracer.step("validate", self.node, message, component=self.opts.component)
        return message

    # ------------------------------------------------------------ helpers

    def _until(self, check: Callable[[], str | None], what: str, wait: bool) -> str:
        """``runCommandWithWait``: retry ``check`` (None = not yet) when waiting."""
        while True:
            result = check()
            if result is not None:
                return result
            if not wait:
                raise ValidationError(f"{self.opts.component} is not ready: {what}")
            print(f"{what}; retrying in {self.opts.sleep_seconds:g}s", flush=True)
            self.sleep(self.opts.sleep_seconds)

    def _nvml(self) -> str | None:
        import pynvml

        try:
            return self.nvml()
        except pynvml.NVMLError as exc:
            print(f"NVML: {exc}", flush=True)
            return None

    # ------------------------------------------------------------ components

    def driver(self) -> tuple[str, str]:
        managed = self._driver_managed_by_operator()
        if managed:
            ready = self.opts.output_dir / DRIVER_CTR_READY
            self._until(
                lambda: "" if ready.exists() else None,
                "waiting for the driver container to be ready (.driver-ctr-ready)",
                self.opts.with_wait,
            )
        summary = self._until(self._nvml, "the driver (NVML) does not answer", self.opts.with_wait)
        root = os.environ.get("FAKE_GPU_CONFIG", "")
        how = "driver container" if managed else "pre-installed driver"
        return driver_status(not managed, str(Path(root).parent)), f"{how}: {summary}"

    def _driver_managed_by_operator(self) -> bool:
        """``isDriverManagedByOperator``: a driver DaemonSet a ClusterPolicy controls."""
        from kubernetes import client

        dss = client.AppsV1Api(self.api).list_namespaced_daemon_set(
            self.opts.namespace, label_selector=DRIVER_COMPONENT_LABEL
        )
        return any(
            ref.controller and ref.kind in ("ClusterPolicy", "NVIDIADriver")
            for ds in dss.items
            for ref in ds.metadata.owner_references or []
        )

    def toolkit(self) -> tuple[str, str]:
        runtime = self.opts.toolkit_install_dir / TOOLKIT_RUNTIME
        self._until(
            lambda: "" if runtime.exists() else None,
            f"waiting for the container toolkit in {self.opts.toolkit_install_dir}",
            True,
        )
        summary = self._until(self._nvml, "NVML does not answer", self.opts.with_wait)
        # the toolkit container writes the runtime as it starts: its pod may be reported
        # Running only after this line
        return "", f"container toolkit installed (its container wrote {runtime}); {summary}"

    def cuda(self) -> tuple[str, str]:
        if self.opts.with_workload:
            raise ValidationError(
                "the lab has no CUDA to run a validation workload with: set WITH_WORKLOAD=false"
            )
        summary = self._until(self._nvml, "NVML does not answer", self.opts.with_wait)
        return "", f"no CUDA workload (lab); {summary}"

    def plugin(self) -> tuple[str, str]:
        if self.opts.with_workload:
            raise ValidationError(
                "the lab runs no plugin validation workload pod: set WITH_WORKLOAD=false"
            )
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        for attempt in range(1, PLUGIN_RETRIES + 1):
            capacity = core.read_node(self.opts.node).status.capacity or {}
            name = gpu_resource(capacity)
            if name is not None:
                return "", f"node advertises {name}: {capacity[name]}"
            print(f"GPU resources are not yet discovered by the node, retry: {attempt}", flush=True)
            self.sleep(self.opts.sleep_seconds)
        raise ValidationError("GPU resources are not discovered by the node")
