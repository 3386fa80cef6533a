"""Golden shapes: the call-chain steps each demo must show, in the order it must show them.

One ledger per demo, tests/e2e/golden/<demo>.yaml: the source chapter's steps (seed ref into
/work/shared/seeds), each either ``live`` (a regex one output line matches) or
``docs_only`` (why it cannot be shown). A demo's e2e test passes its output from a cold run
to ``assert_shape``; tests/unit/test_golden_ledgers.py checks the ledgers themselves and
counts the live steps per chapter (issue 34).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

GOLDEN = Path(__file__).resolve().parent / "golden"
# the chapters of the seeds the ledgers draw their steps from
CHAPTERS = ("device-plugin", "gpu-operator", "coscheduling", "nrt", "volcano", "kueue", "hami")
# rich's colours and styles, and any other CSI sequence a terminal run leaves in the text
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
CONTEXT = 5  # lines either side of where a missing step was expected
LATE = "(late)"  # the narrator's mark on a line it could not hold long enough (narrate.py)


@dataclass(frozen=True)
class Step:
    step: str
    seed: str | None  # None: an on-screen mark (a tick, a banner), not a chapter step
    live: str | None
    docs_only: str | None


@dataclass(frozen=True)
class Ledger:
    demo: str
    chapter: str
    steps: tuple[Step, ...]


def load(path: Path) -> Ledger:
    raw: dict[str, Any] = yaml.safe_load(path.read_text())
    steps = tuple(
        Step(s["step"], s.get("seed"), s.get("live"), s.get("docs_only")) for s in raw["steps"]
    )
    return Ledger(raw["demo"], raw["chapter"], steps)


def ledgers() -> list[Ledger]:
    return [load(path) for path in sorted(GOLDEN.glob("*.yaml"))]


def assert_shape(demo: str, output: str) -> None:
    """Each live step of ``demo``'s ledger matches a line of ``output`` at or after the
    line the step before it matched (one line may show two steps of one call: Allocate's
    envs and its device nodes); the first step missing or out of order fails, with the
    output around where it was expected. A line the narrator marked ``(late)`` arrived
    after the window it could be held for (a loaded machine) and says so on screen: it
    shows its step, but does not move the place the next step is looked for from."""
    lines = [ANSI.sub("", line) for line in output.splitlines()]
    at = -1  # the line the previous live step matched
    previous = "the start of the output"
    for step in load(GOLDEN / f"{demo}.yaml").steps:
        if step.live is None:
            continue
        pattern = re.compile(step.live)
        found = next((i for i in range(max(at, 0), len(lines)) if pattern.search(lines[i])), None)
        if found is None:
            earlier = next((i for i in range(max(at, 0)) if pattern.search(lines[i])), None)
            why = (
                f"out of order: it is on line {earlier + 1}, before {previous} (line {at + 1})"
                if earlier is not None
                else f"missing after {previous} (line {at + 1})"
            )
            around = lines[max(0, at - CONTEXT + 1) : at + CONTEXT + 1]
            shown = "\n".join(f"  | {line}" for line in around)
            raise AssertionError(f"{demo}: step {step.step!r} /{step.live}/ {why}:\n{shown}")
        if not lines[found].rstrip().endswith(LATE):
            at, previous = found, repr(step.step)
