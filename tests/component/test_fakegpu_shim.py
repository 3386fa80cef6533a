"""The NVML shim seen through NVIDIA's own pynvml, one subprocess per scenario (pynvml
and the shim keep per-process state, and a crash must fail a test, not pytest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpulab.fakegpu import faults, nvml, paths, profiles, render

NODE = "gpu-node-1"
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_UNKNOWN = 999
TOPOLOGY_INTERNAL, TOPOLOGY_NODE, TOPOLOGY_SYSTEM = 0, 40, 50


@pytest.fixture(scope="session")
def shim() -> Path:
    subprocess.run(["make", "-s", "-C", str(paths.SHIM_DIR)], check=True)
    assert paths.SHIM_LIB.is_file()
    return paths.SHIM_LIB


def run_python(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_GPU")}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def probe(code: str, env: dict[str, str]) -> object:
    """Run ``code`` (which prints one JSON document) against the shim and parse it."""
    proc = run_python(code, env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


PROBE_ALL = """
    import json, pynvml as N

    def err(fn, *a):
        try:
            fn(*a)
            return None
        except N.NVMLError as e:
            return e.value

    N.nvmlInit()
    out = {"driver": N.nvmlSystemGetDriverVersion(), "cuda": N.nvmlSystemGetCudaDriverVersion(),
           "count": N.nvmlDeviceGetCount(), "gpus": [],
           "bad_index": err(N.nvmlDeviceGetHandleByIndex, N.nvmlDeviceGetCount())}
    handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(out["count"])]
    for i, h in enumerate(handles):
        pci = N.nvmlDeviceGetPciInfo(h)
        g = {"name": N.nvmlDeviceGetName(h), "uuid": N.nvmlDeviceGetUUID(h),
             "index": N.nvmlDeviceGetIndex(h), "minor": N.nvmlDeviceGetMinorNumber(h),
             "bus": pci.busId, "pci_id": pci.pciDeviceId,
             "mem": N.nvmlDeviceGetMemoryInfo(h).total,
             "mem_v2": N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2).total,
             "cc": list(N.nvmlDeviceGetCudaComputeCapability(h)),
             "numa": N.nvmlDeviceGetNumaNodeId(h), "arch": N.nvmlDeviceGetArchitecture(h),
             "cpus": list(N.nvmlDeviceGetCpuAffinity(h, 2)),
             "by_uuid": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(h))),
             "by_bus": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(pci.busId)),
             "topo": [N.nvmlDeviceGetTopologyCommonAncestor(h, o) for o in handles],
             "p2p_nvlink": [N.nvmlDeviceGetP2PStatus(h, o, N.NVML_P2P_CAPS_INDEX_NVLINK)
                            for o in handles],
             "mig_mode_err": err(N.nvmlDeviceGetMigMode, h), "migs": []}
        try:
            g["nvlink"] = [N.nvmlDeviceGetNvLinkState(h, 0),
                           N.nvmlDeviceGetNvLinkRemotePciInfo(h, 0).busId]
        except N.NVMLError as e:
            g["nvlink"] = e.value
        if g["mig_mode_err"] is None:
            g["mig_mode"] = N.nvmlDeviceGetMigMode(h)
            g["max_mig"] = N.nvmlDeviceGetMaxMigDeviceCount(h)
            for j in range(g["max_mig"]):
                try:
                    m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                except N.NVMLError_NotFound:
                    continue
                parent = N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
                gi = N.nvmlDeviceGetGpuInstanceById(h, N.nvmlDeviceGetGpuInstanceId(m))
                g["migs"].append({
                    "uuid": N.nvmlDeviceGetUUID(m), "name": N.nvmlDeviceGetName(m),
                    "mem": N.nvmlDeviceGetMemoryInfo(m).total,
                    "is_mig": bool(N.nvmlDeviceIsMigDeviceHandle(m).value),
                    "parent": N.nvmlDeviceGetIndex(parent),
                    "gi": N.nvmlDeviceGetGpuInstanceId(m),
                    "ci": N.nvmlDeviceGetComputeInstanceId(m),
                    "slices": N.nvmlDeviceGetAttributes(m).gpuInstanceSliceCount,
                    "gi_profile_id": N.nvmlGpuInstanceGetInfo(gi).profileId,
                    "by_uuid_is_mig": bool(N.nvmlDeviceIsMigDeviceHandle(
                        N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(m))).value),
                })
            g["gi_profiles"] = {}
            for p in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
                try:
                    info = N.nvmlDeviceGetGpuInstanceProfileInfo(h, p)
                except N.NVMLError_NotSupported:
                    continue
                g["gi_profiles"][info.name] = [info.id, info.sliceCount, info.memorySizeMB,
                                               info.instanceCount]
        out["gpus"].append(g)
    N.nvmlShutdown()
    print(json.dumps(out))
"""


@pytest.mark.parametrize("name", profiles.available())
def test_every_profile_through_pynvml(shim: Path, tmp_path: Path, name: str) -> None:
    profile = profiles.load(name)
    got = probe(PROBE_ALL, nvml.shim_env(NODE, name, tmp_path))
    assert got["driver"] == profile.driver_version
    assert got["cuda"] == profile.cuda_driver_version
    assert got["count"] == len(profile.gpus)
    assert got["bad_index"] == NVML_ERROR_INVALID_ARGUMENT
    for gpu, g in zip(profile.gpus, got["gpus"], strict=True):
        i = gpu.index
        assert g["name"] == gpu.model.name
        assert g["uuid"] == profiles.gpu_uuid(NODE, i)
        assert g["index"] == g["minor"] == g["by_uuid"] == g["by_bus"] == i
        assert g["bus"] == gpu.pci_bus_id
        assert g["pci_id"] == render.BOARDS[gpu.model.name].pci_device_id
        assert g["mem"] == g["mem_v2"] == gpu.model.memory_mib * 2**20
        assert tuple(g["cc"]) == gpu.model.compute_capability
        assert g["numa"] == gpu.numa_node
        first = gpu.numa_node * render.CPUS_PER_NUMA_NODE
        cpus = {w * 64 + b for w, word in enumerate(g["cpus"]) for b in range(64) if word >> b & 1}
        assert cpus == set(range(first, first + render.CPUS_PER_NUMA_NODE))
        for other, level in zip(profile.gpus, g["topo"], strict=True):
            if other.index == i:
                assert level == TOPOLOGY_INTERNAL
            elif other.numa_node == gpu.numa_node:
                assert level == TOPOLOGY_NODE
            else:
                assert level == TOPOLOGY_SYSTEM
        assert [s == 0 for s in g["p2p_nvlink"]] == [
            o.index in gpu.nvlink_peers for o in profile.gpus
        ]
        if render.BOARDS[gpu.model.name].nvlinks == 0:
            assert g["nvlink"] == NVML_ERROR_NOT_SUPPORTED
        elif gpu.nvlink_peers:
            assert g["nvlink"] == [1, profile.gpus[gpu.nvlink_peers[0]].pci_bus_id]
        else:
            assert g["nvlink"] == NVML_ERROR_NOT_SUPPORTED  # no peer: link 0 not trained
        if not gpu.model.mig_capable:
            assert g["mig_mode_err"] == NVML_ERROR_NOT_SUPPORTED
            continue
        assert g["mig_mode"] == [int(gpu.mig_enabled)] * 2
        assert g["max_mig"] == 7
        assert [m["uuid"] for m in g["migs"]] == [
            profiles.mig_uuid(NODE, i, j) for j in range(len(gpu.mig_instances))
        ]
        for j, (mp, m) in enumerate(zip(gpu.mig_instances, g["migs"], strict=True)):
            assert m["name"] == f"{gpu.model.name} MIG {mp.name}"
            assert m["mem"] == mp.memory_mib * 2**20
            assert m["is_mig"] and m["by_uuid_is_mig"] and m["parent"] == i
            assert (m["gi"], m["ci"]) == (j + 1, 0)
            assert m["slices"] == mp.slices
            assert m["gi_profile_id"] == render.gi_profile_ids(gpu.model, mp)[1]
        assert g["gi_profiles"] == {
            f"MIG {mp.name}": [
                render.gi_profile_ids(gpu.model, mp)[1],
                mp.slices,
                mp.memory_mib,
                mp.max_count,
            ]
            for mp in gpu.model.mig_profiles
        }


def test_a100_40gb_mig_profile_ids_match_nvidia_smi(shim: Path, tmp_path: Path) -> None:
    """The GI profile IDs nvidia-smi prints for an A100-SXM4-40GB (mig -lgip)."""
    got = probe(PROBE_ALL, nvml.shim_env(NODE, "a100-sxm4-40gb-x8", tmp_path))
    ids = {name: v[0] for name, v in got["gpus"][0]["gi_profiles"].items()}
    assert ids == {
        "MIG 1g.5gb": 19,
        "MIG 1g.10gb": 15,
        "MIG 2g.10gb": 14,
        "MIG 3g.20gb": 9,
        "MIG 4g.20gb": 5,
        "MIG 7g.40gb": 0,
    }
    assert got["gpus"][0]["mig_mode"] == [0, 0]  # capable, not enabled in this profile


# --------------------------------------------------------------------------- init errors

INIT = """
    import pynvml as N
    for _ in range(2):
        try:
            N.nvmlInit()
            print("ok")
        except N.NVMLError as e:
            print(e.value)
"""


def test_init_without_config_env_is_library_not_found(shim: Path) -> None:
    proc = run_python(INIT, {"LD_LIBRARY_PATH": str(shim.parent)})
    assert proc.stdout.split() == [str(NVML_ERROR_LIBRARY_NOT_FOUND)] * 2
    assert proc.stderr.count("nvmlInit failed") == 1  # logged once per process
    assert "FAKE_GPU_CONFIG is not set" in proc.stderr


def test_init_with_missing_file_names_env_and_file(shim: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "config"
    env = {"LD_LIBRARY_PATH": str(shim.parent), nvml.ENV_CONFIG: str(missing)}
    proc = run_python(INIT, env)
    assert proc.stdout.split() == [str(NVML_ERROR_LIBRARY_NOT_FOUND)] * 2
    assert f"FAKE_GPU_CONFIG={missing}" in proc.stderr
    assert proc.stderr.count("nvmlInit failed") == 1


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda t: t.replace("gpu.0.memory_mib=", "gpu.0.memory="), "line"),
        (lambda t: t.replace("gpu_count=8", "gpu_count=9"), "gpu.8"),
        (lambda t: t.replace("version=1\n", "version=7\n", 1), "line"),
        (lambda t: t + "gpu.0.nvlinks=twelve\n", "line"),
        (lambda t: "\n".join(x for x in t.splitlines() if not x.startswith("gpu.2.uuid")), "gpu.2"),
        (lambda t: t + "no equals sign\n", "key=value"),
    ],
)
def test_init_with_malformed_file_is_unknown_error(
    shim: Path, tmp_path: Path, edit, reason
) -> None:
    good = render.render(profiles.load("a100-sxm4-40gb-x8"), NODE)
    config = tmp_path / "config"
    config.write_text(edit(good))
    env = {"LD_LIBRARY_PATH": str(shim.parent), nvml.ENV_CONFIG: str(config)}
    proc = run_python(INIT, env)
    assert proc.stdout.split() == [str(NVML_ERROR_UNKNOWN)] * 2
    assert f"FAKE_GPU_CONFIG={config}" in proc.stderr and reason in proc.stderr


def test_use_shim_in_process_without_ld_library_path(shim: Path, tmp_path: Path) -> None:
    env = nvml.shim_env(NODE, "t4-x1", tmp_path)
    env.pop("LD_LIBRARY_PATH")
    got = probe(
        """
        import json, pynvml
        from gpulab.fakegpu import nvml
        nvml.use_shim()
        pynvml.nvmlInit()
        print(json.dumps(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))))
        """,
        env,
    )
    assert got == "Tesla T4"


# --------------------------------------------------------------------------- events

WAITER = """
    import json, sys, threading, time, pynvml as N
    N.nvmlInit()
    es = N.nvmlEventSetCreate()
    for i in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(i)
        N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError
                                   | N.nvmlEventTypeDoubleBitEccError, es)
    queries, stop = [], threading.Event()

    def query_meanwhile():  # a consumer's other threads keep using NVML during the wait
        while not stop.is_set():
            h = N.nvmlDeviceGetHandleByIndex(0)
            queries.append(N.nvmlDeviceGetMemoryInfo(h).total > 0 and N.nvmlDeviceGetName(h))

    t = threading.Thread(target=query_meanwhile)
    t.start()
    print("ready", flush=True)
    want, events = int(sys.argv[1]), []
    deadline = time.time() + float(sys.argv[2])
    while len(events) < want and time.time() < deadline:
        try:
            d = N.nvmlEventSetWait_v2(es, 200)
        except N.NVMLError_Timeout:
            continue
        events.append({"t": time.time(), "gpu": N.nvmlDeviceGetIndex(d.device),
                       "type": d.eventType, "data": d.eventData, "gi": d.gpuInstanceId})
    stop.set()
    t.join()
    assert queries and all(queries), "concurrent queries failed"
    N.nvmlEventSetFree(es)
    print(json.dumps(events), flush=True)
"""


def start_waiter(env: dict[str, str], want: int, seconds: float) -> subprocess.Popen:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_GPU")}
    full_env.update(env)
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WAITER), str(want), str(seconds)],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc


def waiter_events(proc: subprocess.Popen) -> list[dict]:
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return json.loads(out)


def test_xid79_reaches_a_waiting_process_within_a_second(shim: Path, tmp_path: Path) -> None:
    import time

    env = nvml.shim_env(NODE, "a100-sxm4-40gb-x8", tmp_path)
    waiter = start_waiter(env, want=1, seconds=10)
    time.sleep(0.3)  # let it block in nvmlEventSetWait_v2
    t0 = time.time()
    faults.inject_xid(tmp_path / NODE, 3, faults.XID_FALLEN_OFF_BUS)
    (event,) = waiter_events(waiter)
    assert (event["gpu"], event["type"], event["data"]) == (3, faults.EVENT_XID_CRITICAL, 79)
    assert event["t"] - t0 < 1.0


def test_ignored_xid_and_dbe_are_still_delivered(shim: Path, tmp_path: Path) -> None:
    env = nvml.shim_env(NODE, "a100-80gb-mig-x8", tmp_path)
    waiter = start_waiter(env, want=3, seconds=10)
    faults.inject_xid(tmp_path / NODE, 1, 13)
    faults.inject_ecc_dbe(tmp_path / NODE, 6)
    events = waiter_events(waiter)
    assert [(e["gpu"], e["type"], e["data"]) for e in events] == [
        (1, faults.EVENT_XID_CRITICAL, 13),
        (6, faults.EVENT_DOUBLE_BIT_ECC, 0),
        (6, faults.EVENT_XID_CRITICAL, faults.XID_DBE),
    ]
    assert all(e["gi"] == 0xFFFFFFFF for e in events)  # GPU-wide on a MIG-enabled GPU


def test_a_fault_is_delivered_once_and_never_replayed_to_a_later_consumer(
    shim: Path, tmp_path: Path
) -> None:
    """nvml.h: "All events that occurred before this call are not recorded." A consumer
    that registers after a fault (a restarted device plugin) never sees it."""
    env = nvml.shim_env(NODE, "t4-x4", tmp_path)
    ndir = tmp_path / NODE
    first = start_waiter(env, want=1, seconds=10)
    faults.inject_xid(ndir, 2, 79)
    assert [(e["gpu"], e["data"]) for e in waiter_events(first)] == [(2, 79)]
    # A consumer started after the fault waits for two events: the old one must not come
    # (bounded by its 3 s), the new one must (the positive control).
    later = start_waiter(env, want=2, seconds=3)
    faults.inject_xid(ndir, 1, 31)
    assert [(e["gpu"], e["data"]) for e in waiter_events(later)] == [(1, 31)]
    # `clear` changes the shim's fault state only; it sends no event either
    assert faults.active(ndir)
    faults.clear(ndir)
    assert faults.active(ndir) == {}


def test_events_on_a_gpu_without_mig_name_no_instance(shim: Path, tmp_path: Path) -> None:
    env = nvml.shim_env(NODE, "t4-x4", tmp_path)
    waiter = start_waiter(env, want=1, seconds=10)
    faults.inject_xid(tmp_path / NODE, 0, 79)
    (event,) = waiter_events(waiter)
    assert event["gi"] == 0xFFFFFFFF  # nvml.h: not attributable to a MIG instance


NVLINK_COUNTS = """
    import json, pynvml as N
    N.nvmlInit()
    handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
    bus = [N.nvmlDeviceGetPciInfo(h).busId for h in handles]
    links = []
    for h in handles:  # what go-gpuallocator's GetNVLink counts: remote PCI bus per link
        row = [0] * len(handles)
        for link in range(N.NVML_NVLINK_MAX_LINKS):
            try:
                if N.nvmlDeviceGetNvLinkState(h, link) != N.NVML_FEATURE_ENABLED:
                    continue
                row[bus.index(N.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)] += 1
            except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
                continue
        links.append(row)
    print(json.dumps(links))
"""


@pytest.mark.parametrize("name", ["a100-sxm4-40gb-x8", "h100-80gb-x8", "mixed", "t4-x4"])
def test_nvlink_counts_are_the_same_from_both_ends(shim: Path, tmp_path: Path, name: str) -> None:
    links = probe(NVLINK_COUNTS, nvml.shim_env(NODE, name, tmp_path))
    profile = profiles.load(name)
    for a in profile.gpus:
        for b in profile.gpus:
            assert links[a.index][b.index] == links[b.index][a.index]
            assert (links[a.index][b.index] > 0) == (b.index in a.nvlink_peers)
    if name == "a100-sxm4-40gb-x8":  # 12 links over 7 peers: one per pair, evenly
        assert {links[a][b] for a in range(8) for b in range(8) if a != b} == {1}
    if name == "mixed":  # an NVLink bridge: all 12 links of the pair
        assert links[0][1] == 12


MIG_PROFILE_WALK = """
    import json, pynvml as N
    # go-nvlib v0.12.0 device.(*migdevice).GetProfile, step by step
    N.nvmlInit()
    out = []
    parent = N.nvmlDeviceGetHandleByIndex(0)
    total = N.nvmlDeviceGetMemoryInfo(parent).total
    for j in range(N.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            mig = N.nvmlDeviceGetMigDeviceHandleByIndex(parent, j)
        except N.NVMLError_NotFound:
            continue
        attrs = N.nvmlDeviceGetAttributes(mig)
        gi = N.nvmlDeviceGetGpuInstanceById(parent, N.nvmlDeviceGetGpuInstanceId(mig))
        ci = N.nvmlGpuInstanceGetComputeInstanceById(gi, N.nvmlDeviceGetComputeInstanceId(mig))
        gi_info, ci_info = N.nvmlGpuInstanceGetInfo(gi), N.nvmlComputeInstanceGetInfo(ci)
        found = None
        for i in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                gp = N.nvmlDeviceGetGpuInstanceProfileInfo(parent, i, version=1)
            except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
                continue
            if gp.id != gi_info.profileId:
                continue
            for c in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                for v in (1, 2):
                    try:
                        cp = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, c, 0, version=v)
                    except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
                        continue
                    if cp.id == ci_info.profileId and found is None:
                        found = [i, c, cp.sliceCount, gp.sliceCount, attrs.memorySizeMB]
        out.append({"found": found, "ci_parent_gi": N.nvmlGpuInstanceGetInfo(
            ci_info.gpuInstance).id, "gi": gi_info.id, "ci": ci_info.id,
            "placement": [ci_info.placement.start, ci_info.placement.size]})
    print(json.dumps({"total": total, "migs": out}))
"""


def test_go_nvlib_mig_profile_lookup_works(shim: Path, tmp_path: Path) -> None:
    from gpulab.deviceplugin.rm import mig_profile_name

    got = probe(MIG_PROFILE_WALK, nvml.shim_env(NODE, "a100-80gb-mig-x8", tmp_path))
    gpu = profiles.load("a100-80gb-mig-x8").gpus[0]
    names = []
    for j, (mp, m) in enumerate(zip(gpu.mig_instances, got["migs"], strict=True)):
        assert m["found"] is not None, f"no CI profile matches MIG device {j}"
        gi_enum, _ci_enum, c, g, mem = m["found"]
        assert gi_enum == render.gi_profile_ids(gpu.model, mp)[0]
        assert (m["gi"], m["ci"], m["ci_parent_gi"]) == (j + 1, 0, j + 1)
        assert m["placement"] == [0, mp.slices]
        assert c == g == mp.slices  # a full-size CI: go-nvlib names it "<g>g.<mem>gb"
        names.append(mig_profile_name(g, mem, got["total"] >> 20))
    assert names == [mp.name for mp in gpu.mig_instances]


def test_nodes_on_one_machine_have_separate_fault_state(shim: Path, tmp_path: Path) -> None:
    env_a = nvml.shim_env("node-a", "t4-x1", tmp_path)
    nvml.shim_env("node-b", "t4-x1", tmp_path)
    faults.inject_xid(tmp_path / "node-b", 0, 79)
    assert waiter_events(start_waiter(env_a, want=1, seconds=1)) == []


# --------------------------------------------------------------------------- robustness

ROBUST = """
    import ctypes, json, sys
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    lib.nvmlErrorString.restype = ctypes.c_char_p
    names = sys.argv[1].split(",")
    codes = {}

    def call(name, *args):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_char_p if name == "nvmlErrorString" else ctypes.c_int
        result = fn(*[ctypes.c_void_p(a) for a in args])
        codes.setdefault(name, []).append(result.decode() if isinstance(result, bytes) else result)

    for name in names:  # before nvmlInit
        call(name, 0, 0, 0, 0)
    lib.nvmlShutdown()
    assert lib.nvmlInit_v2() == 0
    gpu, mig = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(gpu)) == 0
    if lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0, ctypes.byref(mig)) != 0:
        mig = gpu  # a profile without MIG
    for name in names:
        lib.nvmlInit_v2()  # keeps a stray nvmlShutdown from ending the session
        call(name, 0, 0, 0, 0)
        takes_handle = name.startswith(("nvmlDevice", "nvmlGpuInstance")) and not name.startswith(
            ("nvmlDeviceGetCount", "nvmlDeviceGetHandleBy"))
        if takes_handle:
            call(name, gpu.value, 0, 0, 0)
            call(name, mig.value, 0, 0, 0)
    out = ctypes.c_void_p()
    info = (ctypes.c_ubyte * 512)()
    u = ctypes.c_uint()
    ranged = {
        "handle_by_index_99": lib.nvmlDeviceGetHandleByIndex_v2(99, ctypes.byref(out)),
        "mig_by_index_7": lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 7, ctypes.byref(out)),
        "mig_by_index_5": lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 5, ctypes.byref(out)),
        "nvlink_state_99": lib.nvmlDeviceGetNvLinkState(gpu, 99, ctypes.byref(u)),
        "nvlink_pci_99": lib.nvmlDeviceGetNvLinkRemotePciInfo_v2(gpu, 99, info),
        "gi_profile_99": lib.nvmlDeviceGetGpuInstanceProfileInfo(gpu, 99, info),
        "gi_by_id_99": lib.nvmlDeviceGetGpuInstanceById(gpu, 99, ctypes.byref(out)),
        "p2p_index_99": lib.nvmlDeviceGetP2PStatus(gpu, gpu, 99, ctypes.byref(u)),
        "cpu_affinity_0": lib.nvmlDeviceGetCpuAffinity(gpu, 0, info),
        "bad_handle": lib.nvmlDeviceGetIndex(ctypes.c_void_p(ctypes.addressof(info)),
                                             ctypes.byref(u)),
        "name_too_short": lib.nvmlDeviceGetName(gpu, info, 4),
    }
    strings = {str(c): lib.nvmlErrorString(c).decode() for c in (0, 2, 3, 12, 999, 12345)}
    print(json.dumps({"codes": codes, "ranged": ranged, "strings": strings}))
"""

KNOWN_CODES = set(range(0, 31)) | {999}
NOT_AN_NVML_CALL = {"nvmlErrorString"}
INIT_CALLS = {"nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown"}


def exported_functions(lib: Path) -> list[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], check=True, capture_output=True, text=True
    ).stdout
    return sorted(line.split()[2] for line in out.splitlines() if line.split()[1] == "T")


@pytest.mark.parametrize("profile", ["a100-80gb-mig-x8", "t4-x4"])
def test_every_export_survives_null_and_out_of_range_arguments(
    shim: Path, tmp_path: Path, profile: str
) -> None:
    names = exported_functions(shim)
    assert len(names) > 100 and "nvmlEventSetWait_v2" in names
    env = nvml.shim_env(NODE, profile, tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ROBUST), ",".join(names)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"shim crashed or misbehaved (rc {proc.returncode}): {proc.stderr}"
    got = json.loads(proc.stdout)
    assert set(got["codes"]) == set(names)
    for name, codes in got["codes"].items():
        if name in NOT_AN_NVML_CALL:
            continue
        assert set(codes) <= KNOWN_CODES, (name, codes)
        if name not in INIT_CALLS:
            # NULL outputs or no handle: never a success
            assert 0 not in codes, (name, codes)
    assert got["codes"]["nvmlDeviceGetCount_v2"][0] == 1  # before init: UNINITIALIZED
    assert got["strings"]["0"] == "Success"
    assert got["strings"]["12"] == "NVML Shared Library Not Found"
    assert got["strings"]["12345"] == "Unknown Error"
    if profile == "t4-x4":
        assert got["ranged"]["mig_by_index_7"] == NVML_ERROR_NOT_SUPPORTED
        assert got["ranged"]["nvlink_state_99"] == NVML_ERROR_NOT_SUPPORTED
        assert got["ranged"]["handle_by_index_99"] == NVML_ERROR_INVALID_ARGUMENT
        return
    assert got["ranged"] == {
        "handle_by_index_99": NVML_ERROR_INVALID_ARGUMENT,
        "mig_by_index_7": NVML_ERROR_INVALID_ARGUMENT,
        "mig_by_index_5": 6,  # NOT_FOUND: an empty MIG slot
        "nvlink_state_99": NVML_ERROR_INVALID_ARGUMENT,
        "nvlink_pci_99": NVML_ERROR_INVALID_ARGUMENT,
        "gi_profile_99": NVML_ERROR_INVALID_ARGUMENT,
        "gi_by_id_99": 6,
        "p2p_index_99": NVML_ERROR_INVALID_ARGUMENT,
        "cpu_affinity_0": NVML_ERROR_INVALID_ARGUMENT,
        "bad_handle": NVML_ERROR_INVALID_ARGUMENT,
        "name_too_short": 7,  # INSUFFICIENT_SIZE
    }


def test_a_symbol_the_shim_lacks_is_function_not_found_in_pynvml(
    shim: Path, tmp_path: Path
) -> None:
    got = probe(
        """
        import json, pynvml as N
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        try:
            N.nvmlDeviceGetConfComputeMemSizeInfo(h)
            print(json.dumps("no error"))
        except N.NVMLError as e:
            print(json.dumps(e.value))
        """,
        nvml.shim_env(NODE, "t4-x1", tmp_path),
    )
    assert got == 13  # NVML_ERROR_FUNCTION_NOT_FOUND


# --------------------------------------------------------------------------- changing MIG
# The calls mig-parted makes (nvmlDeviceSetMigMode → nvmlDeviceCreateGpuInstance →
# nvmlGpuInstanceCreateComputeInstance, and the destroy calls), made by pynvml, one
# subprocess per step: what one process changes, the next must see, because the change
# persists in the node's MIG state file.

A100_40 = "a100-sxm4-40gb-x8"
A100_80_MIG = "a100-80gb-mig-x8"
IN_USE, INSUFFICIENT_RESOURCES, NOT_SUPPORTED, INVALID_ARGUMENT = 19, 23, 3, 2
# GI profile IDs as nvidia-smi shows them on a 40 GB A100 (NVML enum in brackets)
GI_1G_5GB, GI_1G_10GB, GI_3G_20GB, GI_2G_10GB = 19, 15, 9, 14  # [0], [9], [2], [1]

HELPERS = """
    import ctypes, json, pynvml as N

    def err(fn, *a):
        try:
            fn(*a)
            return None
        except N.NVMLError as e:
            return e.value

    def gi_info(h, gi_id):
        for e in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = N.nvmlDeviceGetGpuInstanceProfileInfo(h, e)
            except N.NVMLError:
                continue
            if info.id == gi_id:
                return info
        raise AssertionError(gi_id)

    def instances(h, gi_id):
        arr = (N.c_nvmlGpuInstance_t * 8)()
        n = ctypes.c_uint()
        N.nvmlDeviceGetGpuInstances(h, gi_id, arr, ctypes.byref(n))
        return [arr[i] for i in range(n.value)]

    def migs(h):
        out = []
        for j in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except N.NVMLError_NotFound:
                continue
            out.append({"uuid": N.nvmlDeviceGetUUID(m), "name": N.nvmlDeviceGetName(m),
                        "gi": N.nvmlDeviceGetGpuInstanceId(m),
                        "ci": N.nvmlDeviceGetComputeInstanceId(m),
                        "mem_mib": N.nvmlDeviceGetMemoryInfo(m).total // 2**20})
        return out

    N.nvmlInit()
    gpu = N.nvmlDeviceGetHandleByIndex(0)
"""


def step(code: str, env: dict[str, str]) -> dict:
    return probe(textwrap.dedent(HELPERS) + textwrap.dedent(code), env)  # type: ignore[return-value]


@pytest.fixture
def a100(shim: Path, tmp_path: Path) -> dict[str, str]:
    return nvml.shim_env(NODE, A100_40, tmp_path)


def test_mig_manager_sequence_repartitions_a_gpu_and_the_next_process_sees_it(
    a100: dict[str, str], tmp_path: Path
) -> None:
    # 1. enable MIG mode on GPU 0 (MIG off in the profile)
    got = step(
        """
        before = N.nvmlDeviceGetMigMode(gpu)
        status = N.nvmlDeviceSetMigMode(gpu, N.NVML_DEVICE_MIG_ENABLE)
        print(json.dumps({"before": before, "status": status,
                          "after": N.nvmlDeviceGetMigMode(gpu)}))
        """,
        a100,
    )
    assert got == {"before": [0, 0], "status": 0, "after": [1, 1]}

    # 2. a new process: MIG mode stayed on; four 1g.10gb GPU instances, a fifth does not fit
    got = step(
        f"""
        out = {{"mode": N.nvmlDeviceGetMigMode(gpu), "migs_before": len(migs(gpu))}}
        info = gi_info(gpu, {GI_1G_10GB})
        gis = [N.nvmlDeviceCreateGpuInstance(gpu, info.id) for _ in range(4)]
        out["fifth"] = err(N.nvmlDeviceCreateGpuInstance, gpu, info.id)
        out["remaining"] = N.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, info.id)
        out["remaining_1g5"] = N.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, {GI_1G_5GB})
        out["migs_without_ci"] = len(migs(gpu))
        for gi in gis:
            ci_info = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, N.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
                N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            N.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
        out["second_ci"] = err(N.nvmlGpuInstanceCreateComputeInstance, gis[0], 0)
        out["listed"] = len(instances(gpu, info.id))
        out["placements"] = [[N.nvmlGpuInstanceGetInfo(gi).placement.start,
                              N.nvmlGpuInstanceGetInfo(gi).placement.size] for gi in gis]
        out["migs"] = migs(gpu)
        print(json.dumps(out))
        """,
        a100,
    )
    assert got["mode"] == [1, 1] and got["migs_before"] == 0
    assert got["fifth"] == INSUFFICIENT_RESOURCES
    assert got["remaining"] == 0 and got["remaining_1g5"] == 0  # memory slices all taken
    assert got["migs_without_ci"] == 0  # a GPU instance without its CI is no MIG device
    assert got["second_ci"] == INSUFFICIENT_RESOURCES
    assert got["listed"] == 4
    assert got["placements"] == [[0, 2], [2, 2], [4, 2], [6, 2]]
    created = got["migs"]
    assert [m["gi"] for m in created] == [1, 2, 3, 4]
    assert {m["ci"] for m in created} == {0}
    assert {m["name"] for m in created} == {"NVIDIA A100-SXM4-40GB MIG 1g.10gb"}
    assert {m["mem_mib"] for m in created} == {9856}
    assert len({m["uuid"] for m in created}) == 4
    assert all(m["uuid"].startswith("MIG-") for m in created)

    # 3. a new process (a restarted device plugin) sees the same four MIG devices
    got = step(
        """
        print(json.dumps({"migs": migs(gpu), "other_gpu": N.nvmlDeviceGetMigMode(
            N.nvmlDeviceGetHandleByIndex(1))}))
        """,
        a100,
    )
    assert got["migs"] == created
    assert got["other_gpu"] == [0, 0]  # only GPU 0 changed
    state = (tmp_path / NODE / paths.MIG_STATE_NAME).read_text()
    assert "gpu.0.mig_mode=1" in state and "gpu.0.mig_count=4" in state

    # 4. tear down as mig-parted's ClearMigConfig does, then disable MIG mode
    got = step(
        f"""
        out = {{"mode_while_in_use": err(N.nvmlDeviceSetMigMode, gpu, 0)}}
        gis = instances(gpu, {GI_1G_10GB})
        out["gi_in_use"] = err(N.nvmlGpuInstanceDestroy, gis[0])
        for gi in gis:
            arr = (N.c_nvmlComputeInstance_t * 1)()
            n = ctypes.c_uint()
            N.nvmlGpuInstanceGetComputeInstances(gi, 0, arr, ctypes.byref(n))
            for i in range(n.value):
                N.nvmlComputeInstanceDestroy(arr[i])
            N.nvmlGpuInstanceDestroy(gi)
        out["stale_handle"] = err(N.nvmlGpuInstanceGetInfo, gis[0])
        out["mode"] = N.nvmlDeviceSetMigMode(gpu, 0)
        print(json.dumps(out))
        """,
        a100,
    )
    assert got == {
        "mode_while_in_use": IN_USE,
        "gi_in_use": IN_USE,
        "stale_handle": INVALID_ARGUMENT,
        "mode": 0,
    }
    got = step("print(json.dumps([N.nvmlDeviceGetMigMode(gpu), len(migs(gpu))]))", a100)
    assert got == [[0, 0], 0]


def test_placement_follows_memory_slices(a100: dict[str, str]) -> None:
    got = step(
        f"""
        N.nvmlDeviceSetMigMode(gpu, 1)
        out = {{}}
        two = [N.nvmlDeviceCreateGpuInstance(gpu, {GI_3G_20GB}) for _ in range(2)]
        out["1g5_after_two_3g"] = err(N.nvmlDeviceCreateGpuInstance, gpu, {GI_1G_5GB})
        N.nvmlGpuInstanceDestroy(two[1])
        N.nvmlDeviceCreateGpuInstance(gpu, {GI_2G_10GB})
        out["1g5_fits"] = [err(N.nvmlDeviceCreateGpuInstance, gpu, {GI_1G_5GB}) for _ in range(2)]
        out["full"] = err(N.nvmlDeviceCreateGpuInstance, gpu, {GI_1G_5GB})
        out["unknown_profile"] = err(N.nvmlDeviceCreateGpuInstance, gpu, 12345)
        print(json.dumps(out))
        """,
        a100,
    )
    # 3g.20gb takes 4 of the 8 memory slices: two leave no room for a 1g.5gb, as on a
    # real A100-40GB; 3g.20gb + 2g.10gb + 2x 1g.5gb is a documented layout filling it
    assert got == {
        "1g5_after_two_3g": INSUFFICIENT_RESOURCES,
        "1g5_fits": [None, None],
        "full": INSUFFICIENT_RESOURCES,
        "unknown_profile": INVALID_ARGUMENT,
    }


def test_possible_placements_and_creating_a_gpu_instance_at_one(a100: dict[str, str]) -> None:
    """What HAMi's MIG mode calls: nvmlDeviceGetGpuInstancePossiblePlacements_v2 (an
    A100-40GB's documented starts per profile, in memory slices) and
    nvmlDeviceCreateGpuInstanceWithPlacement at the start the scheduler reserved."""
    got = step(
        f"""
        N.nvmlDeviceSetMigMode(gpu, 1)

        def possible(profile_id):
            n = ctypes.c_uint(0)
            N.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, profile_id, None, ctypes.byref(n))
            arr = (N.c_nvmlGpuInstancePlacement_t * n.value)()
            N.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, profile_id, arr, ctypes.byref(n))
            return [[arr[i].start, arr[i].size] for i in range(n.value)]

        def at(profile_id, start, size):
            place = N.c_nvmlGpuInstancePlacement_t(start, size)
            try:
                gi = N.nvmlDeviceCreateGpuInstanceWithPlacement(
                    gpu, profile_id, ctypes.byref(place))
            except N.NVMLError as e:
                return e.value
            info = N.nvmlGpuInstanceGetInfo(gi)
            return [info.id, info.placement.start, info.placement.size]

        out = {{"possible": {{str(p): possible(p) for p in (19, 14, 9, 5, 0, 15)}}}}
        out["1g_at_6"] = at({GI_1G_5GB}, 6, 1)
        out["3g_at_4"] = at({GI_3G_20GB}, 4, 4)  # overlaps the 1g at 6
        out["3g_at_0"] = at({GI_3G_20GB}, 0, 4)
        out["1g_at_7"] = at({GI_1G_5GB}, 7, 1)  # no compute slice left of 7
        out["1g_at_6_again"] = at({GI_1G_5GB}, 6, 1)
        out["wrong_size"] = at({GI_1G_5GB}, 5, 2)
        print(json.dumps(out))
        """,
        a100,
    )
    assert got["possible"] == {
        "19": [[s, 1] for s in range(7)],  # 1g.5gb
        "14": [[0, 2], [2, 2], [4, 2]],  # 2g.10gb
        "9": [[0, 4], [4, 4]],  # 3g.20gb
        "5": [[0, 4]],  # 4g.20gb
        "0": [[0, 8]],  # 7g.40gb
        "15": [[0, 2], [2, 2], [4, 2], [6, 2]],  # 1g.10gb
    }
    assert got["1g_at_6"] == [1, 6, 1] and got["3g_at_0"] == [2, 0, 4]
    assert got["3g_at_4"] == INSUFFICIENT_RESOURCES
    assert got["1g_at_6_again"] == INSUFFICIENT_RESOURCES
    assert got["1g_at_7"] == got["wrong_size"] == INVALID_ARGUMENT


def test_mig_calls_need_mig_mode_and_a_mig_capable_gpu(shim: Path, tmp_path: Path) -> None:
    got = step(
        f"""
        out = {{"create_mig_off": err(N.nvmlDeviceCreateGpuInstance, gpu, {GI_1G_5GB})}}
        N.nvmlDeviceSetMigMode(gpu, 1)
        gi = N.nvmlDeviceCreateGpuInstance(gpu, {GI_3G_20GB})
        out["smaller_ci"] = err(N.nvmlGpuInstanceCreateComputeInstance, gi, 0)
        print(json.dumps(out))
        """,
        nvml.shim_env(NODE, A100_40, tmp_path),
    )
    # the lab's compute instances are full-size only (one per GPU instance)
    assert got == {"create_mig_off": NOT_SUPPORTED, "smaller_ci": NOT_SUPPORTED}
    got = step(
        "print(json.dumps(err(N.nvmlDeviceSetMigMode, gpu, 1)))",
        nvml.shim_env("t4-node", "t4-x1", tmp_path),
    )
    assert got == NOT_SUPPORTED


def test_a_profile_layout_can_be_replaced(shim: Path, tmp_path: Path) -> None:
    """GPU 0 of the A100-80GB profile starts with 3g.40gb+2g.20gb+1g.10gb+1g.10gb."""
    env = nvml.shim_env(NODE, A100_80_MIG, tmp_path)
    got = step(
        """
        before = [m["name"].split()[-1] for m in migs(gpu)]
        for j in range(7):
            try:
                m = N.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
            except N.NVMLError_NotFound:
                break
            gi = N.nvmlDeviceGetGpuInstanceById(gpu, N.nvmlDeviceGetGpuInstanceId(m))
            N.nvmlComputeInstanceDestroy(N.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
            N.nvmlGpuInstanceDestroy(gi)
        for _ in range(7):
            gi = N.nvmlDeviceCreateGpuInstance(gpu, 19)
            N.nvmlGpuInstanceCreateComputeInstance(gi, 0)
        print(json.dumps({"before": before, "after": [m["name"].split()[-1] for m in migs(gpu)]}))
        """,
        env,
    )
    assert got["before"] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert got["after"] == ["1g.10gb"] * 7
    # re-rendering the profile (a restarted driver pod) keeps the MIG state: it is a file
    # of its own next to the config
    nvml.shim_env(NODE, A100_80_MIG, tmp_path)
    got = step('print(json.dumps([m["name"].split()[-1] for m in migs(gpu)]))', env)
    assert got == ["1g.10gb"] * 7


def test_a_broken_state_file_fails_init_with_its_name(a100: dict[str, str], tmp_path: Path) -> None:
    state = tmp_path / NODE / paths.MIG_STATE_NAME
    state.write_text("version=1\ngpu.0.mig_mode=1\ngpu.0.mig_count=1\ngpu.0.mig.0=MIG-x,99,1,0\n")
    proc = run_python("import pynvml; pynvml.nvmlInit()", a100)
    assert proc.returncode != 0
    assert "NVML_ERROR_UNKNOWN" in proc.stderr or "Unknown Error" in proc.stderr
    assert f"{state}: line 4: bad or unknown entry 'gpu.0.mig.0'" in proc.stderr


def test_state_file_is_replaced_atomically(a100: dict[str, str], tmp_path: Path) -> None:
    step("N.nvmlDeviceSetMigMode(gpu, 1)\nprint(json.dumps(0))", a100)
    node_dir = tmp_path / NODE
    leftovers = [p.name for p in node_dir.iterdir() if p.name.startswith("mig-state.")]
    assert leftovers == []
    lines = (node_dir / paths.MIG_STATE_NAME).read_text().splitlines()
    assert "version=1" in lines
    # every MIG-capable GPU is written, so the file is the whole truth
    assert sum(line.endswith("mig_mode=0") for line in lines) == 7


def test_pynvml_sees_no_mig_device_after_a_ci_is_destroyed(a100: dict[str, str]) -> None:
    got = step(
        f"""
        N.nvmlDeviceSetMigMode(gpu, 1)
        gi = N.nvmlDeviceCreateGpuInstance(gpu, {GI_1G_5GB})
        ci = N.nvmlGpuInstanceCreateComputeInstance(gi, 0)
        uuid = migs(gpu)[0]["uuid"]
        N.nvmlComputeInstanceDestroy(ci)
        print(json.dumps({{"migs": len(migs(gpu)),
                          "by_uuid": err(N.nvmlDeviceGetHandleByUUID, uuid),
                          "gi_left": len(instances(gpu, {GI_1G_5GB}))}}))
        """,
        a100,
    )
    assert got == {"migs": 0, "by_uuid": 6, "gi_left": 1}  # 6: NOT_FOUND


def test_nvidia_smi_lists_the_new_layout(a100: dict[str, str]) -> None:
    step(
        f"""
        N.nvmlDeviceSetMigMode(gpu, 1)
        for _ in range(2):
            N.nvmlGpuInstanceCreateComputeInstance(
                N.nvmlDeviceCreateGpuInstance(gpu, {GI_3G_20GB}), 2)
        print(json.dumps(0))
        """,
        a100,
    )
    smi = Path(sys.executable).parent / "fake-nvidia-smi"
    out = subprocess.run(
        [str(smi), "-L"], env={**os.environ, **a100}, capture_output=True, text=True, check=False
    )
    lines = [line for line in out.stdout.splitlines() if "MIG 3g.20gb" in line]
    assert len(lines) == 2, out.stdout + out.stderr


# ------------------------------------------------------------ NVIDIA_VISIBLE_DEVICES

VISIBLE = """
    import json, pynvml as N
    N.nvmlInit()
    out = []
    for i in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(i)
        migs = []
        if N.nvmlDeviceGetMigMode(h)[0]:
            for k in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    migs.append(N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(h, k)))
                except N.NVMLError_NotFound:
                    break
        out.append([N.nvmlDeviceGetIndex(h), N.nvmlDeviceGetMinorNumber(h),
                    N.nvmlDeviceGetUUID(h), migs])
    print(json.dumps(out))
"""


def test_a_container_sees_only_the_gpus_it_was_given(shim: Path, tmp_path: Path) -> None:
    """NVIDIA_VISIBLE_DEVICES as the container toolkit applies it: listed GPUs renumbered
    from 0 (minor numbers stay), a MIG UUID shows its parent with that MIG device only."""
    env = nvml.shim_env(NODE, "a100-80gb-mig-x8", tmp_path)
    every = probe(VISIBLE, env)
    assert [g[0] for g in every] == list(range(8))
    gpu5, gpu2 = every[5], every[2]
    got = probe(VISIBLE, {**env, "NVIDIA_VISIBLE_DEVICES": f"{gpu5[2]},2"})
    assert got == [[0, 2, gpu2[2], gpu2[3]], [1, 5, gpu5[2], gpu5[3]]]
    mig = every[0][3][1]
    assert probe(VISIBLE, {**env, "NVIDIA_VISIBLE_DEVICES": mig}) == [[0, 0, every[0][2], [mig]]]
    for nothing in ("none", "void", ""):
        assert probe(VISIBLE, {**env, "NVIDIA_VISIBLE_DEVICES": nothing}) == []
    assert probe(VISIBLE, {**env, "NVIDIA_VISIBLE_DEVICES": "all"}) == every


# ------------------------------------------------------------ HAMi-core

HAMI_CORE = """
    import json, pynvml as N
    N.nvmlInit()
    out = []
    for i in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(i)
        m1, m2 = N.nvmlDeviceGetMemoryInfo(h), N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
        out.append({"uuid": N.nvmlDeviceGetUUID(h), "total": m1.total >> 20, "free": m1.free >> 20,
                    "used": m1.used, "total_v2": m2.total >> 20, "free_v2": m2.free >> 20})
    print(json.dumps(out))
"""


def test_hami_cores_memory_limit_is_the_total_a_container_sees(shim: Path, tmp_path: Path) -> None:
    """HAMi-core hooks nvmlDeviceGetMemoryInfo(_v2) only: with the envs HAMi's Allocate sets,
    the limit of the container's i-th GPU is its total (free = total, nothing allocated);
    without them, or with CUDA_DISABLE_CONTROL=true (no libvgpu.so preloaded), the GPU's."""
    env = nvml.shim_env(NODE, "a100-sxm4-40gb-x8", tmp_path)
    whole = probe(HAMI_CORE, env)
    assert {g["total"] for g in whole} == {40960}
    gpu2, gpu5 = whole[2]["uuid"], whole[5]["uuid"]
    hami = {
        **env,
        "NVIDIA_VISIBLE_DEVICES": f"{gpu5},{gpu2}",  # renumbered: gpu2 is index 0
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "2g",
        "CUDA_DEVICE_SM_LIMIT": "30",
    }
    got = probe(HAMI_CORE, hami)
    assert [(g["uuid"], g["total"], g["total_v2"]) for g in got] == [
        (gpu2, 3000, 3000),
        (gpu5, 2048, 2048),
    ]
    assert all(g["free"] == g["total"] == g["free_v2"] and g["used"] == 0 for g in got)
    # CUDA_DEVICE_MEMORY_LIMIT is the fallback for a GPU without its own; 0 is no limit
    fallback = {**hami, "CUDA_DEVICE_MEMORY_LIMIT_1": "0", "CUDA_DEVICE_MEMORY_LIMIT": "1024m"}
    assert [g["total"] for g in probe(HAMI_CORE, fallback)] == [3000, 1024]
    # HAMi's plugin mounts no ld.so.preload for CUDA_DISABLE_CONTROL=true: no HAMi-core
    off = probe(HAMI_CORE, {**hami, "CUDA_DISABLE_CONTROL": "true"})
    assert [g["total"] for g in off] == [40960, 40960]


def test_nvidia_smi_in_a_hami_container_shows_the_limit(shim: Path, tmp_path: Path) -> None:
    env = nvml.shim_env(NODE, "t4-x4", tmp_path)
    uuid = profiles.gpu_uuid(NODE, 1)
    hami = {"NVIDIA_VISIBLE_DEVICES": uuid, "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m"}
    smi = Path(sys.executable).parent / "fake-nvidia-smi"
    out = subprocess.run(
        [str(smi)], env={**os.environ, **env, **hami}, capture_output=True, text=True, check=True
    ).stdout
    assert "0MiB / 3000MiB" in out and "15360MiB" not in out, out
