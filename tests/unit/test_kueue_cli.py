"""`gpulab kueue-controller` argument handling."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpulab.cli import build_parser
from gpulab.errors import UserError
from gpulab.kueue import commands


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands.add_commands(parser.add_subparsers())
    return parser.parse_args(["kueue-controller", *argv])


def test_registered_in_the_cli() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert "kueue-controller" in sub.choices


def test_flags() -> None:
    args = parse(
        "--kubeconfig",
        "k",
        "--webhook-bind",
        "127.0.0.1:9443",
        "--cert-file",
        "c",
        "--key-file",
        "k2",
        "--metrics-bind",
        "127.0.0.1:8443",
        "--config",
        "cfg.yaml",
        "--feature-gates",
        "UnadmittedWorkloadsObservability=true",
    )
    assert (args.kubeconfig, args.webhook_bind) == ("k", "127.0.0.1:9443")
    assert (args.cert_file, args.key_file) == (Path("c"), Path("k2"))
    assert (args.metrics_bind, args.config) == ("127.0.0.1:8443", Path("cfg.yaml"))
    assert args.feature_gates == "UnadmittedWorkloadsObservability=true"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--webhook-bind", "127.0.0.1:9443"], "--webhook-bind needs --cert-file"),
        (["--webhook-bind", "9443"], "must be HOST:PORT"),
        (["--cert-file", "c"], "only used with --webhook-bind"),
        (
            ["--webhook-bind", "127.0.0.1:1", "--cert-file", "/nope", "--key-file", "/nope"],
            "--cert-file /nope: no such file",
        ),
        (["--feature-gates", "Foo"], "expected Name=true or Name=false"),
        (["--feature-gates", "Foo=true"], "feature gate Foo is not implemented by the lab"),
        (["--config", "/nope.yaml"], "--config /nope.yaml: No such file"),
        (["--metrics-bind", "x:notaport"], "--metrics-bind must be HOST:PORT"),
    ],
)
def test_user_errors_are_one_line(argv: list[str], message: str) -> None:
    args = parse(*argv)
    with pytest.raises(UserError, match=message):
        args.func(args)
