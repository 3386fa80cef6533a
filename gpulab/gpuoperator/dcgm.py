"""``gpulab dcgm-exporter``: Prometheus metrics per GPU with DCGM's field names, from NVML.

Mirrors NVIDIA dcgm-exporter 4.5.3-4.8.2: the counters of ``etc/default-counters.csv``
(``DEFAULT_COUNTERS``: field, Prometheus type, help; ``label`` fields become labels on
every metric), the collectors CSV format (``-f``/``DCGM_EXPORTER_COLLECTORS``), the
listen address (``-a``/``DCGM_EXPORTER_LISTEN``, default ``:9400``), ``/metrics`` and
``/health``, and the exposition of ``internal/pkg/rendermetrics/render_metrics.go``
(one line per GPU; wrapped here)::

    # HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
    # TYPE DCGM_FI_DEV_GPU_TEMP gauge
    DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-...",pci_bus_id="00000000:07:00.0",
      device="nvidia0",modelName="NVIDIA A100-SXM4-40GB",Hostname="gpu-a100",
      DCGM_FI_DRIVER_VERSION="550.54.15"} 30

A MIG-enabled GPU's framebuffer fields are also reported per GPU instance, with
``GPU_I_PROFILE`` and ``GPU_I_ID``.

Deliberate differences: the values come from NVML through the shim (DCGM reads the same
counters from the driver): fields NVML does not answer on the board (clocks, power,
PCIe replays, profiling metrics ...) are left out, as dcgm-exporter leaves out fields
DCGM has no value for; ``DCGM_FI_DEV_XID_ERRORS`` is the last Xid NVML's event API
delivered since the exporter started; ``Hostname`` is the node's name (upstream: the
container's hostname; the lab's pods share the machine's); metrics are read at each
scrape (upstream: every collect interval, 30 s); no pod/container labels (no kubelet
pod-resources API in the lab).
"""

from __future__ import annotations

import csv
import http.server
import io
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulab.errors import CLIError

# etc/default-counters.csv: (field, type, help), uncommented entries, in file order
DEFAULT_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
     "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
     "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
     "Ratio of cycles the device memory interface is active sending or receiving data."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
     "The rate of data transmitted over the PCIe bus - including both protocol headers and "
     "data payloads - in bytes per second."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
     "The rate of data received over the PCIe bus - including both protocol headers and "
     "data payloads - in bytes per second."),
)  # fmt: skip
PROM_TYPES = ("gauge", "counter", "histogram", "summary", "label")
# the fields NVML answers on the lab's boards, and what per-MIG-instance rows carry
READABLE = {
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DRIVER_VERSION",
}
PER_INSTANCE = {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED"}
# every DCGM field a collectors file may name (dcgm-exporter refuses unknown ones)
KNOWN_FIELDS = {name for name, _t, _h in DEFAULT_COUNTERS} | {
    "DCGM_FI_NVML_VERSION",
    "DCGM_FI_DEV_BRAND",
    "DCGM_FI_DEV_SERIAL",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
}


@dataclass(frozen=True)
class Counter:
    field: str
    prom_type: str
    help: str


def default_counters() -> list[Counter]:
    return [Counter(*c) for c in DEFAULT_COUNTERS]


def parse_counters(text: str, source: str = "collectors file") -> list[Counter]:
    """A collectors CSV (``# comment`` lines; ``field, type, help``) - dcgm-exporter's
    ``ExtractCounters``; an unknown field or type names the line."""
    out = []
    for n, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip() or row[0].strip().startswith("#"):
            continue
        if len(row) < 3:
            raise CLIError(f"{source}: line {n}: expected 'field, type, help'")
        name, prom_type = row[0].strip(), row[1].strip()
        if name not in KNOWN_FIELDS:
            raise CLIError(f"{source}: line {n}: unknown DCGM field {name!r}")
        if prom_type not in PROM_TYPES:
            raise CLIError(f"{source}: line {n}: unknown metric type {prom_type!r}")
        out.append(Counter(name, prom_type, ",".join(row[2:]).strip()))
    return out


@dataclass(frozen=True)
class Entity:
    """One row's identity: a GPU, or a GPU instance of it (``mig_profile`` set)."""

    gpu: int
    uuid: str
    pci_bus_id: str
    device: str  # "nvidia<minor>"
    model: str
    mig_profile: str = ""
    gpu_instance_id: int = 0


@dataclass
class Sample:
    entity: Entity
    values: dict[str, Any] = field(default_factory=dict)


def _labels(entity: Entity, hostname: str, extra: Mapping[str, str]) -> str:
    parts = [
        f'gpu="{entity.gpu}"',
        f'UUID="{entity.uuid}"',
        f'pci_bus_id="{entity.pci_bus_id}"',
        f'device="{entity.device}"',
        f'modelName="{entity.model}"',
    ]
    if entity.mig_profile:
        parts += [f'GPU_I_PROFILE="{entity.mig_profile}"', f'GPU_I_ID="{entity.gpu_instance_id}"']
    if hostname:
        parts.append(f'Hostname="{hostname}"')
    parts += [f'{k}="{v}"' for k, v in extra.items()]
    return ",".join(parts)


def render(counters: Sequence[Counter], samples: Sequence[Sample], hostname: str) -> str:
    """``gpuMetricsFormat``: HELP/TYPE per counter, one line per entity with a value;
    ``label`` counters become labels of every line."""
    label_fields = [c.field for c in counters if c.prom_type == "label"]
    lines = []
    for counter in counters:
        if counter.prom_type == "label":
            continue
        rows = [s for s in samples if s.values.get(counter.field) is not None]
        if not rows:
            continue
        lines += [
            f"# HELP {counter.field} {counter.help}",
            f"# TYPE {counter.field} {counter.prom_type}",
        ]
        for s in rows:
            extra = {f: str(s.values[f]) for f in label_fields if s.values.get(f) is not None}
            lines.append(
                f"{counter.field}{{{_labels(s.entity, hostname, extra)}}} {s.values[counter.field]}"
            )
    return "\n".join(lines) + "\n" if lines else ""


# ---------------------------------------------------------------- NVML


class Reader:
    """Reads the samples from NVML; a thread follows Xid events (last Xid per GPU)."""

    def __init__(self) -> None:
        import pynvml

        self.N = pynvml
        self.last_xid: dict[int, int] = {}
        self._stop = threading.Event()

    def start(self) -> None:
        self.N.nvmlInit()
        threading.Thread(target=self._events, name="xid-events", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _events(self) -> None:
        N = self.N
        events = N.nvmlEventSetCreate()
        handles = {}
        for index in range(N.nvmlDeviceGetCount()):
            h = N.nvmlDeviceGetHandleByIndex(index)
            N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, events)
            handles[N.nvmlDeviceGetUUID(h)] = index
        while not self._stop.is_set():
            try:
                data = N.nvmlEventSetWait(events, 1000)
            except N.NVMLError_Timeout:
                continue
            index = handles.get(N.nvmlDeviceGetUUID(data.device))
            if index is not None:
                self.last_xid[index] = int(data.eventData)

    def _try(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.N.NVMLError:
            return None

    def samples(self) -> list[Sample]:
        N = self.N
        driver = N.nvmlSystemGetDriverVersion()
        out = []
        for index in range(N.nvmlDeviceGetCount()):
            h = N.nvmlDeviceGetHandleByIndex(index)
            gpu = Entity(
                gpu=index,
                uuid=N.nvmlDeviceGetUUID(h),
                pci_bus_id=N.nvmlDeviceGetPciInfo(h).busId,
                device=f"nvidia{N.nvmlDeviceGetMinorNumber(h)}",
                model=N.nvmlDeviceGetName(h),
            )
            values: dict[str, Any] = {"DCGM_FI_DRIVER_VERSION": driver}
            values["DCGM_FI_DEV_GPU_TEMP"] = self._try(
                N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU
            )
            util = self._try(N.nvmlDeviceGetUtilizationRates, h)
            if util is not None:
                values["DCGM_FI_DEV_GPU_UTIL"] = util.gpu
                values["DCGM_FI_DEV_MEM_COPY_UTIL"] = util.memory
            values.update(self._memory(h))
            values["DCGM_FI_DEV_XID_ERRORS"] = self.last_xid.get(index, 0)
            out.append(Sample(gpu, values))
            out += self._instances(h, gpu, driver)
        return out

    def _memory(self, h: Any) -> dict[str, int]:
        mem = self._try(self.N.nvmlDeviceGetMemoryInfo, h, self.N.nvmlMemory_v2)
        if mem is None:
            return {}
        mib = 2**20
        return {
            "DCGM_FI_DEV_FB_FREE": mem.free // mib,
            "DCGM_FI_DEV_FB_USED": mem.used // mib,
            "DCGM_FI_DEV_FB_RESERVED": mem.reserved // mib,
        }

    def _instances(self, h: Any, gpu: Entity, driver: str) -> list[Sample]:
        N = self.N
        try:
            count = N.nvmlDeviceGetMaxMigDeviceCount(h)
        except N.NVMLError:
            return []
        out = []
        for j in range(count):
            try:
                m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except N.NVMLError:
                continue
            profile = N.nvmlDeviceGetName(m).rsplit(" ", 1)[-1]
            entity = Entity(
                gpu.gpu, gpu.uuid, gpu.pci_bus_id, gpu.device, gpu.model,
                mig_profile=profile, gpu_instance_id=N.nvmlDeviceGetGpuInstanceId(m),
            )  # fmt: skip
            out.append(Sample(entity, {"DCGM_FI_DRIVER_VERSION": driver, **self._memory(m)}))
        return out


# ---------------------------------------------------------------- HTTP


def listen_address(value: str) -> tuple[str, int]:
    """``-a :9400`` / ``0.0.0.0:9400`` → (host, port); an empty host is every address."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise CLIError(f"invalid listen address {value!r}: use [host]:port, e.g. :9400")
    return host or "0.0.0.0", int(port)


def serve(
    address: tuple[str, int], counters: Sequence[Counter], reader: Reader, hostname: str
) -> http.server.ThreadingHTTPServer:
    kept = [c for c in counters if c.field in READABLE]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b"OK", "text/plain")
            elif self.path.split("?")[0] == "/metrics":
                body = render(kept, reader.samples(), hostname).encode()
                self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._send(404, b"not found", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer(address, Handler)
    return server
