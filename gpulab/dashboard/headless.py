"""Debian's Chromium, headless, driven by Playwright: how the dashboard's browser tests and
benchmark open the page. Playwright never downloads a browser here (`make chromium`
installs Debian's package)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpulab.errors import UserError

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialling out on a closed network.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class NoChromium(UserError):
    pass


@contextlib.contextmanager
def browser(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A Playwright BrowserContext of a fresh Chromium profile (--user-data-dir)."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        raise NoChromium(f"{CHROMIUM} is missing: run `make chromium` (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=list(FLAGS),
            viewport={"width": width, "height": height},
        )
        try:
            yield ctx
        finally:
            ctx.close()
