/* fake-gpu: a libnvidia-ml.so.1 (NVIDIA Management Library) that serves the GPUs of a
 * gpulab profile. Exports the NVML entry points device plugins, GPU feature discovery and
 * MIG managers call; see fake-gpu/README.md for the environment and file formats.
 * Semantics (events, MIG instances, struct layouts) follow nvml.h as NVIDIA/go-nvml
 * v0.13.3 ships it; MIG mode and instances can be changed (mig-parted's calls) and
 * persist in the node's MIG state file. */
#define _GNU_SOURCE
#include <errno.h>
#include <libgen.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "config.h"
#include "faultlog.h"
#include "hamicore.h"
#include "mig.h"
#include "nvml_types.h"

#define NVML_API __attribute__((visibility("default")))

#define POLL_INTERVAL_MS 50
#define EVENT_QUEUE_CAP 128
#define NO_INSTANCE 0xFFFFFFFFu

/* One entry per physical GPU and per MIG slot; a handle is a pointer into g_dev, so
 * handles stay valid for the life of the process, as real NVML's do. */
struct fg_device {
    int present;
    unsigned int gpu;
    int mig; /* -1 for the physical GPU, else the MIG device index on it */
};

struct fg_event_set {
    struct fg_event_set *next;
    unsigned long long mask[FG_MAX_GPUS];
    long offset; /* how far into the fault log this set has read */
    unsigned int head, count;
    nvmlEventData_t queue[EVENT_QUEUE_CAP];
};

/* g_lock guards the refcount, the event sets and the one-time config load. The config is
 * loaded at the first successful init and is read-only afterwards, so device queries
 * read it without the lock. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;
static int g_loaded;
static int g_logged;
static struct fg_config g_cfg;
static char g_log_path[PATH_MAX + 32];
static char g_state_path[PATH_MAX + 32]; /* the node's MIG state file (fg_state_save) */
static struct fg_device g_dev[FG_MAX_GPUS * (1 + FG_MAX_MIG)];
/* Compute instances: one per GPU instance slot (each GPU instance holds at most one
 * compute instance, of its own size). */
static struct fg_device g_ci[FG_MAX_GPUS * FG_MAX_MIG];
/* NVLink wiring: the peer GPU behind each link of each GPU, -1 for an inactive link. */
static int g_link_peer[FG_MAX_GPUS][NVML_NVLINK_MAX_LINKS];
static struct fg_event_set *g_sets;
static int g_hamicore; /* HAMi-core is in this process (fg_hamicore_load at init) */

/* ---------------------------------------------------------------- init */

static void log_once(const char *fmt, const char *a, const char *b)
{
    if (g_logged)
        return;
    g_logged = 1;
    fprintf(stderr, "fake-gpu (libnvidia-ml.so.1): nvmlInit failed: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
}

static struct fg_device *mig_slot(unsigned int gpu, unsigned int mig)
{
    return &g_dev[FG_MAX_GPUS + gpu * FG_MAX_MIG + mig];
}

/* The GPU instance handles (MIG slots of g_dev) and compute instance handles (g_ci) of a
 * GPU follow its instance table: a destroyed instance's handle becomes invalid. */
static void sync_handles(unsigned int gpu)
{
    for (unsigned int j = 0; j < FG_MAX_MIG; j++) {
        const struct fg_mig *m = &g_cfg.gpus[gpu].mig[j];
        *mig_slot(gpu, j) = (struct fg_device){m->present, gpu, (int)j};
        g_ci[gpu * FG_MAX_MIG + j] = (struct fg_device){m->present && m->has_ci, gpu, (int)j};
    }
}

static int is_peer(const struct fg_gpu *g, unsigned int other)
{
    for (unsigned int p = 0; p < g->npeers; p++)
        if (g->peers[p] == other)
            return 1;
    return 0;
}

/* Wire each GPU's links to its NVLink peers so that both ends of a pair count the same
 * number of links (go-gpuallocator scores a pair from either side): every pair of peers
 * gets min(links/peers) of its two GPUs, consecutive links per peer, the rest inactive.
 * An 8-GPU all-to-all board with 12 links per GPU thus has one link per pair. */
static void wire_nvlinks(void)
{
    for (unsigned int i = 0; i < g_cfg.gpu_count; i++) {
        const struct fg_gpu *g = &g_cfg.gpus[i];
        unsigned int link = 0;
        for (unsigned int l = 0; l < NVML_NVLINK_MAX_LINKS; l++)
            g_link_peer[i][l] = -1;
        for (unsigned int p = 0; p < g->npeers; p++) {
            unsigned int j = g->peers[p];
            if (j >= g_cfg.gpu_count || !is_peer(&g_cfg.gpus[j], i))
                continue;
            const struct fg_gpu *o = &g_cfg.gpus[j];
            unsigned int mine = g->nvlinks / g->npeers, theirs = o->nvlinks / o->npeers;
            unsigned int n = mine < theirs ? mine : theirs;
            for (unsigned int k = 0; k < n && link < g->nvlinks && link < NVML_NVLINK_MAX_LINKS;
                 k++)
                g_link_peer[i][link++] = (int)j;
        }
    }
}

/* NVIDIA_VISIBLE_DEVICES, applied as the NVIDIA Container Toolkit applies it to a GPU
 * container: only the listed GPUs (index, GPU UUID) and MIG devices (MIG UUID; its parent
 * GPU shows with only those MIG devices) are enumerated, renumbered from 0. Unset or "all":
 * every GPU (the device plugin and the node's own tools); "none", "void" or empty: none. */
#define FG_MAX_VISIBLE 128
static int g_vis_all = 1;
static unsigned int g_vis_n;
static char g_vis[FG_MAX_VISIBLE][FG_STR];

static void load_visible(void)
{
    const char *env = getenv("NVIDIA_VISIBLE_DEVICES");
    g_vis_all = !env || !strcmp(env, "all");
    g_vis_n = 0;
    if (g_vis_all || !strcmp(env, "none") || !strcmp(env, "void"))
        return;
    const char *p = env;
    while (*p && g_vis_n < FG_MAX_VISIBLE) {
        size_t len = strcspn(p, ",");
        if (len > 0 && len < FG_STR) {
            memcpy(g_vis[g_vis_n], p, len);
            g_vis[g_vis_n++][len] = 0;
        }
        p += len + (p[len] == ',');
    }
}

static int listed(const char *id)
{
    for (unsigned int k = 0; k < g_vis_n; k++)
        if (!strcasecmp(g_vis[k], id))
            return 1;
    return 0;
}

/* A whole GPU is listed (by index or UUID): all of it is visible, MIG devices included. */
static int gpu_listed(unsigned int i)
{
    char index[16];
    snprintf(index, sizeof index, "%u", i);
    return g_vis_all || listed(index) || listed(g_cfg.gpus[i].uuid);
}

static int mig_visible(unsigned int i, unsigned int j)
{
    return gpu_listed(i) || listed(g_cfg.gpus[i].mig[j].uuid);
}

static int gpu_visible(unsigned int i)
{
    if (gpu_listed(i))
        return 1;
    for (unsigned int j = 0; j < FG_MAX_MIG; j++)
        if (g_cfg.gpus[i].mig[j].present && mig_visible(i, j))
            return 1;
    return 0;
}

/* The physical index of the n-th visible GPU, or -1. */
static int visible_gpu(unsigned int n)
{
    for (unsigned int i = 0; i < g_cfg.gpu_count; i++)
        if (gpu_visible(i) && n-- == 0)
            return (int)i;
    return -1;
}

static nvmlReturn_t load_config(void)
{
    const char *path = getenv("FAKE_GPU_CONFIG");
    if (!path || !*path) {
        log_once("%s%s", "FAKE_GPU_CONFIG is not set; point it at a file written by "
                         "`gpulab fake-gpu render`",
                 "");
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    char err[256];
    if (fg_config_load(path, &g_cfg, err, sizeof err) != 0) {
        int missing = !strncmp(err, "cannot open", 11);
        char where[PATH_MAX + 64];
        snprintf(where, sizeof where, "FAKE_GPU_CONFIG=%s: ", path);
        log_once("%s%s", where, err);
        return missing ? NVML_ERROR_LIBRARY_NOT_FOUND : NVML_ERROR_UNKNOWN;
    }
    char dir[PATH_MAX];
    const char *state = getenv("FAKE_GPU_STATE_DIR");
    if (state && *state) {
        snprintf(dir, sizeof dir, "%s", state);
    } else if (g_cfg.state_dir[0]) {
        snprintf(dir, sizeof dir, "%s", g_cfg.state_dir);
    } else {
        char copy[PATH_MAX];
        snprintf(copy, sizeof copy, "%s", path);
        snprintf(dir, sizeof dir, "%s", dirname(copy));
    }
    snprintf(g_log_path, sizeof g_log_path, "%s/faults.log", dir);
    snprintf(g_state_path, sizeof g_state_path, "%s/mig-state", dir);
    /* MIG changes made through this library by earlier processes (mig-parted, the MIG
     * manager) persist in the state file, as the driver keeps them across processes */
    if (fg_state_load(g_state_path, &g_cfg, err, sizeof err) < 0) {
        log_once("%s%s", "MIG state: ", err);
        return NVML_ERROR_UNKNOWN;
    }
    memset(g_dev, 0, sizeof g_dev);
    memset(g_ci, 0, sizeof g_ci);
    for (unsigned int i = 0; i < g_cfg.gpu_count; i++) {
        g_dev[i] = (struct fg_device){1, i, -1};
        sync_handles(i);
    }
    wire_nvlinks();
    load_visible();
    g_hamicore = fg_hamicore_load();
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS / NO_ATTACH change nothing for simulated GPUs */
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (!g_loaded) {
        rc = load_config();
        g_loaded = rc == NVML_SUCCESS;
    }
    if (rc == NVML_SUCCESS)
        __atomic_add_fetch(&g_refcount, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

NVML_API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
NVML_API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

NVML_API nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        __atomic_sub_fetch(&g_refcount, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

static int initialized(void) { return __atomic_load_n(&g_refcount, __ATOMIC_SEQ_CST) > 0; }

NVML_API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ---------------------------------------------------------------- helpers */

static nvmlReturn_t put_str(char *buf, unsigned int len, const char *value)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* Resolve a handle: NULL, foreign pointers and empty slots are invalid arguments. */
static nvmlReturn_t lookup(nvmlDevice_t h, struct fg_device **out)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    uintptr_t p = (uintptr_t)h, base = (uintptr_t)g_dev;
    if (p < base || p >= base + sizeof g_dev || (p - base) % sizeof(struct fg_device))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!h->present)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = h;
    return NVML_SUCCESS;
}

/* Most queries need a device and a non-NULL out pointer. */
#define DEVICE(h, d, outp)                                                                    \
    struct fg_device *d;                                                                       \
    do {                                                                                       \
        nvmlReturn_t rc_ = lookup(h, &d);                                                      \
        if (rc_ != NVML_SUCCESS)                                                               \
            return rc_;                                                                        \
        if (!(outp))                                                                           \
            return NVML_ERROR_INVALID_ARGUMENT;                                                \
    } while (0)

static const struct fg_gpu *gpu_of(const struct fg_device *d) { return &g_cfg.gpus[d->gpu]; }

static const struct fg_mig *mig_of(const struct fg_device *d)
{
    return &g_cfg.gpus[d->gpu].mig[d->mig];
}

static const struct fg_gi_profile *mig_profile(const struct fg_device *d)
{
    return &gpu_of(d)->gi[mig_of(d)->profile];
}

/* ---------------------------------------------------------------- system */

NVML_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    return put_str(version, length, g_cfg.driver_version);
}

NVML_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    return put_str(version, length, g_cfg.nvml_version);
}

NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = g_cfg.cuda_driver_version;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---------------------------------------------------------------- enumeration */

NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    for (unsigned int i = 0; i < g_cfg.gpu_count; i++)
        n += (unsigned int)gpu_visible(i);
    *deviceCount = n;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    int i = device ? visible_gpu(index) : -1;
    if (i < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_dev[i];
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < g_cfg.gpu_count; i++) {
        const struct fg_gpu *g = &g_cfg.gpus[i];
        if (!gpu_visible(i))
            continue;
        if (!strcasecmp(uuid, g->uuid)) {
            *device = &g_dev[i];
            return NVML_SUCCESS;
        }
        for (unsigned int j = 0; j < FG_MAX_MIG; j++) {
            if (g->mig[j].present && g->mig[j].has_ci && mig_visible(i, j) &&
                !strcasecmp(uuid, g->mig[j].uuid)) {
                *device = mig_slot(i, j);
                return NVML_SUCCESS;
            }
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* Accepts "domain:bus:device.function" with a 4- or 8-digit domain, any case. */
NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    unsigned int dom, bus, dev, fn;
    int n = 0;
    if (!pciBusId || !device ||
        sscanf(pciBusId, "%x:%x:%x.%x%n", &dom, &bus, &dev, &fn, &n) != 4 || pciBusId[n])
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < g_cfg.gpu_count; i++) {
        const struct fg_gpu *g = &g_cfg.gpus[i];
        if (g->domain == dom && g->bus == bus && g->device == dev && fn == 0 && gpu_visible(i)) {
            *device = &g_dev[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* ---------------------------------------------------------------- identity */

NVML_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    DEVICE(device, d, name);
    if (d->mig < 0)
        return put_str(name, length, gpu_of(d)->name);
    char buf[FG_STR + 48];
    snprintf(buf, sizeof buf, "%s MIG %s", gpu_of(d)->name, mig_profile(d)->name);
    return put_str(name, length, buf);
}

NVML_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    DEVICE(device, d, uuid);
    return put_str(uuid, length, d->mig < 0 ? gpu_of(d)->uuid : mig_of(d)->uuid);
}

NVML_API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    DEVICE(device, d, serial);
    if (!gpu_of(d)->serial[0])
        return NVML_ERROR_NOT_SUPPORTED;
    return put_str(serial, length, gpu_of(d)->serial);
}

NVML_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    DEVICE(device, d, minorNumber);
    if (d->mig >= 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *minorNumber = d->gpu;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    DEVICE(device, d, index);
    if (d->mig >= 0)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int n = 0; /* its place among the visible GPUs */
    for (unsigned int i = 0; i < d->gpu; i++)
        n += (unsigned int)gpu_visible(i);
    *index = n;
    return NVML_SUCCESS;
}

static void fill_pci(const struct fg_gpu *g, nvmlPciInfo_t *pci, int legacy)
{
    /* v1/v2 callers pass the older, shorter struct: only its prefix may be written */
    size_t size = legacy ? offsetof(nvmlPciInfo_t, busId) + 16 : sizeof *pci;
    nvmlPciInfo_t tmp;
    memset(&tmp, 0, sizeof tmp);
    snprintf(tmp.busIdLegacy, sizeof tmp.busIdLegacy, "%04X:%02X:%02X.0", g->domain & 0xFFFF,
             g->bus, g->device);
    tmp.domain = g->domain;
    tmp.bus = g->bus;
    tmp.device = g->device;
    tmp.pciDeviceId = g->pci_device_id;
    tmp.pciSubSystemId = g->pci_subsystem_id;
    if (!legacy)
        snprintf(tmp.busId, sizeof tmp.busId, "%s", g->bus_id);
    memcpy(pci, &tmp, size);
}

NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEVICE(device, d, pci);
    fill_pci(gpu_of(d), pci, 0);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEVICE(device, d, pci);
    fill_pci(gpu_of(d), pci, 1);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v2(device, pci);
}

NVML_API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, unsigned int *type)
{
    DEVICE(device, d, type);
    *type = gpu_of(d)->brand;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    DEVICE(device, d, arch);
    *arch = gpu_of(d)->architecture;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major,
                                                          int *minor)
{
    DEVICE(device, d, major && minor);
    *major = gpu_of(d)->cc_major;
    *minor = gpu_of(d)->cc_minor;
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- memory */

static unsigned long long total_bytes(const struct fg_device *d)
{
    unsigned long long mib = d->mig < 0 ? gpu_of(d)->memory_mib : mig_profile(d)->memory_mib;
    return mib * 1024ULL * 1024ULL;
}

NVML_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);

/* HAMi-core's _nvmlDeviceGetMemoryInfo after the real call: the CUDA device of the GPU's
 * index (nvml_to_cuda_map: the identity in an NVML-only process; none past the count);
 * with a limit, total = limit, free = limit - usage, used = usage; without one, used =
 * usage. usage is what the container's own CUDA allocations hold: nothing here. */
static nvmlReturn_t hamicore_memory(nvmlDevice_t device, unsigned long long *total,
                                    unsigned long long *free, unsigned long long *used)
{
    unsigned int index, count;
    nvmlReturn_t rc = nvmlDeviceGetIndex(device, &index); /* fails for a MIG handle */
    if (rc != NVML_SUCCESS)
        return rc;
    rc = nvmlDeviceGetCount_v2(&count);
    if (rc != NVML_SUCCESS)
        return rc;
    if (index >= count)
        return NVML_SUCCESS;
    const unsigned long long usage = 0, limit = fg_hamicore_limit(index);
    if (limit) {
        *free = limit - usage;
        *total = limit;
    }
    *used = usage;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    if (g_hamicore && !memory)
        return NVML_SUCCESS; /* HAMi-core answers a NULL pointer before calling NVML */
    DEVICE(device, d, memory);
    memory->total = total_bytes(d);
    memory->free = memory->total;
    memory->used = 0;
    if (g_hamicore)
        return hamicore_memory(device, &memory->total, &memory->free, &memory->used);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    if (g_hamicore && !memory)
        return NVML_SUCCESS;
    DEVICE(device, d, memory);
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = total_bytes(d);
    memory->reserved = 0;
    memory->free = memory->total;
    memory->used = 0;
    if (g_hamicore)
        return hamicore_memory(device, &memory->total, &memory->free, &memory->used);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- topology */

NVML_API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    DEVICE(device, d, node);
    *node = (unsigned int)gpu_of(d)->numa_node;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                                unsigned long *cpuSet)
{
    DEVICE(device, d, cpuSet);
    if (cpuSetSize == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fg_gpu *g = gpu_of(d);
    const unsigned int bits = 8 * sizeof(unsigned long);
    memset(cpuSet, 0, cpuSetSize * sizeof(unsigned long));
    for (unsigned int c = g->cpu_first; c < g->cpu_first + g->cpu_count; c++)
        if (c / bits < cpuSetSize)
            cpuSet[c / bits] |= 1UL << (c % bits);
    return NVML_SUCCESS;
}

/* PCIe topology only (NVLink is reported separately): the same GPU is INTERNAL, GPUs
 * on one NUMA node meet at its CPU (NODE), others cross the socket link (SYSTEM). */
NVML_API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1,
                                                           nvmlDevice_t device2,
                                                           unsigned int *pathInfo)
{
    DEVICE(device1, a, pathInfo);
    struct fg_device *b;
    nvmlReturn_t rc = lookup(device2, &b);
    if (rc != NVML_SUCCESS)
        return rc;
    if (a->gpu == b->gpu)
        *pathInfo = NVML_TOPOLOGY_INTERNAL;
    else if (gpu_of(a)->numa_node == gpu_of(b)->numa_node)
        *pathInfo = NVML_TOPOLOGY_NODE;
    else
        *pathInfo = NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
                                              unsigned int p2pIndex, unsigned int *p2pStatus)
{
    DEVICE(device1, a, p2pStatus);
    struct fg_device *b;
    nvmlReturn_t rc = lookup(device2, &b);
    if (rc != NVML_SUCCESS)
        return rc;
    if (p2pIndex > NVML_P2P_CAPS_INDEX_PROP)
        return NVML_ERROR_INVALID_ARGUMENT;
    int linked = is_peer(gpu_of(a), b->gpu);
    int same_node = gpu_of(a)->numa_node == gpu_of(b)->numa_node;
    if (p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK)
        *p2pStatus = linked ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    else
        *p2pStatus = (linked || same_node || a->gpu == b->gpu)
                         ? NVML_P2P_STATUS_OK
                         : NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* Links are wired to peers by wire_nvlinks(): a link with no peer is inactive. */
static nvmlReturn_t nvlink_check(const struct fg_device *d, unsigned int link)
{
    const struct fg_gpu *g = gpu_of(d);
    if (d->mig >= 0 || g->nvlinks == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= g->nvlinks)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                                unsigned int *isActive)
{
    DEVICE(device, d, isActive);
    nvmlReturn_t rc = nvlink_check(d, link);
    if (rc != NVML_SUCCESS)
        return rc;
    *isActive = g_link_peer[d->gpu][link] >= 0;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                           nvmlPciInfo_t *pci)
{
    DEVICE(device, d, pci);
    nvmlReturn_t rc = nvlink_check(d, link);
    if (rc != NVML_SUCCESS)
        return rc;
    int peer = g_link_peer[d->gpu][link];
    if (peer < 0)
        return NVML_ERROR_NOT_SUPPORTED; /* link not trained */
    fill_pci(&g_cfg.gpus[peer], pci, 0);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link,
                                                        nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

/* ---------------------------------------------------------------- MIG */

NVML_API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                            unsigned int *pendingMode)
{
    DEVICE(device, d, currentMode && pendingMode);
    if (d->mig >= 0 || !gpu_of(d)->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = *pendingMode = (unsigned int)gpu_of(d)->mig_mode;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    DEVICE(device, d, count);
    if (d->mig >= 0 || !gpu_of(d)->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    *count = FG_MAX_MIG;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                           nvmlDevice_t *migDevice)
{
    DEVICE(device, d, migDevice);
    if (d->mig >= 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu_of(d)->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    if (index >= FG_MAX_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* MIG devices (GPU instances with their compute instance) in slot order */
    unsigned int n = 0;
    for (unsigned int j = 0; j < FG_MAX_MIG; j++) {
        const struct fg_mig *m = &gpu_of(d)->mig[j];
        if (m->present && m->has_ci && mig_visible(d->gpu, j) && n++ == index) {
            *migDevice = mig_slot(d->gpu, j);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                    nvmlDevice_t *device)
{
    DEVICE(migDevice, d, device);
    if (d->mig < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *device = &g_dev[d->gpu];
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    DEVICE(device, d, isMigDevice);
    *isMigDevice = d->mig >= 0;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    DEVICE(device, d, id);
    if (d->mig < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = mig_of(d)->gi_id;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    DEVICE(device, d, id);
    if (d->mig < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = mig_of(d)->ci_id;
    return NVML_SUCCESS;
}

static nvmlReturn_t gi_profile(nvmlDevice_t device, unsigned int profile,
                               const struct fg_gi_profile **out)
{
    struct fg_device *d;
    nvmlReturn_t rc = lookup(device, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (d->mig >= 0 || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu_of(d)->mig_capable || !gpu_of(d)->gi[profile].present)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = &gpu_of(d)->gi[profile];
    return NVML_SUCCESS;
}

#define FILL_GI_INFO(info, p)                                                                  \
    do {                                                                                       \
        (info)->id = (p)->id;                                                                  \
        (info)->isP2pSupported = 0;                                                            \
        (info)->sliceCount = (p)->slices;                                                      \
        (info)->instanceCount = (p)->instances;                                                \
        (info)->multiprocessorCount = (p)->sms;                                                \
        (info)->copyEngineCount = (p)->slices;                                                 \
        (info)->decoderCount = (p)->slices / 2;                                                \
        (info)->encoderCount = 0;                                                              \
        (info)->jpegCount = (p)->slices == 7 ? 1 : 0;                                          \
        (info)->ofaCount = (p)->slices == 7 ? 1 : 0;                                           \
        (info)->memorySizeMB = (p)->memory_mib;                                                \
    } while (0)

NVML_API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device,
                                                           unsigned int profile,
                                                           nvmlGpuInstanceProfileInfo_t *info)
{
    const struct fg_gi_profile *p;
    nvmlReturn_t rc = gi_profile(device, profile, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    FILL_GI_INFO(info, p);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device,
                                                            unsigned int profile,
                                                            nvmlGpuInstanceProfileInfo_v2_t *info)
{
    const struct fg_gi_profile *p;
    nvmlReturn_t rc = gi_profile(device, profile, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    FILL_GI_INFO(info, p);
    snprintf(info->name, sizeof info->name, "MIG %s", p->name);
    return NVML_SUCCESS;
}

/* A GPU instance is represented by the MIG device that lives in it (one compute instance
 * per GPU instance, as the profiles define them). */
NVML_API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                    nvmlGpuInstance_t *gpuInstance)
{
    DEVICE(device, d, gpuInstance);
    if (d->mig >= 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu_of(d)->mig_capable || !gpu_of(d)->mig_mode)
        return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned int j = 0; j < FG_MAX_MIG; j++) {
        if (gpu_of(d)->mig[j].present && gpu_of(d)->mig[j].gi_id == id) {
            *gpuInstance = mig_slot(d->gpu, j);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance,
                                             nvmlGpuInstanceInfo_t *info)
{
    DEVICE(gpuInstance, d, info);
    if (d->mig < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &g_dev[d->gpu];
    info->id = mig_of(d)->gi_id;
    info->profileId = mig_profile(d)->id;
    info->placement.start = mig_of(d)->start;
    info->placement.size = fg_mem_slices(gpu_of(d), mig_of(d)->profile);
    return NVML_SUCCESS;
}

/* Compute instances. Each GPU instance holds at most one compute instance, of its full
 * size (CI ID 0), as `nvidia-smi mig -cgi ... -C` creates them; go-nvlib's MIG profile
 * lookup walks GPU instance -> compute instance -> CI profiles to name it. */

/* NVML_COMPUTE_INSTANCE_PROFILE_* by compute slices (0: no such profile) */
static unsigned int ci_profile_slices(unsigned int profile)
{
    static const unsigned int slices[NVML_COMPUTE_INSTANCE_PROFILE_COUNT] = {1, 2, 3, 4, 7,
                                                                             8, 6, 0, 0};
    return profile < NVML_COMPUTE_INSTANCE_PROFILE_COUNT ? slices[profile] : 0;
}

static unsigned int ci_profile_of_slices(unsigned int slices)
{
    for (unsigned int p = 0; p < NVML_COMPUTE_INSTANCE_PROFILE_COUNT; p++)
        if (ci_profile_slices(p) == slices)
            return p;
    return 0;
}

/* The GPU instance a GI handle stands for (a MIG slot of g_dev). */
static nvmlReturn_t lookup_gi(nvmlGpuInstance_t gi, struct fg_device **out)
{
    nvmlReturn_t rc = lookup(gi, out);
    if (rc != NVML_SUCCESS)
        return rc;
    return (*out)->mig < 0 ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

static nvmlReturn_t lookup_ci(nvmlComputeInstance_t ci, struct fg_device **out)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    uintptr_t p = (uintptr_t)ci, base = (uintptr_t)g_ci;
    if (p < base || p >= base + sizeof g_ci || (p - base) % sizeof(struct fg_device) ||
        !ci->present)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = ci;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance,
                                                            unsigned int id,
                                                            nvmlComputeInstance_t *computeInstance)
{
    struct fg_device *d;
    nvmlReturn_t rc = lookup_gi(gpuInstance, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!computeInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_of(d)->has_ci || id != mig_of(d)->ci_id)
        return NVML_ERROR_NOT_FOUND;
    *computeInstance = &g_ci[d->gpu * FG_MAX_MIG + (unsigned int)d->mig];
    return NVML_SUCCESS;
}

static void fill_ci_info(const struct fg_device *d, nvmlComputeInstanceInfo_t *info)
{
    const struct fg_gi_profile *p = mig_profile(d);
    info->device = &g_dev[d->gpu];
    info->gpuInstance = mig_slot(d->gpu, (unsigned int)d->mig);
    info->id = mig_of(d)->ci_id;
    info->profileId = ci_profile_of_slices(p->slices);
    info->placement.start = 0;
    info->placement.size = p->slices;
}

NVML_API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                    nvmlComputeInstanceInfo_t *info)
{
    struct fg_device *d;
    nvmlReturn_t rc = lookup_ci(computeInstance, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    fill_ci_info(d, info);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                                 nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}

/* CI profile `profile` inside the GPU instance: supported when it fits in the GI's slices
 * (a 3g GI offers 1c x3, 2c x1, 3c x1); engines are shared by the GI's CIs. */
static nvmlReturn_t ci_profile(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                               unsigned int engProfile, nvmlComputeInstanceProfileInfo_t *out)
{
    struct fg_device *d;
    nvmlReturn_t rc = lookup_gi(gpuInstance, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT ||
        engProfile >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fg_gi_profile *gi = mig_profile(d);
    unsigned int slices = ci_profile_slices(profile);
    if (!slices || slices > gi->slices || profile == NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE ||
        profile == NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE)
        return NVML_ERROR_NOT_SUPPORTED; /* 6- and 8-slice CIs are Blackwell's */
    out->id = profile;
    out->sliceCount = slices;
    out->instanceCount = gi->slices / slices;
    out->multiprocessorCount = gi->sms / gi->slices * slices;
    out->sharedCopyEngineCount = gi->slices;
    out->sharedDecoderCount = gi->slices / 2;
    out->sharedEncoderCount = 0;
    out->sharedJpegCount = gi->slices == 7 ? 1 : 0;
    out->sharedOfaCount = gi->slices == 7 ? 1 : 0;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    return ci_profile(gpuInstance, profile, engProfile, info);
}

NVML_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_v2_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlComputeInstanceProfileInfo_v2 &&
        info->version != nvmlComputeInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlComputeInstanceProfileInfo_t v1;
    nvmlReturn_t rc = ci_profile(gpuInstance, profile, engProfile, &v1);
    if (rc != NVML_SUCCESS)
        return rc;
    info->id = v1.id;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->sharedCopyEngineCount = v1.sharedCopyEngineCount;
    info->sharedDecoderCount = v1.sharedDecoderCount;
    info->sharedEncoderCount = v1.sharedEncoderCount;
    info->sharedJpegCount = v1.sharedJpegCount;
    info->sharedOfaCount = v1.sharedOfaCount;
    snprintf(info->name, sizeof info->name, "MIG %uc.%ug", v1.sliceCount,
             mig_profile(gpuInstance)->slices);
    if (info->version == nvmlComputeInstanceProfileInfo_v3)
        ((nvmlComputeInstanceProfileInfo_v3_t *)info)->capabilities = 0;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                                 nvmlDeviceAttributes_t *attributes)
{
    DEVICE(device, d, attributes);
    if (d->mig < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    const struct fg_gi_profile *p = mig_profile(d);
    memset(attributes, 0, sizeof *attributes);
    attributes->multiprocessorCount = p->sms;
    attributes->sharedCopyEngineCount = p->slices;
    attributes->sharedDecoderCount = p->slices / 2;
    attributes->gpuInstanceSliceCount = p->slices;
    attributes->computeInstanceSliceCount = p->slices;
    attributes->memorySizeMB = p->memory_mib;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device,
                                              nvmlDeviceAttributes_t *attributes)
{
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

/* ---------------------------------------------------------------- changing MIG
 * What mig-parted and the MIG manager call: MIG mode, then GPU instances, then a compute
 * instance in each. Changes apply at once (the fake driver needs no GPU reset) and are
 * written to the node's MIG state file, which every process reads at nvmlInit: a process
 * sees what another one changed when it starts (GPU clients are stopped across a MIG
 * change anyway). */

/* Caller holds g_lock: persist the GPU's new table, or undo the change from `before`. */
static nvmlReturn_t commit(unsigned int gpu, const struct fg_gpu *before)
{
    if (fg_state_save(g_state_path, &g_cfg) != 0) {
        g_cfg.gpus[gpu] = *before;
        return NVML_ERROR_UNKNOWN;
    }
    sync_handles(gpu);
    return NVML_SUCCESS;
}

static int any_instance(const struct fg_gpu *g)
{
    for (unsigned int j = 0; j < FG_MAX_MIG; j++)
        if (g->mig[j].present)
            return 1;
    return 0;
}

NVML_API nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                           nvmlReturn_t *activationStatus)
{
    DEVICE(device, d, activationStatus);
    if (d->mig >= 0 || mode > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fg_gpu *g = &g_cfg.gpus[d->gpu];
    if (!g->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = NVML_ERROR_IN_USE; /* GPU instances must be destroyed first */
    if (!any_instance(g)) {
        struct fg_gpu before = *g;
        g->mig_mode = (int)mode;
        rc = commit(d->gpu, &before);
    }
    pthread_mutex_unlock(&g_lock);
    if (rc == NVML_SUCCESS)
        *activationStatus = NVML_SUCCESS; /* no reset pending */
    return rc;
}

/* The NVML_GPU_INSTANCE_PROFILE_* slot of a GI profile ID (19 for 1g.5gb ...), or -1. */
static int gi_enum_of_id(const struct fg_gpu *g, unsigned int id)
{
    for (int e = 0; e < NVML_GPU_INSTANCE_PROFILE_COUNT; e++)
        if (g->gi[e].present && g->gi[e].id == id)
            return e;
    return -1;
}

/* The GPU a GPU-instance call addresses: a MIG-capable GPU in MIG mode, and the profile. */
static nvmlReturn_t mig_target(nvmlDevice_t device, unsigned int profileId, struct fg_device **d,
                               int *profile)
{
    nvmlReturn_t rc = lookup(device, d);
    if (rc != NVML_SUCCESS)
        return rc;
    if ((*d)->mig >= 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fg_gpu *g = gpu_of(*d);
    if (!g->mig_capable || !g->mig_mode)
        return NVML_ERROR_NOT_SUPPORTED;
    *profile = gi_enum_of_id(g, profileId);
    return *profile < 0 ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

static int possible(const struct fg_gpu *g, unsigned int profile,
                    const nvmlGpuInstancePlacement_t *placement)
{
    unsigned int starts[FG_MEMORY_SLICES];
    unsigned int n = fg_mig_placements(g, profile, starts, FG_MEMORY_SLICES);
    for (unsigned int i = 0; i < n; i++)
        if (starts[i] == placement->start && placement->size == fg_mem_slices(g, profile))
            return 1;
    return 0;
}

/* A GPU instance of profileId at `placement` (one of its possible placements, which must
 * be free), or at the first place it fits when `placement` is NULL. */
static nvmlReturn_t create_gpu_instance(nvmlDevice_t device, unsigned int profileId,
                                        const nvmlGpuInstancePlacement_t *placement,
                                        nvmlGpuInstance_t *gpuInstance)
{
    struct fg_device *d;
    int profile;
    if (!gpuInstance)
        return initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t rc = mig_target(device, profileId, &d, &profile);
    if (rc != NVML_SUCCESS)
        return rc;
    struct fg_gpu *g = &g_cfg.gpus[d->gpu];
    if (placement && !possible(g, (unsigned int)profile, placement))
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    unsigned int start, slot = FG_MAX_MIG, id = 1;
    for (unsigned int j = FG_MAX_MIG; j-- > 0;)
        if (!g->mig[j].present)
            slot = j;
    for (int taken = 1; taken;) { /* the lowest free GPU instance ID */
        taken = 0;
        for (unsigned int j = 0; j < FG_MAX_MIG; j++)
            if (g->mig[j].present && g->mig[j].gi_id == id)
                taken = 1;
        id += taken;
    }
    rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    int fit = placement ? fg_mig_fit_at(g, (unsigned int)profile, start = placement->start)
                        : fg_mig_fit(g, (unsigned int)profile, &start);
    if (slot < FG_MAX_MIG && fit == 0) {
        struct fg_gpu before = *g;
        g->mig[slot] = (struct fg_mig){.present = 1, .has_start = 1, .profile = (unsigned int)profile,
                                       .gi_id = id, .start = start};
        rc = commit(d->gpu, &before);
    }
    pthread_mutex_unlock(&g_lock);
    if (rc == NVML_SUCCESS)
        *gpuInstance = mig_slot(d->gpu, slot);
    return rc;
}

NVML_API nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                                  nvmlGpuInstance_t *gpuInstance)
{
    return create_gpu_instance(device, profileId, NULL, gpuInstance);
}

/* INSUFFICIENT_RESOURCES when that place is taken (or the profile's count or the compute
 * slices are used up), INVALID_ARGUMENT for a place the profile cannot have. */
NVML_API nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t *placement,
    nvmlGpuInstance_t *gpuInstance)
{
    if (!placement)
        return initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    return create_gpu_instance(device, profileId, placement, gpuInstance);
}

/* Every place an instance of the profile can have, whatever is there now (mig.h); with
 * placements NULL only the count, as nvml.h describes. */
NVML_API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,
    unsigned int *count)
{
    struct fg_device *d;
    int profile;
    if (!count)
        return initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t rc = mig_target(device, profileId, &d, &profile);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct fg_gpu *g = gpu_of(d);
    unsigned int starts[FG_MEMORY_SLICES];
    unsigned int n = fg_mig_placements(g, (unsigned int)profile, starts, FG_MEMORY_SLICES);
    if (!placements) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++)
        placements[i] = (nvmlGpuInstancePlacement_t){starts[i], fg_mem_slices(g, (unsigned int)profile)};
    *count = n;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                                nvmlGpuInstance_t *gpuInstances,
                                                unsigned int *count)
{
    struct fg_device *d;
    int profile;
    if (!gpuInstances || !count)
        return initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t rc = mig_target(device, profileId, &d, &profile);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned int n = 0;
    pthread_mutex_lock(&g_lock);
    for (unsigned int j = 0; j < FG_MAX_MIG; j++) {
        const struct fg_mig *m = &gpu_of(d)->mig[j];
        if (m->present && m->profile == (unsigned int)profile)
            gpuInstances[n++] = mig_slot(d->gpu, j);
    }
    pthread_mutex_unlock(&g_lock);
    *count = n;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device,
                                                                unsigned int profileId,
                                                                unsigned int *count)
{
    struct fg_device *d;
    int profile;
    if (!count)
        return initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t rc = mig_target(device, profileId, &d, &profile);
    if (rc != NVML_SUCCESS)
        return rc;
    pthread_mutex_lock(&g_lock);
    *count = fg_mig_capacity(gpu_of(d), (unsigned int)profile);
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

/* In use while its compute instance exists (NVML: "compute instances are active"). */
NVML_API nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance)
{
    struct fg_device *d;
    nvmlReturn_t rc = lookup_gi(gpuInstance, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    struct fg_gpu *g = &g_cfg.gpus[d->gpu];
    pthread_mutex_lock(&g_lock);
    rc = NVML_ERROR_IN_USE;
    if (!g->mig[d->mig].has_ci) {
        struct fg_gpu before = *g;
        memset(&g->mig[d->mig], 0, sizeof g->mig[d->mig]);
        rc = commit(d->gpu, &before);
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* Only a compute instance of the GPU instance's own size, one per GPU instance. */
NVML_API nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance,
                                                           unsigned int profileId,
                                                           nvmlComputeInstance_t *computeInstance)
{
    struct fg_device *d;
    nvmlReturn_t rc = lookup_gi(gpuInstance, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!computeInstance || profileId >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (ci_profile_slices(profileId) != mig_profile(d)->slices)
        return NVML_ERROR_NOT_SUPPORTED;
    struct fg_gpu *g = &g_cfg.gpus[d->gpu];
    struct fg_mig *m = &g->mig[d->mig];
    pthread_mutex_lock(&g_lock);
    rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (!m->has_ci) {
        struct fg_gpu before = *g;
        m->has_ci = 1;
        m->ci_id = 0;
        fg_mig_uuid(g, m->profile, m->gi_id, m->ci_id, m->uuid, sizeof m->uuid);
        rc = commit(d->gpu, &before);
    }
    pthread_mutex_unlock(&g_lock);
    if (rc == NVML_SUCCESS)
        *computeInstance = &g_ci[d->gpu * FG_MAX_MIG + (unsigned int)d->mig];
    return rc;
}

NVML_API nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                         unsigned int profileId,
                                                         nvmlComputeInstance_t *computeInstances,
                                                         unsigned int *count)
{
    struct fg_device *d;
    nvmlReturn_t rc = lookup_gi(gpuInstance, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!computeInstances || !count || profileId >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    if (mig_of(d)->has_ci && ci_profile_slices(profileId) == mig_profile(d)->slices)
        computeInstances[n++] = &g_ci[d->gpu * FG_MAX_MIG + (unsigned int)d->mig];
    *count = n;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    struct fg_device *d;
    nvmlReturn_t rc = lookup_ci(computeInstance, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    struct fg_gpu *g = &g_cfg.gpus[d->gpu];
    pthread_mutex_lock(&g_lock);
    struct fg_gpu before = *g;
    g->mig[d->mig].has_ci = 0;
    g->mig[d->mig].uuid[0] = '\0';
    rc = commit(d->gpu, &before);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* ---------------------------------------------------------------- steady-state readings
 * Fixed, idle values so nvidia-smi-like tools have something to print. */

NVML_API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType,
                                                unsigned int *temp)
{
    DEVICE(device, d, temp);
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_NOT_SUPPORTED;
    *temp = 30 + d->gpu % 8;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                     nvmlUtilization_t *utilization)
{
    DEVICE(device, d, utilization);
    if (d->mig >= 0)
        return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = 0;
    utilization->memory = 0;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, unsigned int *pState)
{
    DEVICE(device, d, pState);
    *pState = 0;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, unsigned int *mode)
{
    DEVICE(device, d, mode);
    *mode = 1;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, unsigned int *mode)
{
    DEVICE(device, d, mode);
    *mode = 0; /* NVML_COMPUTEMODE_DEFAULT */
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current,
                                            unsigned int *pending)
{
    DEVICE(device, d, current && pending);
    *current = *pending = 1;
    return NVML_SUCCESS;
}

/* No process ever runs on a simulated GPU: an empty list, whatever the struct version. */
static nvmlReturn_t no_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos)
{
    (void)infos;
    DEVICE(device, d, infoCount);
    *infoCount = 0;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                              unsigned int *infoCount,
                                                              void *infos)
{
    return no_processes(device, infoCount, infos);
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                              unsigned int *infoCount,
                                                              void *infos)
{
    return no_processes(device, infoCount, infos);
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                           unsigned int *infoCount, void *infos)
{
    return no_processes(device, infoCount, infos);
}

NVML_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                               unsigned int *infoCount,
                                                               void *infos)
{
    return no_processes(device, infoCount, infos);
}

/* ---------------------------------------------------------------- events */

#define SUPPORTED_EVENTS                                                                       \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |   \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock | nvmlEventTypePowerSourceChange)

static unsigned long long supported_events(const struct fg_gpu *g)
{
    return SUPPORTED_EVENTS | (g->mig_capable ? nvmlEventMigConfigChange : 0);
}

NVML_API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                        unsigned long long *eventTypes)
{
    DEVICE(device, d, eventTypes);
    if (d->mig >= 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *eventTypes = supported_events(gpu_of(d));
    return NVML_SUCCESS;
}

/* Caller holds g_lock. */
static int set_is_live(const struct fg_event_set *set)
{
    for (const struct fg_event_set *s = g_sets; s; s = s->next)
        if (s == set)
            return 1;
    return 0;
}

static void enqueue(struct fg_event_set *set, unsigned int gpu, unsigned long long type,
                    unsigned long long data)
{
    if (set->count == EVENT_QUEUE_CAP)
        return; /* a consumer that never waits loses the newest events, not memory */
    nvmlEventData_t *e = &set->queue[(set->head + set->count++) % EVENT_QUEUE_CAP];
    e->device = &g_dev[gpu];
    e->eventType = type;
    e->eventData = data;
    /* Injected faults are GPU-wide: nvml.h sets both IDs to 0xFFFFFFFF unless an Xid is
     * attributable to a MIG instance, and always on a GPU without MIG. */
    e->gpuInstanceId = NO_INSTANCE;
    e->computeInstanceId = NO_INSTANCE;
}

NVML_API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fg_event_set *s = calloc(1, sizeof *s);
    if (!s)
        return NVML_ERROR_MEMORY;
    pthread_mutex_lock(&g_lock);
    /* only faults injected from now on are news */
    s->offset = fg_log_size(g_log_path);
    s->next = g_sets;
    g_sets = s;
    pthread_mutex_unlock(&g_lock);
    *set = s;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    for (struct fg_event_set **p = &g_sets; *p; p = &(*p)->next) {
        if (*p == set) {
            *p = set->next;
            free(set);
            rc = NVML_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* Forward declaration: registration first hands the set what its earlier registrations
 * are owed, so a newly registered device only sees faults from now on. */
static void deliver_new(const struct fg_fault_line *l, void *ctx);

/* As nvml.h says: "All events that occurred before this call are not recorded." A fault
 * injected before a consumer registered is never replayed to it, so a restarted device
 * plugin sees every GPU healthy until the next fault. */
NVML_API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                                nvmlEventSet_t set)
{
    struct fg_device *d;
    nvmlReturn_t rc = lookup(device, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (d->mig >= 0)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned long long mask = eventTypes & supported_events(gpu_of(d));
    if (!mask)
        return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    if (!set_is_live(set)) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    fg_log_read(g_log_path, &set->offset, -1, deliver_new, set);
    set->mask[d->gpu] |= mask;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

static void deliver_new(const struct fg_fault_line *l, void *ctx)
{
    struct fg_event_set *set = ctx;
    if (l->is_clear || l->gpu < 0 || (unsigned int)l->gpu >= g_cfg.gpu_count)
        return;
    if (set->mask[l->gpu] & l->event_type)
        enqueue(set, (unsigned int)l->gpu, l->event_type, l->event_data);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Polls the fault log every POLL_INTERVAL_MS without holding the lock while asleep, so
 * other threads keep querying devices while an event thread waits. */
NVML_API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                           unsigned int timeoutms)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    long long deadline = now_ms() + timeoutms;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        if (!set_is_live(set)) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        fg_log_read(g_log_path, &set->offset, -1, deliver_new, set);
        if (set->count) {
            *data = set->queue[set->head];
            set->head = (set->head + 1) % EVENT_QUEUE_CAP;
            set->count--;
            pthread_mutex_unlock(&g_lock);
            return NVML_SUCCESS;
        }
        pthread_mutex_unlock(&g_lock);
        long long left = deadline - now_ms();
        if (left <= 0)
            return NVML_ERROR_TIMEOUT;
        long long nap = left < POLL_INTERVAL_MS ? left : POLL_INTERVAL_MS;
        struct timespec ts = {.tv_sec = nap / 1000, .tv_nsec = (nap % 1000) * 1000000};
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
            ;
    }
}

NVML_API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                        unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
