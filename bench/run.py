"""`make bench`: run the benchmarks and write bench/reports/<name>.json and REPORT.md."""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import (
    cluster_start,
    dashboard,
    hami_extender,
    kind_start,
    kueue_admission,
    volcano_scheduling,
)

REPORTS = Path(__file__).resolve().parent / "reports"


# name -> (run, its REPORT.md section), in report order
BENCHMARKS: dict[
    str, tuple[Callable[..., dict[str, Any]], Callable[[dict[str, Any]], list[str]]]
] = {
    "cluster_start": (cluster_start.run, cluster_start.section),
    "kind_start": (kind_start.run, kind_start.section),
    "kueue_admission": (kueue_admission.run, kueue_admission.section),
    "hami_extender": (hami_extender.run, hami_extender.section),
    "dashboard": (dashboard.run, dashboard.section),
    "volcano_scheduling": (volcano_scheduling.run, volcano_scheduling.section),
}


# option -> (benchmark, keyword argument its run takes)
OPTIONS = {
    # the lab experiments' whole-chain runs (minutes each); without it their last figures
    # stay in the report, dated
    "--hami-experiments": ("hami_extender", "experiments"),
}
REPORT_ONLY = "--report-only"  # run nothing: write REPORT.md again from the saved results


def main(args: list[str]) -> int:
    """Run the named benchmarks (all without names); REPORT.md keeps the others' last
    results from their bench/reports/<name>.json."""
    names = [a for a in args if not a.startswith("-")]
    options = [a for a in args if a.startswith("-") and a != REPORT_ONLY]
    unknown = set(names) - set(BENCHMARKS)
    if unknown:
        sys.exit(f"unknown benchmarks {sorted(unknown)}; known: {', '.join(BENCHMARKS)}")
    bad = set(options) - set(OPTIONS)
    if bad:
        sys.exit(f"unknown options {sorted(bad)}; known: {', '.join(OPTIONS)}")
    kwargs: dict[str, dict[str, Any]] = {}
    for option in options:
        bench, keyword = OPTIONS[option]
        kwargs.setdefault(bench, {})[keyword] = True
    REPORTS.mkdir(exist_ok=True)
    results = {
        name: run(**kwargs.get(name, {}))
        for name, (run, _section) in BENCHMARKS.items()
        if name in (names or BENCHMARKS) and REPORT_ONLY not in args
    }
    meta = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {platform.processor() or '?'}",
        "python": sys.version.split()[0],
    }
    for name, data in results.items():
        (REPORTS / f"{name}.json").write_text(json.dumps({**meta, **data}, indent=1))
    if REPORT_ONLY in args:  # the header keeps the date of the newest saved run
        whens = [json.loads(p.read_text()).get("when", "") for p in REPORTS.glob("*.json")]
        meta["when"] = max(whens, default=meta["when"])
    lines = [
        "# Benchmarks",
        "",
        f"Run {meta['when']} on {meta['machine']} (2 cores). Numbers from one run; the",
        "machine is shared, so read them as orders of magnitude and ratios, not limits.",
    ]
    for name, (_run, section) in BENCHMARKS.items():
        saved = REPORTS / f"{name}.json"
        if saved.exists():
            lines += ["", *section(json.loads(saved.read_text()))]
    (REPORTS / "REPORT.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
