"""`gpulab`: one entry point for the harness, every component and the demos.

Each subsystem contributes its subcommands through a module-level
``add_commands(subparsers)``; the modules are listed in COMMAND_MODULES and imported
lazily so `gpulab down` does not import gRPC.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

COMMAND_MODULES = [
    "harness.commands",
    "gpulab.trace_cli",
    "demos.commands",
    "gpulab.fakegpu.commands",
    "gpulab.hami.commands",
    "gpulab.kueue.commands",
    "gpulab.deviceplugin.commands",
    "gpulab.nodeagent.commands",
]


class CLIError(Exception):
    """An error the user can fix: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpulab", description="GPU Scheduling Lab: a local mini-cluster for GPU scheduling"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
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
    except Exception as exc:  # one line for errors the user can act on
        if _is_user_error(exc) and not args.verbose:
            print(f"gpulab: error: {exc}", file=sys.stderr)
            return 2
        raise


def _is_user_error(exc: Exception) -> bool:
    from gpulab.fakegpu.profiles import ProfileError
    from gpulab.kube import KubeconfigError
    from harness.errors import HarnessError

    return isinstance(exc, CLIError | HarnessError | ProfileError | KubeconfigError)


if __name__ == "__main__":
    sys.exit(main())
