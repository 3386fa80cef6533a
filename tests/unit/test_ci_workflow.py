"""The kind workflow for users with Docker (.github/workflows/e2e-kind.yml), read as data
(it cannot run here): it installs kind with the release's checksum, builds the image and
runs `make test-e2e` on kind once per chapter, with the README's commands."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.docker import KIND_VERSION

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "e2e-kind.yml"


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


def test_kind_is_installed_at_the_targeted_version_and_checked() -> None:
    job = _workflow()["jobs"]["e2e-kind"]
    assert job["env"]["KIND_VERSION"] == KIND_VERSION
    runs = _runs(job)
    fetch = [r for r in runs if "kind-linux-amd64" in r and r.startswith("curl -fsSLo kind ")]
    assert len(fetch) == 1
    assert any("sha256sum -c" in r for r in runs)
    install = runs.index("sudo install -m 0755 kind /usr/local/bin/kind")
    assert runs.index(next(r for r in runs if "sha256sum -c" in r)) < install


def test_each_chapter_with_kind_e2e_tests_has_a_job_running_make_test_e2e_on_kind() -> None:
    job = _workflow()["jobs"]["e2e-kind"]
    chapters = {m["chapter"]: m["tests"] for m in job["strategy"]["matrix"]["include"]}
    assert set(chapters) == {"cluster", "device-plugin", "kueue"}  # HAMi: local only
    for tests in chapters.values():
        assert (ROOT / tests).is_file()
    step = next(s for s in job["steps"] if "make test-e2e" in s.get("run", ""))
    assert step["env"]["PYTEST_ADDOPTS"] == "${{ matrix.tests }}"
    assert job["env"]["GPULAB_BACKEND"] == "kind"


def test_the_image_is_built_before_the_tests_and_the_commands_are_the_readmes() -> None:
    runs = _runs(_workflow()["jobs"]["e2e-kind"])
    lab = ["make setup", "docker build -t gpulab:dev .", "GPULAB_BACKEND=kind make test-e2e"]
    assert [runs.index(c) for c in lab] == sorted(runs.index(c) for c in lab)
    assert set(lab) <= _readme_commands()
