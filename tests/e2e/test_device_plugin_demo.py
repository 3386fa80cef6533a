"""`make demo-device-plugin` from a stopped cluster, on a cluster of the demo's shape
(harness/clusters/device-plugin-e2e.yaml), and the steps of seed 000 §6.2 it shows, in
order (tests/e2e/golden/device-plugin.yaml). A module of its own, not one of the modules
on the session `e2e` cluster: that cluster would sit idle while this one runs."""

from __future__ import annotations

import pytest
from conftest import run_demo_from_stopped
from golden import assert_shape


@pytest.mark.local_backend
def test_the_demo_passes_from_a_stopped_cluster() -> None:
    """`gpulab down; make demo-device-plugin`, on a cluster of the demo's shape."""
    from demos import device_plugin as demo

    assert_shape("device-plugin", run_demo_from_stopped("device-plugin-e2e", demo.run))
