"""`make demo-coscheduling` and `make demo-numa` from a stopped cluster, each on a copy of
the scheduling chapter's cluster under its own name and ports
(harness/clusters/scheduling-demo-e2e.yaml: the demos' own shape, and a trainer's
workshop cluster is left alone; the scheduling-e2e cluster is the four scheduling
modules' shared one), with the source
chapter's steps in the order the demo must show them (tests/e2e/golden/coscheduling.yaml,
numa.yaml)."""

from __future__ import annotations

import pytest
from conftest import run_demo_from_stopped
from golden import assert_shape

SPEC = "scheduling-demo-e2e"


@pytest.mark.local_backend
def test_the_coscheduling_demo_shows_the_chapter_in_order() -> None:
    from demos import coscheduling as demo

    assert_shape("coscheduling", run_demo_from_stopped(SPEC, demo.run))


@pytest.mark.local_backend
def test_the_numa_demo_shows_the_chapter_in_order() -> None:
    from demos import numa as demo

    assert_shape("numa", run_demo_from_stopped(SPEC, demo.run))
