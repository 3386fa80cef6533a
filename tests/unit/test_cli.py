"""gpulab/cli.py: every subcommand is registered under its own name, so running it loads
only its module."""

from __future__ import annotations

import argparse
from importlib.metadata import entry_points

from gpulab.cli import COMMAND_GROUP, build_parser


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_every_subcommand_has_its_own_entry_point() -> None:
    named = {ep.name for ep in entry_points(group=COMMAND_GROUP)}
    assert _commands(build_parser([])) == named


def test_a_command_loads_only_its_module() -> None:
    assert _commands(build_parser(["fake-gpu", "smi"])) == {"fake-gpu"}
    assert {"up", "down", "kubectl"} <= _commands(build_parser(["up"]))
