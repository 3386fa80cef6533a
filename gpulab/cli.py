"""`gpulab`: one entry point for the components, the harness and the demos.

Each subsystem contributes its subcommands through a module-level
``add_commands(subparsers)``. The modules are named in ``pyproject.toml`` under
``[project.entry-points."gpulab.commands"]``, one entry per subcommand, not imported
here, so the components (``gpulab``) never depend on the layers above them (``harness``,
``demos``). Only the module of the command being run is imported (every pod's process
starts with `gpulab <command>`: `gpulab fake-gpu render` must not load gRPC or the
Kubernetes client); `gpulab --help` loads them all.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import entry_points

from gpulab.errors import UserError

COMMAND_GROUP = "gpulab.commands"


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with only the module of the command named in ``argv`` loaded (all of
    them when no known command is named)."""
    parser = argparse.ArgumentParser(
        prog="gpulab", description="GPU Scheduling Lab: a local mini-cluster for GPU scheduling"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    found = list(entry_points(group=COMMAND_GROUP))
    if not found:
        raise SystemExit(
            "gpulab: error: no commands are registered; install the project (make setup)"
        )
    named = [ep for ep in found if ep.name in (argv or [])[:2]]
    modules = sorted({ep.value for ep in named or found})
    for module in modules:
        next(ep for ep in found if ep.value == module).load().add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["kubectl"]:  # the rest is kubectl's, flags too (but a leading --spec)
        head = argv[:3] if argv[1:2] == ["--spec"] else argv[:1]
        argv = [*head, "--", *argv[len(head) :]]
    parser = build_parser(argv)
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
