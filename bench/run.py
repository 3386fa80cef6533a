"""`make bench`: run the benchmarks and write bench/reports/<name>.json and REPORT.md."""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

from bench import cluster_start

REPORTS = Path(__file__).resolve().parent / "reports"


def main() -> int:
    REPORTS.mkdir(exist_ok=True)
    results = {"cluster_start": cluster_start.run()}
    meta = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {platform.processor() or '?'}",
        "python": sys.version.split()[0],
    }
    for name, data in results.items():
        (REPORTS / f"{name}.json").write_text(json.dumps({**meta, **data}, indent=1))
    cs = results["cluster_start"]
    lines = [
        "# Benchmarks",
        "",
        f"Run {meta['when']} on {meta['machine']} (2 cores). Numbers from one run; the",
        "machine is shared, so read them as orders of magnitude and ratios, not limits.",
        "",
        "## Cluster start (local backend, binaries cached)",
        "",
        f"{cs['nodes']} simulated GPU nodes, {cs['rounds']} rounds.",
        "",
        "| measure | median | all rounds |",
        "|---|---|---|",
        f"| `up` → all nodes Ready | {cs['up_median_s']:.1f} s | "
        + ", ".join(f"{x:.1f}" for x in cs["up_s"])
        + " |",
        f"| of which kube-apiserver /readyz | {cs['apiserver_ready_median_s']:.1f} s | |",
        f"| `down` → processes gone, ports free | {cs['down_median_s']:.1f} s | "
        + ", ".join(f"{x:.1f}" for x in cs["down_s"])
        + " |",
        "",
        f"Target: ready in under {cs['target_up_s']:.0f} s → "
        + ("met." if cs["up_median_s"] < cs["target_up_s"] else "**not met**."),
    ]
    (REPORTS / "REPORT.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
