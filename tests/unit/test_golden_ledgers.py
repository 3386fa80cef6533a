"""The golden ledgers (tests/e2e/golden/*.yaml) are well formed, and how many of the source
chapters' call-chain steps the demos show live (issue 34); tests/e2e/golden.py's checker."""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "e2e" / "golden.py"
_SPEC = importlib.util.spec_from_file_location("golden", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
golden = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("golden", golden)
_SPEC.loader.exec_module(golden)

SEEDS = ("000", "003")  # /work/shared/seeds/000_*.txt (chapter 6), 003_*.txt (HAMi)


def test_every_step_is_live_or_docs_only_with_a_regex_that_compiles() -> None:
    for ledger in golden.ledgers():
        assert ledger.chapter in golden.CHAPTERS, ledger.demo
        assert ledger.steps, ledger.demo
        for step in ledger.steps:
            where = f"{ledger.demo}: {step.step!r}"
            assert (step.live is None) != (step.docs_only is None), f"{where}: live xor docs_only"
            if step.live is not None:
                re.compile(step.live)
            else:
                assert step.seed, f"{where}: a docs-only step is a chapter step (seed ref)"
            if step.seed is not None:
                assert re.fullmatch(r"(000|003) §\S.*", step.seed), f"{where}: seed {step.seed!r}"


def test_no_two_steps_in_a_row_share_a_regex() -> None:
    """A line may show two steps (the checker lets the next step match the same line), but
    two steps with one regex would count one fact twice."""
    for ledger in golden.ledgers():
        lives = [s.live for s in ledger.steps if s.live is not None]
        for a, b in itertools.pairwise(lives):
            assert a != b, f"{ledger.demo}: /{a}/ twice in a row"


def test_ledgers_are_named_after_their_demo() -> None:
    for path in golden.GOLDEN.glob("*.yaml"):
        assert golden.load(path).demo == path.stem


def chapter_table() -> dict[str, tuple[int, int]]:
    """Per chapter: (live, total) over its distinct steps; a step live in any demo is live."""
    live: dict[str, dict[str, bool]] = defaultdict(dict)
    for ledger in golden.ledgers():
        for step in ledger.steps:
            if step.seed is None:
                continue
            seen = live[ledger.chapter].get(step.step, False)
            live[ledger.chapter][step.step] = seen or step.live is not None
    return {ch: (sum(steps.values()), len(steps)) for ch, steps in live.items()}


# issue 34's count of each chapter's call-chain steps (see the ledgers' seed refs)
CHAPTER_STEPS = {
    "device-plugin": 12,
    "gpu-operator": 9,
    "coscheduling": 10,
    "nrt": 6,
    "volcano": 12,
    "kueue": 8,
    "hami": 18,
}


def test_each_chapter_has_the_steps_it_claims() -> None:
    table = chapter_table()
    print(f"\n{'chapter':<15}{'live':>6}{'total':>7}")
    for ch, (n_live, total) in sorted(table.items()):
        print(f"{ch:<15}{n_live:>6}{total:>7}")
    n_live, total = (sum(col) for col in zip(*table.values(), strict=True)) if table else (0, 0)
    print(f"{'all':<15}{n_live:>6}{total:>7}")
    for ch, (_, total) in table.items():
        assert total == CHAPTER_STEPS[ch], f"{ch}: {total} steps in the ledgers"


OUTPUT = """\
\x1b[1m── Device plugin ──\x1b[0m
  12:00:01 kubelet Register nvidia.com/gpu
  12:00:02 nvidia-device-plugin ListAndWatch 8 devices
\x1b[32m✔\x1b[0m plugin registered
"""


def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "d.yaml").write_text(
        "demo: d\nchapter: device-plugin\nsteps:\n"
        "  - {step: Register, seed: '000 §6.2', live: 'Register .*nvidia\\.com/gpu'}\n"
        "  - {step: Options, seed: '000 §6.2', docs_only: not logged}\n"
        "  - {step: ListAndWatch, seed: '000 §6.2', live: 'ListAndWatch \\d+ devices'}\n"
        "  - {step: '✔ registered', live: '^✔ .*registered'}\n"
    )
    monkeypatch.setattr(golden, "GOLDEN", tmp_path)


def test_the_checker_passes_the_steps_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ledger(tmp_path, monkeypatch)
    golden.assert_shape("d", OUTPUT)  # the ANSI codes stripped: the tick's ^✔ matches


def test_two_steps_may_share_a_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _ledger(tmp_path, monkeypatch)
    one_line = OUTPUT.replace("nvidia.com/gpu\n  12:00:02 nvidia-device-plugin", "nvidia.com/gpu;")
    assert len(one_line.splitlines()) == 3
    golden.assert_shape("d", one_line)


def test_the_checker_names_a_step_out_of_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ledger(tmp_path, monkeypatch)
    lines = OUTPUT.splitlines()
    swapped = "\n".join([lines[0], lines[2], lines[1], lines[3]])
    with pytest.raises(AssertionError, match=r"'ListAndWatch' .* out of order: it is on line 2"):
        golden.assert_shape("d", swapped)


def test_the_checker_names_a_missing_step_with_the_lines_around(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ledger(tmp_path, monkeypatch)
    with pytest.raises(AssertionError, match=r"'✔ registered' .* missing") as failed:
        golden.assert_shape("d", OUTPUT.replace("plugin registered", "plugin failed"))
    assert "| ✔ plugin failed" in str(failed.value)


def test_a_line_marked_late_shows_its_step_but_does_not_move_the_order_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "toy.yaml").write_text(
        "demo: toy\nchapter: device-plugin\nsteps:\n"
        "  - {step: scheduled, seed: '000 §1', live: 'Scheduled'}\n"
        "  - {step: allocated, seed: '000 §2', live: 'Allocate'}\n"
        "  - {step: running, seed: '000 §3', live: 'Running'}\n"
    )
    monkeypatch.setattr(golden, "GOLDEN", tmp_path)
    golden.assert_shape("toy", "Scheduled\nRunning\nAllocate x (late)\n")
    with pytest.raises(AssertionError, match=r"'running'.*out of order"):
        golden.assert_shape("toy", "Scheduled\nRunning\nAllocate x\n")
