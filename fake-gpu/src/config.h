/* The shim's view of one simulated node: parsed from the line-based file that
 * `gpulab fake-gpu render` writes (format in fake-gpu/README.md). */
#ifndef FAKE_GPU_CONFIG_H
#define FAKE_GPU_CONFIG_H

#include <limits.h>

#include "nvml_types.h"

#define FG_MAX_GPUS 64
#define FG_MAX_MIG 7
#define FG_STR 96

struct fg_gi_profile {
    int present;
    unsigned int id; /* the GI profile ID nvidia-smi shows (19 for 1g.5gb ...) */
    unsigned int slices;
    unsigned int instances;
    unsigned int sms;
    unsigned long long memory_mib;
    char name[32]; /* "1g.5gb" */
};

/* One GPU instance slot. A MIG device is a GPU instance with its compute instance; the
 * shim gives every GPU instance at most one compute instance, of the instance's size. */
struct fg_mig {
    int present;          /* the GPU instance exists */
    int has_ci;           /* its compute instance exists (then it is a MIG device) */
    int has_start;        /* start was given (state file) rather than placed first-fit */
    unsigned int profile; /* NVML_GPU_INSTANCE_PROFILE_* */
    unsigned int gi_id;
    unsigned int ci_id;
    unsigned int start; /* placement: first memory slice (of FG_MEMORY_SLICES) */
    char uuid[FG_STR];
};

struct fg_gpu {
    unsigned int seen; /* bit set of required keys present */
    char name[FG_STR];
    char uuid[FG_STR];
    char serial[32];
    char bus_id[32];
    unsigned int domain, bus, device;
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned long long memory_mib;
    int cc_major, cc_minor;
    unsigned int architecture, brand;
    int numa_node;
    unsigned int cpu_first, cpu_count;
    unsigned int nvlinks;
    unsigned int npeers;
    unsigned int peers[FG_MAX_GPUS];
    int mig_capable, mig_mode;
    unsigned int mig_count;
    unsigned int mig_seen; /* bit j: mig.j present */
    struct fg_mig mig[FG_MAX_MIG];
    struct fg_gi_profile gi[NVML_GPU_INSTANCE_PROFILE_COUNT]; /* by NVML profile enum */
};

struct fg_config {
    char node[FG_STR];
    char profile[FG_STR];
    char driver_version[80];
    char nvml_version[80];
    int cuda_driver_version;
    char state_dir[PATH_MAX];
    unsigned int gpu_count;
    struct fg_gpu gpus[FG_MAX_GPUS];
};

/* Parse `path` into `cfg`. On failure returns -1 and writes a one-line reason to err. */
int fg_config_load(const char *path, struct fg_config *cfg, char *err, unsigned long errlen);

/* Overlay the node's MIG state file (written by fg_state_save after MIG-changing calls)
 * on `cfg`: each GPU it names gets its MIG mode and instances from it. Returns 0, or 1
 * when there is no such file (nothing changed), or -1 with a one-line reason in err. */
int fg_state_load(const char *path, struct fg_config *cfg, char *err, unsigned long errlen);

/* Write every MIG-capable GPU's MIG mode and instances to `path` (atomically: a temporary
 * file renamed over it). Returns 0 or -1 (errno set). */
int fg_state_save(const char *path, const struct fg_config *cfg);

#endif
