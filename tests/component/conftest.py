"""Fixtures shared by the component tests that run a device plugin against the shim."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """The fake-gpu state root of the simulated node(s) under test."""
    return tmp_path / "fake-gpu"


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A device-plugins directory; unix socket paths are limited to ~107 bytes, so it
    lives directly under $TMPDIR rather than in pytest's long tmp_path."""
    d = Path(os.environ.get("TMPDIR", "/tmp")) / f"dp-{os.getpid()}-{time.monotonic_ns()}"
    d.mkdir()
    yield d
    for f in d.iterdir():
        f.unlink()
    d.rmdir()
