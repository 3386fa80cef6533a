"""``gpulab dcgm-exporter``: Prometheus metrics per GPU with DCGM's field names, from NVML.

Mirrors NVIDIA dcgm-exporter 4.5.3-4.8.2 (the newest tag readable here; gpu-operator
v26.7.0 names 4.6.0-4.8.3): the counters of ``etc/default-counters.csv``
(``DEFAULT_COUNTERS``: field, Prometheus type, help; ``label`` fields become labels on
every metric); the collectors CSV as ``internal/pkg/counters`` reads it
(``ReadCSVFile``, ``ExtractCounters``: ``#`` comment lines, exactly 3 fields, each name
looked up in go-dcgm's field table - ``dcgm_fields.yaml`` - or among the exporter's own
``DCGM_EXP_*`` counters, profiling fields skipped where the GPU has no profiling module);
the listen address (``-a``/``DCGM_EXPORTER_LISTEN``, default ``:9400``), ``/metrics`` and
``/health``; the entities ``-d f`` (the default) monitors
(``devicemonitoring.monitorAllGPUInstances(addFlexibly=true)``: a GPU without GPU
instances is one entity, a GPU with instances is one entity per instance and no row of
its own); the ``Hostname`` label (``hostname.GetHostname``: under ``-k`` the NODE_NAME
environment variable, else the host's name); and the exposition of
``internal/pkg/rendermetrics/render_metrics.go`` (one line per entity; wrapped here)::

    # HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
    # TYPE DCGM_FI_DEV_GPU_TEMP gauge
    DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-...",pci_bus_id="00000000:07:00.0",
      device="nvidia0",modelName="NVIDIA A100-SXM4-40GB",Hostname="gpu-a100",
      DCGM_FI_DRIVER_VERSION="550.54.15"} 30

An instance's line adds ``GPU_I_PROFILE`` and ``GPU_I_ID`` (the parent GPU's gpu, UUID
and device stay).

Deliberate differences: the values come from NVML through the shim (DCGM reads the same
counters from the driver): fields NVML does not answer on the board (clocks, power,
PCIe replays ...) are left out, as dcgm-exporter leaves out fields DCGM has no value for,
and the lab's "DCGM" has no profiling module; on an instance's line the device-wide
fields (temperature, Xid, driver version) are its GPU's, the framebuffer ones the
instance's, and utilisation is left out (NVML has none per MIG device);
``DCGM_FI_DEV_XID_ERRORS`` is the last Xid NVML's event API delivered since the exporter
started, without upstream's ``err_code``/``err_msg`` labels; the ``DCGM_EXP_*`` counters
are accepted but not served; metrics are read at each scrape (upstream: every collect
interval, 30 s); no pod/container labels (no kubelet pod-resources API in the lab).
"""

from __future__ import annotations

import functools
import http.server
import logging
import os
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpulab.errors import CLIError
from gpulab.probes import GetOnly

_log = logging.getLogger("gpulab.gpuoperator.dcgm")

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
PROM_TYPES = ("gauge", "counter", "histogram", "summary", "label")  # promMetricType
FIELDS_FILE = Path(__file__).with_name("dcgm_fields.yaml")
# the exporter's own counters (internal/pkg/counters/const.go), found when go-dcgm has no
# field of the name
EXPORTER_FIELDS = (
    "DCGM_EXP_XID_ERRORS_COUNT",
    "DCGM_EXP_CLOCK_EVENTS_COUNT",
    "DCGM_EXP_GPU_HEALTH_STATUS",
    "DCGM_EXP_P2P_STATUS",
)
DCP_FIELDS = range(1000, 1100)  # dcpFieldsStart .. cpuFieldsStart: the profiling fields
# the fields NVML answers on the lab's boards
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


@functools.cache
def field_ids() -> dict[str, int]:
    """go-dcgm's ``GetFieldID`` table: the current names, then the legacy ones."""
    table = yaml.safe_load(FIELDS_FILE.read_text())
    return {**table["legacy"], **table["current"]}


@dataclass(frozen=True)
class Counter:
    field: str
    prom_type: str
    help: str


def default_counters() -> list[Counter]:
    return [Counter(*c) for c in DEFAULT_COUNTERS]


def _fields(line: str, n: int) -> list[str]:
    """One line split as Go's csv.Reader splits it (``LazyQuotes`` off): a field is
    quoted from its first character on (``""`` a quote inside), or has no quote at all."""
    fields, i = [], 0
    while True:
        if line.startswith('"', i):
            parts, j = [], i + 1
            while True:
                k = line.find('"', j)
                if k < 0:
                    raise CLIError(  # Go counts the newline it read looking for the quote
                        f"parse error on line {n}, column {len(line) + 2}: extraneous or "
                        'missing " in quoted-field'
                    )
                parts.append(line[j:k])
                if not line.startswith('"', k + 1):
                    break
                parts.append('"')
                j = k + 2
            fields.append("".join(parts))
            i = k + 1
            if i == len(line):
                return fields
            if line[i] != ",":
                raise CLIError(  # the column of the closing quote
                    f'parse error on line {n}, column {i}: extraneous or missing " in quoted-field'
                )
        else:
            k = line.find(",", i)
            field = line[i:] if k < 0 else line[i:k]
            if '"' in field:
                column = i + field.index('"') + 1
                raise CLIError(
                    f'parse error on line {n}, column {column}: bare " in non-quoted-field'
                )
            fields.append(field)
            if k < 0:
                return fields
            i = k
        i += 1  # past the comma


def _records(text: str) -> list[list[str]]:
    """``ReadCSVFile``: Go's csv.Reader with ``Comment = '#'`` - lines starting with ``#``
    and empty lines skipped, every record as many fields as the first."""
    records: list[tuple[int, list[str]]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line and not line.startswith("#"):
            records.append((n, _fields(line, n)))
    if records:
        width = len(records[0][1])
        for n, record in records:
            if len(record) != width:
                raise CLIError(f"record on line {n}: wrong number of fields")
    return [record for _n, record in records]


def parse_counters(text: str, source: str = "collectors file") -> list[Counter]:
    """``ExtractCounters``: each record ``field, type, help`` (exactly three, spaces
    trimmed); a name go-dcgm does not know must be one of the exporter's counters; a
    profiling field is skipped (no profiling module); the type must be Prometheus'."""
    out = []
    try:
        records = _records(text)
    except CLIError as exc:
        raise CLIError(f"{source}: {exc}") from None
    for i, raw in enumerate(records):
        record = [r.strip(" ") for r in raw]
        if len(record) != 3:
            raise CLIError(
                f"{source}: malformed CSV record; err: failed to parse line {i} "
                f"(`[{' '.join(record)}]`), expected 3 fields"
            )
        name, prom_type, help_text = record
        field_id = field_ids().get(name)
        if field_id is None:
            if name not in EXPORTER_FIELDS:
                raise CLIError(
                    f"{source}: could not find DCGM field; err: unknown ExporterCounter "
                    f"field '{name}'"
                )
            out.append(Counter(name, prom_type, help_text))
            continue
        if field_id in DCP_FIELDS:
            _log.warning("Skipping line %d ('%s'): metric not enabled", i, name)
            continue
        if prom_type not in PROM_TYPES:
            raise CLIError(f"{source}: could not find Prometheus metric type '{prom_type}'")
        out.append(Counter(name, prom_type, help_text))
    return out


@dataclass(frozen=True)
class Entity:
    """One row's identity: a GPU, or a GPU instance of it (``mig_profile`` set)."""

    gpu: int
    uuid: str
    pci_bus_id: str
    device: str  # "nvidia<GPU index>"
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
            extra = {  # a Go template ranges over a map in key order
                f: str(s.values[f]) for f in sorted(label_fields) if s.values.get(f) is not None
            }
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
        """One sample per monitored entity (``-d f``): a GPU with MIG devices is seen
        through them, one sample each; a GPU without any is a sample of its own."""
        N = self.N
        driver = N.nvmlSystemGetDriverVersion()
        out = []
        for index in range(N.nvmlDeviceGetCount()):
            h = N.nvmlDeviceGetHandleByIndex(index)
            gpu = Entity(
                gpu=index,
                uuid=N.nvmlDeviceGetUUID(h),
                pci_bus_id=N.nvmlDeviceGetPciInfo(h).busId,
                device=f"nvidia{index}",
                model=N.nvmlDeviceGetName(h),
            )
            device_wide: dict[str, Any] = {
                "DCGM_FI_DRIVER_VERSION": driver,
                "DCGM_FI_DEV_GPU_TEMP": self._try(
                    N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU
                ),
                "DCGM_FI_DEV_XID_ERRORS": self.last_xid.get(index, 0),
            }
            instances = self._instances(h, gpu)
            if instances:
                out += [Sample(e, {**device_wide, **self._per_device(m)}) for e, m in instances]
            else:
                out.append(Sample(gpu, {**device_wide, **self._per_device(h)}))
        return out

    def _per_device(self, h: Any) -> dict[str, Any]:
        """What NVML answers for one device, a GPU or a MIG device: utilisation (not for a
        MIG device) and framebuffer memory."""
        values: dict[str, Any] = {}
        util = self._try(self.N.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            values["DCGM_FI_DEV_GPU_UTIL"] = util.gpu
            values["DCGM_FI_DEV_MEM_COPY_UTIL"] = util.memory
        mem = self._try(self.N.nvmlDeviceGetMemoryInfo, h, self.N.nvmlMemory_v2)
        if mem is not None:
            mib = 2**20
            values["DCGM_FI_DEV_FB_FREE"] = mem.free // mib
            values["DCGM_FI_DEV_FB_USED"] = mem.used // mib
            values["DCGM_FI_DEV_FB_RESERVED"] = mem.reserved // mib
        return values

    def _instances(self, h: Any, gpu: Entity) -> list[tuple[Entity, Any]]:
        """The GPU's MIG devices, each as its entity (profile, GPU instance ID) and handle."""
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
            out.append((entity, m))
        return out


def hostname(kubernetes: bool, remote_hostengine: str | None) -> str:
    """``hostname.GetHostname``: in Kubernetes (``-k``) the node's name from NODE_NAME,
    else the host's name; with a remote host engine (``-r`` given) and not ``-k``, the
    engine's host."""
    if not kubernetes and remote_hostengine:  # net.SplitHostPort, else the value itself
        if remote_hostengine.startswith("[") and "]:" in remote_hostengine:
            return remote_hostengine[1:].partition("]:")[0]
        if remote_hostengine.count(":") == 1:
            return remote_hostengine.partition(":")[0]
        return remote_hostengine
    return os.environ.get("NODE_NAME") or socket.gethostname()


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

    class Handler(GetOnly):
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
