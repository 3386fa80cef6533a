"""config-manager's choice of a node's config (cmd/config-manager updateConfigName)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.deviceplugin.configmanager import (
    ConfigManagerError,
    available_configs,
    select_config,
    update_symlink,
)


def test_the_label_wins_then_the_default_then_the_fallbacks() -> None:
    configs = {"default", "mig-mixed", "time-slicing-4"}
    assert select_config("mig-mixed", configs) == "mig-mixed"
    assert select_config("", configs, default="time-slicing-4") == "time-slicing-4"
    assert select_config("", configs, fallbacks=["named"]) == "default"
    assert select_config("", {"only"}, fallbacks=["named", "single"]) == "only"
    assert select_config("", configs, fallbacks=["single", "empty"]) == ""


@pytest.mark.parametrize(
    ("label", "configs", "kwargs", "message"),
    [
        ("nope", {"default"}, {}, "specified config nope does not exist"),
        ("", set(), {}, "no configuration files available"),
        ("", {"a", "b"}, {"fallbacks": ["single"]}, "all fallbacks failed"),
        ("", {"a"}, {"fallbacks": ["bogus"]}, "unknown fallback strategy: bogus"),
    ],
)
def test_no_config_is_an_error(label, configs, kwargs, message) -> None:
    with pytest.raises(ConfigManagerError, match=message):
        select_config(label, configs, **kwargs)


def test_symlink_points_at_the_selected_file_and_updates_once(tmp_path: Path) -> None:
    src = tmp_path / "available"
    src.mkdir()
    (src / "default").write_text("version: v1\n")
    (src / "mig-mixed").write_text("version: v1\nflags: {migStrategy: mixed}\n")
    (src / "..data").mkdir()  # a mounted ConfigMap's bookkeeping
    assert available_configs(src) == {"default", "mig-mixed"}
    dst = tmp_path / "config" / "config.yaml"
    assert update_symlink("mig-mixed", src, dst) is True
    assert "mixed" in dst.read_text()
    assert update_symlink("mig-mixed", src, dst) is False
    assert update_symlink("", src, dst) is True and dst.read_text() == ""  # /dev/null
