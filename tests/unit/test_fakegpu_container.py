"""`gpulab fake-gpu run` (gpulab.fakegpu.container): a container's GPU environment, from
kubelet where one runs it, from the node agent's record on the local backend."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpulab.fakegpu import container

RECORD = {"NVIDIA_VISIBLE_DEVICES": "GPU-x", "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m"}


def pod(record: dict[str, str] | None) -> dict[str, Any]:
    annos = {"gpulab.io/allocate-cuda": json.dumps({"envs": record})} if record else {}
    return {"metadata": {"name": "p", "annotations": annos}}


def test_the_record_of_this_container_is_awaited() -> None:
    reads = iter([pod(None), pod(None), pod(RECORD)])
    assert container.wait_for_envs(lambda: next(reads), "cuda", 5) == RECORD
    assert container.allocated_envs(pod(RECORD), "other") is None


def test_no_record_in_time_says_what_to_check() -> None:
    with pytest.raises(container.RunError, match=r"gpulab\.io/allocate-cuda.*node agent"):
        container.wait_for_envs(lambda: pod(None), "cuda", 0.3)


def test_a_container_kubelet_started_keeps_its_environment() -> None:
    """NVIDIA_VISIBLE_DEVICES set: a real kubelet passed Allocate's envs; no API call."""
    env = {"NVIDIA_VISIBLE_DEVICES": "GPU-y", "PATH": "/bin"}
    assert container.environment(env, "p", "ns", "cuda", 0) == env
