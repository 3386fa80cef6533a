"""The kubelet device-plugin API v1beta1 (``api.proto``), as generated Python modules.

The ``*_pb2.py`` / ``*_pb2_grpc.py`` stubs are build products (git-ignored): they are
generated next to ``api.proto`` with grpcio-tools the first time this package is
imported, and again whenever the proto is newer than them.
"""

from __future__ import annotations

import importlib
import logging
import os
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# Generating from the source root makes the stubs import each other by their full
# package path (``from gpulab.deviceplugin.api import api_pb2``).
_ROOT = _HERE.parents[2]
_PROTO = _HERE / "api.proto"
_OUTPUTS = (_HERE / "api_pb2.py", _HERE / "api_pb2_grpc.py")


def _generate() -> None:
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # a runtime image built without the dev extra
        raise ImportError(
            f"{_OUTPUTS[0].name} is missing and grpcio-tools is not installed to generate it; "
            "install the project with its dev extra (pip install -e '.[dev]')"
        ) from exc
    import grpc_tools

    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    # Generate into a scratch dir and rename into place, so a process importing at the
    # same moment never sees a half-written module.
    with tempfile.TemporaryDirectory(dir=_HERE) as out:
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{_ROOT}",
                f"-I{include}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                str(_PROTO),
            ]
        )
        if rc != 0:
            raise ImportError(f"protoc failed ({rc}) generating stubs from {_PROTO}")
        generated = Path(out) / _HERE.relative_to(_ROOT)
        for target in _OUTPUTS:
            os.replace(generated / target.name, target)


def _ensure_stubs() -> None:
    missing = [p for p in _OUTPUTS if not p.exists()]
    proto_mtime = _PROTO.stat().st_mtime
    if not missing and all(p.stat().st_mtime >= proto_mtime for p in _OUTPUTS):
        return
    try:
        _generate()
    except (ImportError, OSError) as exc:
        if missing:
            raise
        # Stubs that exist but look older than the proto (a copied tree, a read-only
        # image without grpcio-tools) still speak the protocol: use them.
        logging.getLogger(__name__).warning("could not regenerate gRPC stubs: %s", exc)


_ensure_stubs()

api_pb2 = importlib.import_module(f"{__name__}.api_pb2")
api_pb2_grpc = importlib.import_module(f"{__name__}.api_pb2_grpc")

__all__ = ["api_pb2", "api_pb2_grpc"]
