"""Point NVIDIA's Python NVML bindings (``pynvml`` from nvidia-ml-py) or any other NVML
consumer at the fake-gpu shim instead of the real libnvidia-ml.so.1.

Two ways, for two kinds of process:

* a process you start: ``env = {**os.environ, **shim_env(node, profile, state_dir)}``
  and pass ``env`` to subprocess. ``LD_LIBRARY_PATH`` makes its loader (pynvml's
  ``CDLL("libnvidia-ml.so.1")``, go-nvml's dlopen) find the shim; ``FAKE_GPU_CONFIG``
  tells the shim which node it is.
* the current process: ``os.environ.update(shim_env(...))`` then :func:`use_shim`
  before the first ``pynvml.nvmlInit()``. It preloads the shim by path; the dynamic
  loader then answers pynvml's soname lookup with it (LD_LIBRARY_PATH is read only at
  process start, so setting it late would not help).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from gpulab.fakegpu import paths, render
from gpulab.fakegpu.profiles import Profile, ProfileError, load

ENV_CONFIG = "FAKE_GPU_CONFIG"  # the rendered node file (required by the shim)
ENV_STATE_DIR = "FAKE_GPU_STATE_DIR"  # optional: overrides the config's state_dir
ENV_LIB = "GPULAB_FAKE_GPU_LIB"  # optional: another build of the shim
# The node's /proc/driver/nvidia-caps/mig-minors, for `gpulab device-plugin --mig-minors`.
ENV_MIG_MINORS = "MIG_MINORS_FILE"


def shim_path() -> Path:
    """The built shim; a ProfileError names the make target when it is missing."""
    lib = Path(os.environ.get(ENV_LIB, paths.SHIM_LIB))
    if not lib.is_file():
        raise ProfileError(f"NVML shim {lib} is not built; run `make -C {paths.SHIM_DIR}`")
    return lib


def shim_env(node: str, profile: str | Path | Profile, state_dir: str | Path) -> dict[str, str]:
    """Render ``profile`` for ``node`` under ``state_dir`` and return the environment a
    process needs to see that node's GPUs through the shim.

    ``state_dir`` is the state root shared by all simulated nodes (the CLI's
    ``--state-dir``); this node's files go to ``<state_dir>/<node>/``. Returns
    FAKE_GPU_CONFIG, LD_LIBRARY_PATH (the shim's directory first, then the caller's) and
    MIG_MINORS_FILE (the fake driver's ``mig-minors``, which the device plugin reads).
    """
    prof = profile if isinstance(profile, Profile) else load(profile)
    ndir = paths.node_dir(state_dir, node)
    config = render.write_node(prof, node, ndir)
    minors = ndir / paths.MIG_MINORS_NAME
    lib_dir = str(shim_path().parent)
    inherited = os.environ.get("LD_LIBRARY_PATH", "")
    return {
        ENV_CONFIG: str(config),
        ENV_MIG_MINORS: str(minors),
        "LD_LIBRARY_PATH": f"{lib_dir}:{inherited}" if inherited else lib_dir,
    }


def use_shim() -> Path:
    """Make this process's ``pynvml`` load the shim. Call before the first nvmlInit."""
    lib = shim_path()
    shim = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    # What pynvml will get: if another libnvidia-ml.so.1 is already loaded, this differs.
    by_soname = ctypes.CDLL("libnvidia-ml.so.1")
    if by_soname._handle != shim._handle:
        raise ProfileError(
            "another libnvidia-ml.so.1 is already loaded in this process; call use_shim() "
            "before anything initialises NVML"
        )
    return lib
