"""A small ``nvidia-smi`` over the fake-gpu shim: the summary table and ``-L``, read
through NVIDIA's own Python bindings (pynvml) exactly as a consumer would see them, with
the same reader as the device plugin (:func:`gpulab.deviceplugin.nvml.read_inventory`).

Run it in a process whose environment already points at the shim (see
:mod:`gpulab.fakegpu.nvml`); `gpulab fake-gpu smi` and `fake-nvidia-smi` arrange that.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pynvml

from gpulab.deviceplugin.nvml import read_inventory
from gpulab.deviceplugin.rm import GPUInfo
from gpulab.fakegpu import faults, nvml, paths
from gpulab.fakegpu.profiles import ProfileError

T = TypeVar("T")

_WIDE = 91  # the table width of nvidia-smi


@dataclass(frozen=True)
class Row:
    """One GPU of the table: the inventory (the lab's one NVML reader, shared with the
    device plugin) plus the live readings only nvidia-smi shows."""

    gpu: GPUInfo
    used_mib: int
    temperature: int | None

    @property
    def mig_mode(self) -> int | None:  # None: not MIG capable
        return int(self.gpu.mig_enabled) if self.gpu.mig_capable else None


def _try(fn: Callable[..., T], *args: object) -> T | None:
    """``fn(*args)``, or None where NVML says the board lacks the feature."""
    try:
        return fn(*args)
    except pynvml.NVMLError_NotSupported:
        return None


def read_gpus() -> list[Row]:
    """Everything the table shows, read through pynvml (caller has called nvmlInit)."""
    rows = []
    for gpu in read_inventory():
        h = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        rows.append(
            Row(
                gpu=gpu,
                used_mib=pynvml.nvmlDeviceGetMemoryInfo(h).used >> 20,
                temperature=_try(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
            )
        )
    return rows


def format_list(rows: list[Row]) -> str:
    """``nvidia-smi -L``."""
    lines = []
    for r in rows:
        g = r.gpu
        lines.append(f"GPU {g.index}: {g.name} (UUID: {g.uuid})")
        for m in g.migs:
            lines.append(f"  MIG {m.profile:<11} Device {m.index:>2}: (UUID: {m.uuid})")
    return "\n".join(lines)


def _cell(left: str, right: str, width: int) -> str:
    """One table cell: ``left`` flush left, ``right`` flush right, like nvidia-smi."""
    pad = width - 2 - len(left) - len(right)
    return f" {left}{' ' * max(pad, 1 if left and right else 0)}{right} "


def _row(*cells: tuple[str, str, int]) -> str:
    return "|" + "|".join(_cell(left, right, width) for left, right, width in cells) + "|"


def _boxed(text: str) -> str:
    return f"| {text:<{_WIDE - 4}} |"


def format_table(driver: str, cuda: int, rows: list[Row], health: dict[int, str]) -> str:
    """The default ``nvidia-smi`` summary; ``health`` maps GPU index to a fault note."""
    a, b, c = 41, 24, 22
    sep = f"+{'-' * a}+{'-' * b}+{'-' * c}+"
    line = "+" + "-" * (_WIDE - 2) + "+"
    cuda_str = f"{cuda // 1000}.{cuda % 1000 // 10}"
    lines = [
        line,
        _row(
            (
                f"NVIDIA-SMI (fake-gpu)    Driver Version: {driver}",
                f"CUDA Version: {cuda_str}",
                _WIDE - 2,
            )
        ),
        sep,
        _row(
            ("GPU  Name", "Persistence-M", a),
            ("Bus-Id", "Disp.A", b),
            ("", "Volatile Uncorr. ECC", c),
        ),
        _row(
            ("Fan  Temp   Perf", "Pwr:Usage/Cap", a),
            ("", "Memory-Usage", b),
            ("GPU-Util", "Compute M.", c),
        ),
        _row(("", "", a), ("", "", b), ("", "MIG M.", c)),
        f"+{'=' * a}+{'=' * b}+{'=' * c}+",
    ]
    for r in rows:
        g = r.gpu
        temp = "N/A" if r.temperature is None else f"{r.temperature}C"
        mig = {None: "N/A", 0: "Disabled", 1: "Enabled"}[r.mig_mode]
        lines += [
            _row((f"{g.index:>3}  {g.name}", "On", a), (g.pci_bus_id, "Off", b), ("", "0", c)),
            _row(
                (f"N/A  {temp:>4}    P0", "N/A /  N/A", a),
                ("", f"{r.used_mib}MiB / {g.memory_mib}MiB", b),
                ("0%", "Default", c),
            ),
            _row(("", "", a), ("", "", b), ("", mig, c)),
            sep,
        ]
    migs = [(r.gpu.index, m) for r in rows for m in r.gpu.migs]
    if migs:
        lines += [
            "",
            line,
            _boxed("MIG devices:"),
            line,
            _boxed("GPU  GI  CI  MIG  Profile                Memory-Usage"),
            "|" + "=" * (_WIDE - 2) + "|",
        ]
        for gpu_index, m in migs:
            lines.append(
                _boxed(
                    f"{gpu_index:>3} {m.gi_id:>3} {m.ci_id:>3} {m.index:>4}  {m.profile:<12} "
                    f"{0:>12}MiB / {m.memory_mib:>5}MiB"
                )
            )
        lines.append(line)
    if health:
        lines += ["", line, _boxed("Injected faults (fake-gpu):")]
        lines += [_boxed(f"GPU {gpu}: {note}") for gpu, note in sorted(health.items())]
        lines.append(line)
    lines += ["", line, _boxed("Processes:"), _boxed("No running processes found"), line]
    return "\n".join(lines)


def _health_notes() -> dict[int, str]:
    """Active injected faults of the node the shim serves (what NVML events report)."""
    config = os.environ.get(nvml.ENV_CONFIG)
    if not config:
        return {}
    state = os.environ.get(nvml.ENV_STATE_DIR) or _state_dir_of(Path(config))
    notes = {}
    for gpu, active in faults.active(Path(state)).items():
        notes[gpu] = ", ".join(f.describe() for f in active)
    return notes


def _state_dir_of(config: Path) -> str:
    for line in config.read_text().splitlines():
        if line.startswith("state_dir="):
            return line.split("=", 1)[1]
    return str(config.parent)


def run(list_only: bool) -> str:
    """Initialise NVML through the shim, read the GPUs and format them."""
    nvml.use_shim()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise ProfileError(
            f"NVML init failed through the fake-gpu shim: {exc} (is {nvml.ENV_CONFIG} set "
            f"to a rendered config? see the message above)"
        ) from None
    try:
        gpus = read_gpus()
        if list_only:
            return format_list(gpus)
        return format_table(
            pynvml.nvmlSystemGetDriverVersion(),
            pynvml.nvmlSystemGetCudaDriverVersion(),
            gpus,
            _health_notes(),
        )
    finally:
        pynvml.nvmlShutdown()


def select_node(node: str | None, profile: str | None, state_dir: str | None) -> None:
    """Point this process at a node: render ``profile`` for it, or use its existing config;
    with neither, keep the FAKE_GPU_CONFIG already in the environment."""
    if node is None:
        if profile is not None:
            raise ProfileError("--profile needs --node (the UUIDs depend on the node name)")
        if not os.environ.get(nvml.ENV_CONFIG):
            raise ProfileError(f"give --node (and --profile), or set {nvml.ENV_CONFIG}")
        return
    root = paths.state_root(state_dir, node)
    if profile is not None:
        os.environ.update(nvml.shim_env(node, profile, root))
    else:
        os.environ[nvml.ENV_CONFIG] = str(paths.existing_config(root, node))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-L", "--list-gpus", action="store_true", help="list GPUs and MIG devices")
    parser.add_argument("--node", help="simulated node (default: $FAKE_GPU_CONFIG)")
    parser.add_argument("--profile", help="render this profile for --node first")
    parser.add_argument("--state-dir", help=f"state root (default: ${paths.ENV_STATE_ROOT})")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `fake-nvidia-smi`."""
    parser = argparse.ArgumentParser(prog="fake-nvidia-smi", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        select_node(args.node, args.profile, args.state_dir)
        print(run(args.list_gpus))
    except ProfileError as exc:
        print(f"fake-nvidia-smi: error: {exc}", file=sys.stderr)
        return 2
    return 0
