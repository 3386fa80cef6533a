/* Parser for the rendered node file (key=value lines). Strict on purpose: the file is
 * machine-written, so anything unexpected means a stale or hand-broken file, and NVML
 * init must fail loudly instead of inventing GPUs. */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    SEEN_NAME = 1 << 0,
    SEEN_UUID = 1 << 1,
    SEEN_BUS = 1 << 2,
    SEEN_MEMORY = 1 << 3,
    SEEN_CC = 1 << 4,
    SEEN_ALL = (1 << 5) - 1,
};

static int fail(char *err, unsigned long errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        return -1;
    memcpy(dst, src, n + 1);
    return 0;
}

static int parse_uint(const char *s, unsigned long long max, unsigned long long *out)
{
    char *end;
    errno = 0;
    if (*s == '\0' || *s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end != '\0' || v > max)
        return -1;
    *out = v;
    return 0;
}

static int parse_u32(const char *s, unsigned int *out)
{
    unsigned long long v;
    if (parse_uint(s, 0xFFFFFFFFULL, &v))
        return -1;
    *out = (unsigned int)v;
    return 0;
}

static int parse_peers(const char *s, struct fg_gpu *g)
{
    g->npeers = 0;
    if (*s == '\0')
        return 0;
    char buf[FG_MAX_GPUS * 4];
    if (copy_str(buf, sizeof buf, s))
        return -1;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        unsigned int p;
        if (g->npeers >= FG_MAX_GPUS || parse_u32(tok, &p) || p >= FG_MAX_GPUS)
            return -1;
        g->peers[g->npeers++] = p;
    }
    return 0;
}

/* "<id>,<slices>,<instances>,<sms>,<memory_mib>,<name>" */
static int parse_gi_profile(const char *s, struct fg_gi_profile *p)
{
    unsigned long long mem;
    char memstr[24];
    int n = 0;
    if (sscanf(s, "%u,%u,%u,%u,%23[0-9],%31[^,\n]%n", &p->id, &p->slices, &p->instances,
               &p->sms, memstr, p->name, &n) != 6 || s[n] != '\0')
        return -1;
    if (parse_uint(memstr, ~0ULL, &mem) || p->slices == 0 || p->slices > 8)
        return -1;
    p->memory_mib = mem;
    p->present = 1;
    return 0;
}

/* "<uuid>,<profile enum>,<gi id>,<ci id>" */
static int parse_mig(const char *s, struct fg_mig *m)
{
    int n = 0;
    if (sscanf(s, "%95[^,],%u,%u,%u%n", m->uuid, &m->profile, &m->gi_id, &m->ci_id, &n) != 4 ||
        s[n] != '\0' || m->profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return -1;
    return 0;
}

static int parse_bus_id(const char *s, struct fg_gpu *g)
{
    unsigned int fn;
    int n = 0;
    if (sscanf(s, "%x:%x:%x.%x%n", &g->domain, &g->bus, &g->device, &fn, &n) != 4 ||
        s[n] != '\0')
        return -1;
    return copy_str(g->bus_id, sizeof g->bus_id, s);
}

static int gpu_key(struct fg_gpu *g, const char *key, const char *val)
{
    unsigned long long v;
    unsigned int idx;
    int n = 0;

    if (!strcmp(key, "name")) {
        g->seen |= SEEN_NAME;
        return copy_str(g->name, sizeof g->name, val);
    }
    if (!strcmp(key, "uuid")) {
        g->seen |= SEEN_UUID;
        return copy_str(g->uuid, sizeof g->uuid, val);
    }
    if (!strcmp(key, "serial"))
        return copy_str(g->serial, sizeof g->serial, val);
    if (!strcmp(key, "pci_bus_id")) {
        g->seen |= SEEN_BUS;
        return parse_bus_id(val, g);
    }
    if (!strcmp(key, "pci_device_id"))
        return parse_u32(val, &g->pci_device_id);
    if (!strcmp(key, "pci_subsystem_id"))
        return parse_u32(val, &g->pci_subsystem_id);
    if (!strcmp(key, "memory_mib")) {
        g->seen |= SEEN_MEMORY;
        return parse_uint(val, 1ULL << 40, &g->memory_mib);
    }
    if (!strcmp(key, "compute_capability")) {
        g->seen |= SEEN_CC;
        return (sscanf(val, "%d.%d%n", &g->cc_major, &g->cc_minor, &n) == 2 && val[n] == '\0')
                   ? 0
                   : -1;
    }
    if (!strcmp(key, "architecture"))
        return parse_u32(val, &g->architecture);
    if (!strcmp(key, "brand"))
        return parse_u32(val, &g->brand);
    if (!strcmp(key, "numa_node")) {
        if (parse_uint(val, 1024, &v))
            return -1;
        g->numa_node = (int)v;
        return 0;
    }
    if (!strcmp(key, "cpus")) { /* "<first>-<last>" */
        unsigned int first, last;
        if (sscanf(val, "%u-%u%n", &first, &last, &n) != 2 || val[n] != '\0' || last < first ||
            last >= 4096)
            return -1;
        g->cpu_first = first;
        g->cpu_count = last - first + 1;
        return 0;
    }
    if (!strcmp(key, "nvlinks")) {
        if (parse_u32(val, &g->nvlinks) || g->nvlinks > NVML_NVLINK_MAX_LINKS)
            return -1;
        return 0;
    }
    if (!strcmp(key, "nvlink_peers"))
        return parse_peers(val, g);
    if (!strcmp(key, "mig_capable")) {
        if (parse_uint(val, 1, &v))
            return -1;
        g->mig_capable = (int)v;
        return 0;
    }
    if (!strcmp(key, "mig_mode")) {
        if (parse_uint(val, 1, &v))
            return -1;
        g->mig_mode = (int)v;
        return 0;
    }
    if (!strcmp(key, "mig_count")) {
        if (parse_u32(val, &g->mig_count) || g->mig_count > FG_MAX_MIG)
            return -1;
        return 0;
    }
    if (sscanf(key, "gi_profile.%u%n", &idx, &n) == 1 && key[n] == '\0') {
        if (idx >= NVML_GPU_INSTANCE_PROFILE_COUNT)
            return -1;
        return parse_gi_profile(val, &g->gi[idx]);
    }
    if (sscanf(key, "mig.%u%n", &idx, &n) == 1 && key[n] == '\0') {
        if (idx >= FG_MAX_MIG)
            return -1;
        g->mig_seen |= 1u << idx;
        return parse_mig(val, &g->mig[idx]);
    }
    return -1;
}

static int top_key(struct fg_config *cfg, const char *key, const char *val)
{
    unsigned long long v;
    if (!strcmp(key, "version"))
        return strcmp(val, "1") ? -1 : 0;
    if (!strcmp(key, "node"))
        return copy_str(cfg->node, sizeof cfg->node, val);
    if (!strcmp(key, "profile"))
        return copy_str(cfg->profile, sizeof cfg->profile, val);
    if (!strcmp(key, "driver_version"))
        return copy_str(cfg->driver_version, sizeof cfg->driver_version, val);
    if (!strcmp(key, "nvml_version"))
        return copy_str(cfg->nvml_version, sizeof cfg->nvml_version, val);
    if (!strcmp(key, "state_dir"))
        return copy_str(cfg->state_dir, sizeof cfg->state_dir, val);
    if (!strcmp(key, "cuda_driver_version")) {
        if (parse_uint(val, 1000000, &v))
            return -1;
        cfg->cuda_driver_version = (int)v;
        return 0;
    }
    if (!strcmp(key, "gpu_count")) {
        if (parse_u32(val, &cfg->gpu_count) || cfg->gpu_count == 0 ||
            cfg->gpu_count > FG_MAX_GPUS)
            return -1;
        return 0;
    }
    return -1;
}

static int validate(struct fg_config *cfg, char *err, unsigned long errlen)
{
    if (cfg->gpu_count == 0)
        return fail(err, errlen, "missing gpu_count");
    if (cfg->driver_version[0] == '\0' || cfg->cuda_driver_version == 0)
        return fail(err, errlen, "missing driver_version or cuda_driver_version");
    for (unsigned int i = 0; i < FG_MAX_GPUS; i++) {
        struct fg_gpu *g = &cfg->gpus[i];
        if (i >= cfg->gpu_count) {
            if (g->seen)
                return fail(err, errlen, "gpu.%u given but gpu_count is %u", i, cfg->gpu_count);
            continue;
        }
        if ((g->seen & SEEN_ALL) != SEEN_ALL)
            return fail(err, errlen,
                        "gpu.%u lacks one of name, uuid, pci_bus_id, memory_mib, "
                        "compute_capability",
                        i);
        for (unsigned int p = 0; p < g->npeers; p++)
            if (g->peers[p] >= cfg->gpu_count || g->peers[p] == i)
                return fail(err, errlen, "gpu.%u.nvlink_peers names a bad GPU index", i);
        if (g->mig_seen != (1u << g->mig_count) - 1)
            return fail(err, errlen, "gpu.%u: mig.N entries do not match mig_count=%u", i,
                        g->mig_count);
        if (g->mig_count && !(g->mig_capable && g->mig_mode))
            return fail(err, errlen, "gpu.%u has MIG devices but MIG mode is off", i);
        for (unsigned int j = 0; j < g->mig_count; j++)
            if (!g->gi[g->mig[j].profile].present)
                return fail(err, errlen, "gpu.%u.mig.%u uses an undeclared gi_profile", i, j);
    }
    return 0;
}

int fg_config_load(const char *path, struct fg_config *cfg, char *err, unsigned long errlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return fail(err, errlen, "cannot open: %s", strerror(errno));

    memset(cfg, 0, sizeof *cfg);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    unsigned int lineno = 0;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        char *eq = strchr(line, '=');
        if (!eq) {
            rc = fail(err, errlen, "line %u: expected key=value", lineno);
            break;
        }
        *eq = '\0';
        const char *key = line, *val = eq + 1;
        unsigned int idx;
        int n = 0;
        int bad;
        if (sscanf(key, "gpu.%u.%n", &idx, &n) == 1 && n > 0) {
            bad = idx >= FG_MAX_GPUS || gpu_key(&cfg->gpus[idx], key + n, val);
        } else {
            bad = top_key(cfg, key, val);
        }
        if (bad) {
            rc = fail(err, errlen, "line %u: bad or unknown entry '%s'", lineno, key);
            break;
        }
    }
    free(line);
    fclose(f);
    if (rc == 0)
        rc = validate(cfg, err, errlen);
    return rc;
}
