"""A Binding the API server never answers (down, or stalled on a frozen etcd) is a
BindError its caller handles, not a urllib3 exception lost in a worker thread: the
Volcano cache forgets the bind it assumed, so the task is scheduled again instead of
staying "Binding" in every later session (found by tests/e2e/test_reliability.py)."""

from __future__ import annotations

import io

import pytest
from kubernetes import client

from gpulab.framework.binding import BindError, KubeBinder
from gpulab.trace import Tracer
from gpulab.volcano.scheduler.cache import SchedulerCache
from harness.ports import free_port

POD = {"metadata": {"name": "w-0", "namespace": "team", "uid": "u-1"}, "spec": {}}


def _unreachable() -> client.ApiClient:
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{free_port()}"
    config.retries = 0
    return client.ApiClient(config)


def test_an_unreachable_api_server_is_a_bind_error_without_a_status() -> None:
    with pytest.raises(BindError) as err:
        KubeBinder(_unreachable()).bind(POD, "gpu-0")
    assert err.value.status is None
    assert str(err.value).startswith("binding team/w-0 to gpu-0: ")


def test_the_volcano_cache_forgets_a_bind_that_was_never_answered() -> None:
    log = io.StringIO()
    cache = SchedulerCache(_unreachable(), Tracer("vc-scheduler", stream=log))
    cache._overlay.binding["u-1"] = "gpu-0"  # as add_bind_task assumes it
    cache._bind(POD, "gpu-0")
    assert "u-1" not in cache._overlay.binding
    assert "Scheduled" not in log.getvalue()
