"""Go programs the tests run (``test-tools/<name>/``, each its own module), built once into
the cache beside the upstream binaries: ``<cache>/bin/<name>-<source hash>/<name>``, with
the same build progress. A change to the program's sources builds it again.

- ``kind-config-check``: decodes a kind config with kind v0.33.0's own Go types, strictly.
- ``gpuallocator-check``: answers GetPreferredAllocation requests with go-gpuallocator
  v0.6.0's best-effort policy over the NVML library it loads (the shim). go-nvml binds
  NVML through cgo (dlopen), so this one is built with ``CGO_ENABLED=1`` and needs a C
  compiler, as the shim does.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from harness import binaries
from harness.binaries import Component, Progress

TOOLS = Path(__file__).resolve().parents[1] / "test-tools"
# Programs that link C through cgo; the others build static, without a C compiler.
CGO_TOOLS = frozenset({"gpuallocator-check"})


def source_hash(src: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in src.iterdir() if p.suffix in (".go", ".mod", ".sum")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def build(name: str, progress: Progress) -> Path:
    """The built program ``name`` (building it first if its sources changed)."""
    src = TOOLS / name
    comp = Component(name=name, module=name, version=source_hash(src), commands={name: "."})
    out = comp.binary(name)
    if out.exists():
        return out
    go = binaries.find_go()
    env = {**os.environ, "CGO_ENABLED": "1" if name in CGO_TOOLS else "0"}
    deps = binaries._run([go, "list", "-deps", "-f", "{{.ImportPath}}", "."], src, env, name)
    tmp = comp.bin_dir.with_name(comp.bin_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    progress(f"{name}: building from {src}")
    cmd = [go, "build", "-v", "-trimpath", "-o", str(tmp / name), "."]
    binaries._build_with_progress(cmd, src, env, comp, len(deps.split()), progress)
    shutil.rmtree(comp.bin_dir, ignore_errors=True)
    tmp.rename(comp.bin_dir)
    progress(f"{name}: built {out}")
    return out
