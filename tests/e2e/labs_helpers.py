"""What the labs' e2e tests share (tests/e2e/test_labs.py, test_lab_mig.py): `gpulab
diagnose` as the CLI runs it (reader + chain against the live cluster), `gpulab lab check`
through its command (its exit code is what is asserted), and one lab's whole run: start,
each case's link, not fixed, the documented fix, fixed, no broken link after."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from conftest import Cluster
from kubernetes import client

from gpulab.diagnose.chain import diagnose
from gpulab.diagnose.commands import parse_target
from gpulab.diagnose.reader import read
from gpulab.wait import wait_for
from harness.labs import load


def progress(message: str) -> None:
    print(message)


def first_broken(api: client.ApiClient, kind: str, ref: str) -> tuple[str | None, str]:
    report = diagnose(read(api, parse_target(kind, ref)))
    first = report.broken
    return (first.name if first else None), report.answer()


def lab_check(name: str) -> int:
    from harness.labs.commands import cmd_lab

    args = argparse.Namespace(action="check", name=name, all=False, backend=None, kubeconfig=None)
    return cmd_lab(args)


def run_lab(labs: Cluster, name: str, fix: Callable[[client.ApiClient], None]) -> None:
    lab = load(name)
    backend = labs.backend
    lab.start(backend, progress)
    try:
        api = labs.api
        cases = lab.cases(api)
        assert cases
        for case in cases:
            link, answer = first_broken(api, *case.target)
            assert link == case.link, f"{case.name}: {answer}"
        assert lab_check(name) == 1  # broken: not fixed yet
        fix(api)
        wait_for(lambda: all(s.fixed for s in lab.check(api)), 120, f"lab {name} fixed", 1)
        assert lab_check(name) == 0
        for case in lab.cases(api):  # the same objects (or their replacements) now healthy
            link, answer = first_broken(api, *case.target)
            if case.target[0] != "podgroup" or link is None:
                assert link is None, f"{case.name} after the fix: {answer}"
    finally:
        lab.stop(backend, progress)
