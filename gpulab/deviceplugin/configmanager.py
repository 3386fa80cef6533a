"""Per-node configs: pick the device plugin's config file for this node from a node label.

Mirrors NVIDIA k8s-device-plugin v0.20.0 ``cmd/config-manager/main.go``: the named configs
of a ConfigMap are mounted as files in ``--config-file-srcdir``; the node label
``nvidia.com/device-plugin.config=<name>`` selects one (``updateConfigName``: the label,
else ``--default-config``, else the ``--fallback-strategies`` named | single | empty), and
``--config-file-dst`` becomes a symlink to it (``/dev/null`` for the empty config), which
the plugin reads with ``--config-file``. One DaemonSet thus serves every node.

Deliberate difference: the lab runs it as the init step (``--oneshot``) only. Upstream's
sidecar mode, which keeps watching the label and sends ``SIGHUP`` to the plugin process,
is not implemented: after relabelling a node, restart its plugin (the plugin itself does
restart on ``SIGHUP``, as upstream).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gpulab.errors import UserError

NODE_LABEL = "nvidia.com/device-plugin.config"
FALLBACK_NAMED = "named"
FALLBACK_SINGLE = "single"
FALLBACK_EMPTY = "empty"
NAMED_FALLBACK_CONFIG = "default"
EMPTY_CONFIG = Path("/dev/null")


class ConfigManagerError(UserError, RuntimeError):
    """No config can be selected for the node; the message says which and why."""


def available_configs(srcdir: Path) -> set[str]:
    """``getConfigFileNameMap``: the files of the mounted ConfigMap (not its ``..`` entries)."""
    try:
        entries = list(srcdir.iterdir())
    except OSError as exc:
        raise ConfigManagerError(
            f"error getting list of configuration files: {srcdir}: {exc.strerror}"
        ) from exc
    return {e.name for e in entries if not e.is_dir() and not e.name.startswith("..")}


def select_config(
    label: str, available: set[str], default: str = "", fallbacks: Sequence[str] = ()
) -> str:
    """``updateConfigName``: the config to use; "" is the empty config. Pure."""
    if not available:
        raise ConfigManagerError("no configuration files available")
    if label:
        if label not in available:
            known = ", ".join(sorted(available))
            raise ConfigManagerError(f"specified config {label} does not exist; available: {known}")
        return label
    if default:
        if default not in available:
            raise ConfigManagerError(f"specified config {default} does not exist")
        return default
    for fallback in fallbacks:
        if fallback == FALLBACK_NAMED and NAMED_FALLBACK_CONFIG in available:
            return NAMED_FALLBACK_CONFIG
        if fallback == FALLBACK_SINGLE and len(available) == 1:
            return next(iter(available))
        if fallback == FALLBACK_EMPTY:
            return ""
        if fallback not in (FALLBACK_NAMED, FALLBACK_SINGLE, FALLBACK_EMPTY):
            raise ConfigManagerError(f"unknown fallback strategy: {fallback}")
    raise ConfigManagerError("no config was set, no default was provided, and all fallbacks failed")


def update_symlink(name: str, srcdir: Path, dst: Path) -> bool:
    """``updateSymlink``: point ``dst`` at the selected config; False if it already does."""
    src = srcdir / name if name else EMPTY_CONFIG
    if dst.is_file() or dst.is_symlink():
        if dst.resolve() == src.resolve():
            return False
        dst.unlink()
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(src, dst)
    return True
