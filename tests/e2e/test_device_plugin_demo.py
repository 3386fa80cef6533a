"""`make demo-device-plugin` from a stopped cluster, on a cluster of the demo's shape
(harness/clusters/device-plugin-e2e.yaml). A module of its own, not one of the modules on
the session `e2e` cluster: that cluster would sit idle while this one runs."""

from __future__ import annotations

import argparse

import pytest

from harness.local import LocalCluster
from harness.spec import load


@pytest.mark.local_backend
def test_the_demo_passes_from_a_stopped_cluster() -> None:
    """`gpulab down; make demo-device-plugin`, on a cluster of the demo's shape."""
    from demos import device_plugin as demo

    spec_name = "device-plugin-e2e"
    local = LocalCluster(load(spec_name))
    local.down(print)
    assert not local.running()
    try:
        assert demo.run(argparse.Namespace(spec=spec_name, backend="local")) == 0
    finally:
        local.down(print)
