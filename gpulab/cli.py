"""`gpulab`: one entry point for the components, the harness and the demos.

Each subsystem contributes its subcommands through a module-level
``add_commands(subparsers)``. The modules are named in ``pyproject.toml`` under
``[project.entry-points."gpulab.commands"]``, not imported here, so the components
(``gpulab``) never depend on the layers above them (``harness``, ``demos``), and each
module is imported only to build the parser (`gpulab down` does not load gRPC).
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import entry_points

from gpulab.errors import UserError

COMMAND_GROUP = "gpulab.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpulab", description="GPU Scheduling Lab: a local mini-cluster for GPU scheduling"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    found = sorted(entry_points(group=COMMAND_GROUP), key=lambda ep: ep.name)
    if not found:
        raise SystemExit(
            "gpulab: error: no commands are registered; install the project (make setup)"
        )
    for ep in found:
        ep.load().add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # one line per HTTP request drowns the narration; keep them for --verbose
    logging.getLogger("httpx").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except UserError as exc:  # one line for errors the user can act on
        if args.verbose:
            raise
        print(f"gpulab: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
