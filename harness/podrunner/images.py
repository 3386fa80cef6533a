"""The images the pod runner knows (``harness/pod-images.yaml``) and how to start them."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness import binaries
from harness.errors import HarnessError

TABLE = Path(__file__).resolve().parents[1] / "pod-images.yaml"
REPO = Path(__file__).resolve().parents[2]
LAB_IMAGE = "gpulab:dev"
# after the image's own directories, a host process finds the host's tools (sh, sleep ...)
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
ADAPTERS = ("kube-scheduler",)


@dataclass(frozen=True)
class Image:
    name: str
    entrypoint: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    path: tuple[str, ...] = ()
    links: dict[str, str] = field(default_factory=dict)
    adapter: str | None = None
    preload: tuple[str, ...] = ()  # modules a fork server imports once (forkserver.py)

    @property
    def search_path(self) -> tuple[str, ...]:
        return (*self.path, *SYSTEM_PATH)

    def which(self, command: str) -> str | None:
        """Resolve a command as the image's PATH would."""
        if "/" in command:
            return command if os.access(command, os.X_OK) else None
        for directory in self.search_path:
            candidate = Path(directory) / command
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
        return None


def _fill(text: str, cluster_dir: Path) -> str:
    venv = Path(sys.executable).parent.parent
    text = text.replace("{repo}", str(REPO)).replace("{venv}", str(venv))
    text = text.replace("{cluster}", str(cluster_dir))
    if "{bin:" in text:
        start = text.index("{bin:")
        end = text.index("}", start)
        component = text[start + 5 : end]
        comp = next((c for c in binaries.COMPONENTS if c.name == component), None)
        if comp is None:
            raise HarnessError(f"{TABLE}: unknown binary component {component!r}")
        text = text[:start] + str(comp.bin_dir) + text[end + 1 :]
    return text


def load(cluster_dir: Path, table: Path = TABLE) -> dict[str, Image]:
    """The image table with placeholders filled in; creates the images' link dirs."""
    try:
        raw: dict[str, Any] = yaml.safe_load(table.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise HarnessError(f"cannot read the pod image table {table}: {exc}") from exc
    images: dict[str, Image] = {}
    for name, spec in raw.items():
        adapter = spec.get("adapter")
        if adapter is not None and adapter not in ADAPTERS:
            raise HarnessError(f"{table}: {name}: unknown adapter {adapter!r}")
        image = Image(
            name=name,
            entrypoint=tuple(spec.get("entrypoint") or ()),
            env={k: _fill(str(v), cluster_dir) for k, v in (spec.get("env") or {}).items()},
            path=tuple(_fill(p, cluster_dir) for p in spec.get("path") or ()),
            links={k: _fill(v, cluster_dir) for k, v in (spec.get("links") or {}).items()},
            adapter=adapter,
            preload=tuple(spec.get("preload") or ()),
        )
        if image.links:
            link_dir = Path(image.path[0])
            link_dir.mkdir(parents=True, exist_ok=True)
            for link, target in image.links.items():
                (link_dir / link).unlink(missing_ok=True)
                (link_dir / link).symlink_to(target)
        images[name] = image
    return images
