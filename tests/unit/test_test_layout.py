"""The suite's own layout: pytest imports test modules by basename (rootdir-relative
packages are not used), so two test files of one name in tests/unit, tests/component and
tests/e2e stop the whole collection of `make test`."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_basename_of_its_own() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name.startswith("test_") or path.name.endswith("_helpers.py"):
            where[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
