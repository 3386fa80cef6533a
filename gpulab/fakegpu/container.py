"""``gpulab fake-gpu run``: start a command with the GPU environment its container was given.

On a node with a real kubelet (kind, a real cluster) kubelet calls the device plugin's
Allocate before it creates the container and hands the response to the runtime: the
container starts with ``NVIDIA_VISIBLE_DEVICES`` (and HAMi's ``CUDA_DEVICE_MEMORY_LIMIT_<i>``,
``CUDA_DEVICE_SM_LIMIT``, the fake driver's ``FAKE_GPU_CONFIG``), and the NVIDIA Container
Toolkit exposes those GPUs. There ``run`` simply executes the command.

Lab convenience, local backend only: kwok nodes have no kubelet, and the pod runner that
runs the lab's own pods (``gpulab:dev``) as host processes starts a container without that
response. The node agent (kubelet's device manager there) records each container's
response on the pod (annotation ``gpulab.io/allocate-<container>``, the lab's stand-in for
kubelet's checkpoint). ``run`` waits for this container's record, reading its own pod as
its ServiceAccount (which needs ``get`` on pods in its namespace), puts the response's
variables into its environment and executes the command, which then sees what a real
container would (``nvidia-smi`` through the NVML shim: the GPUs it was given, HAMi-core's
memory limit). The response's mounts need no work there: they are host paths, the same
inside and out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.deviceplugin.allocate import VISIBLE_DEVICES_ENV
from gpulab.errors import UserError
from gpulab.kube import SERVICEACCOUNT_DIR, api_client, mounted
from gpulab.nodeagent.policy import annotation_key
from gpulab.wait import WaitTimeout, wait_for

WAIT_SECONDS = 60.0


class RunError(UserError):
    """The container's Allocate response cannot be had; the message says why."""


def allocated_envs(pod: Mapping, container: str) -> dict[str, str] | None:
    """The variables of ``container``'s recorded Allocate response, None until recorded."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(annotation_key(container))
    return {str(k): str(v) for k, v in json.loads(raw)["envs"].items()} if raw else None


def own_namespace() -> str:
    """The pod's namespace, from its ServiceAccount token's directory."""
    path = Path(mounted(f"{SERVICEACCOUNT_DIR}/namespace"))
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise RunError(f"no ServiceAccount namespace at {path}: pass --namespace") from exc


def wait_for_envs(
    read_pod: Callable[[], Mapping], container: str, timeout: float
) -> dict[str, str]:
    """Poll the pod until the node agent has recorded ``container``'s Allocate response."""
    try:
        return wait_for(
            lambda: allocated_envs(read_pod(), container),
            timeout,
            f"the Allocate response of container {container} ({annotation_key(container)})",
            0.2,
        )
    except WaitTimeout as exc:
        raise RunError(
            f"{exc}: does the container ask for a device plugin's resource, and does the "
            "node run a node agent?"
        ) from None


def environment(
    env: Mapping[str, str], pod: str, namespace: str | None, container: str, timeout: float
) -> dict[str, str]:
    """``env`` as the container should see it: unchanged where Allocate's variables are
    there already (a real kubelet), else with the node agent's record of them."""
    if VISIBLE_DEVICES_ENV in env:
        return dict(env)
    ns = namespace or own_namespace()
    core = client.CoreV1Api(api_client())

    def read_pod() -> Mapping:
        try:
            return core.api_client.sanitize_for_serialization(core.read_namespaced_pod(pod, ns))
        except ApiException as exc:
            raise RunError(
                f"cannot read pod {ns}/{pod} ({exc.status} {exc.reason}): its ServiceAccount "
                "needs get on pods in its namespace"
            ) from None

    return {**env, **wait_for_envs(read_pod, container, timeout)}


def run(argv: Sequence[str], pod: str, namespace: str | None, container: str) -> None:
    """Replace this process with ``argv`` in the container's GPU environment."""
    if not argv:
        raise RunError("give the command to run after --")
    env = environment(os.environ, pod, namespace, container, WAIT_SECONDS)
    try:
        os.execvpe(argv[0], list(argv), env)
    except OSError as exc:
        raise RunError(f"cannot run {argv[0]}: {exc.strerror}") from exc
