"""The kind workflow for a hosted runner with Docker (.github/workflows/e2e-kind.yml), read
as data: it builds or pulls the kind images with the project's own `make images` (kind
itself is built from its module, no download) and runs the kind lane, with the README's
commands."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "e2e-kind.yml"
LANE = ("tests/e2e/test_kind.py", "tests/e2e/test_kind_gpu_operator.py")


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _runs(job: dict) -> list[str]:
    return [line.strip() for s in job["steps"] if "run" in s for line in s["run"].splitlines()]


def _readme_commands() -> set[str]:
    """The lines of the README's shell code blocks (comments dropped)."""
    commands, lang = set(), None
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            lang = line[3:].strip() if lang is None else None
        elif lang == "sh":
            commands.add(line.split("#")[0].strip())
    return commands - {""}


def test_the_workflow_runs_on_pushes_pull_requests_and_by_hand() -> None:
    triggers = _workflow()[True]  # YAML 1.1 reads the key `on` as true
    assert {"workflow_dispatch", "pull_request", "push"} <= set(triggers)


def test_the_lane_is_the_kind_modules_after_the_images_with_the_readmes_commands() -> None:
    runs = _runs(_workflow()["jobs"]["kind-lane"])
    lane = f".venv/bin/pytest -ra {' '.join(LANE)}"
    steps = ["make setup", "make images", lane]
    assert [runs.index(c) for c in steps] == sorted(runs.index(c) for c in steps)
    assert set(steps) <= _readme_commands()
    for module in LANE:
        assert (ROOT / module).is_file()
    assert not any(r.startswith("curl ") for r in runs)  # kind is built from its module
