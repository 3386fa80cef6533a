"""The top-level Makefile, read as text: `make demo-*` starts with the demo, not make's
own chatter."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_setup_says_nothing_about_the_nvml_shim_unless_it_builds_it() -> None:
    """No "make[1]: Nothing to be done for 'all'." atop every demo: the sub-make is
    silent (-s), and the shim's own rule says when it does build."""
    makefile = (ROOT / "Makefile").read_text()
    assert "\t@$(MAKE) --no-print-directory -s -C fake-gpu\n" in makefile
    shim = (ROOT / "fake-gpu" / "Makefile").read_text()
    recipe = shim.split("$(LIB): $(SRC) $(HDR) Makefile\n", 1)[1]
    assert recipe.startswith("\t@echo ")
