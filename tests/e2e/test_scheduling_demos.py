"""`make demo-coscheduling` and `make demo-numa` from a stopped cluster, each on the
scheduling chapter's cluster (harness/clusters/scheduling.yaml: the demos' own shape; the
scheduling-e2e cluster is the four scheduling modules' shared one), with the source
chapter's steps in the order the demo must show them (tests/e2e/golden/coscheduling.yaml,
numa.yaml)."""

from __future__ import annotations

import pytest
from conftest import run_demo_from_stopped
from golden import assert_shape

SPEC = "scheduling"


@pytest.mark.local_backend
def test_the_coscheduling_demo_shows_the_chapter_in_order() -> None:
    from demos import coscheduling as demo

    assert_shape("coscheduling", run_demo_from_stopped(SPEC, demo.run))


@pytest.mark.local_backend
def test_the_numa_demo_shows_the_chapter_in_order() -> None:
    from demos import numa as demo

    assert_shape("numa", run_demo_from_stopped(SPEC, demo.run))
