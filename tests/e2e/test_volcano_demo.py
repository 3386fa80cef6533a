"""`make demo-volcano` from a stopped cluster, on a copy of the Volcano chapter's cluster
under its own name and ports (harness/clusters/volcano-demo-e2e.yaml: two 8-GPU nodes,
the demo's 1:3 shares, and a trainer's workshop cluster is left alone; volcano-e2e has
four), with the source chapter's steps in the order the demo must show them
(tests/e2e/golden/volcano.yaml)."""

from __future__ import annotations

import pytest
from conftest import run_demo_from_stopped
from golden import assert_shape


@pytest.mark.local_backend
def test_the_volcano_demo_shows_the_chapter_in_order() -> None:
    from demos import volcano as demo

    assert_shape("volcano", run_demo_from_stopped("volcano-demo-e2e", demo.run))
