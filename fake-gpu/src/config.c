/* Parser for the rendered node file (key=value lines). Strict on purpose: the file is
 * machine-written, so anything unexpected means a stale or hand-broken file, and NVML
 * init must fail loudly instead of inventing GPUs. */
#include "config.h"

#include "mig.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* "<uuid>,<profile enum>,<gi id>,<ci id>[,<start>]": a ci id of "-" is a GPU instance
 * without its compute instance; the start (first memory slice) is in state files only. */
static int parse_mig(const char *s, struct fg_mig *m)
{
    char ci[16];
    int n = 0;
    memset(m, 0, sizeof *m);
    if (sscanf(s, "%95[^,],%u,%u,%15[^,]%n", m->uuid, &m->profile, &m->gi_id, ci, &n) != 4 ||
        m->profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return -1;
    if (s[n] == ',') {
        unsigned long long start;
        if (parse_uint(s + n + 1, FG_MEMORY_SLICES - 1, &start))
            return -1;
        m->start = (unsigned int)start;
        m->has_start = 1;
    } else if (s[n] != '\0') {
        return -1;
    }
    m->present = 1;
    if (!strcmp(ci, "-"))
        return 0;
    m->has_ci = 1;
    return parse_u32(ci, &m->ci_id);
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
        if (fg_mig_place_all(g) != 0)
            return fail(err, errlen, "gpu.%u: the MIG instances do not fit on the GPU", i);
    }
    return 0;
}

/* One key=value line of a file; returns 0, or -1 for a bad or unknown entry. */
typedef int (*line_fn)(struct fg_config *cfg, const char *key, const char *val, void *ctx);

static int read_lines(FILE *f, struct fg_config *cfg, line_fn fn, void *ctx, char *err,
                      unsigned long errlen)
{
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
        if (fn(cfg, line, eq + 1, ctx)) {
            rc = fail(err, errlen, "line %u: bad or unknown entry '%s'", lineno, line);
            break;
        }
    }
    free(line);
    return rc;
}

static int config_line(struct fg_config *cfg, const char *key, const char *val, void *ctx)
{
    (void)ctx;
    unsigned int idx;
    int n = 0;
    if (sscanf(key, "gpu.%u.%n", &idx, &n) == 1 && n > 0)
        return idx >= FG_MAX_GPUS || gpu_key(&cfg->gpus[idx], key + n, val);
    return top_key(cfg, key, val);
}

int fg_config_load(const char *path, struct fg_config *cfg, char *err, unsigned long errlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return fail(err, errlen, "cannot open: %s", strerror(errno));
    memset(cfg, 0, sizeof *cfg);
    int rc = read_lines(f, cfg, config_line, NULL, err, errlen);
    fclose(f);
    if (rc == 0)
        rc = validate(cfg, err, errlen);
    return rc;
}

/* ---------------------------------------------------------------- MIG state file */

/* State lines: version=1, gpu.N.mig_mode, gpu.N.mig_count, gpu.N.mig.J. The first line
 * naming a GPU drops the MIG instances the config gave it. */
static int state_line(struct fg_config *cfg, const char *key, const char *val, void *ctx)
{
    unsigned long long *touched = ctx; /* bit i: gpu.i seen */
    unsigned int idx, j;
    int n = 0;
    if (!strcmp(key, "version"))
        return strcmp(val, "1") ? -1 : 0;
    if (sscanf(key, "gpu.%u.%n", &idx, &n) != 1 || n == 0 || idx >= cfg->gpu_count)
        return -1;
    const char *rest = key + n;
    int m = 0;
    if (strcmp(rest, "mig_mode") && strcmp(rest, "mig_count") &&
        !(sscanf(rest, "mig.%u%n", &j, &m) == 1 && rest[m] == '\0'))
        return -1;
    struct fg_gpu *g = &cfg->gpus[idx];
    if (!(*touched & (1ULL << idx))) {
        *touched |= 1ULL << idx;
        g->mig_count = 0;
        g->mig_seen = 0;
        memset(g->mig, 0, sizeof g->mig);
    }
    return gpu_key(g, rest, val);
}

int fg_state_load(const char *path, struct fg_config *cfg, char *err, unsigned long errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT)
            return 1;
        return fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    }
    unsigned long long touched = 0;
    char why[200];
    int rc = read_lines(f, cfg, state_line, &touched, why, sizeof why);
    fclose(f);
    if (rc == 0)
        rc = validate(cfg, why, sizeof why);
    if (rc != 0)
        return fail(err, errlen, "%s: %s", path, why);
    for (unsigned int i = 0; i < cfg->gpu_count; i++)
        if ((touched & (1ULL << i)) && !cfg->gpus[i].mig_capable)
            return fail(err, errlen, "%s: gpu.%u is not MIG capable", path, i);
    return 0;
}

int fg_state_save(const char *path, const struct fg_config *cfg)
{
    char tmp[PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    fprintf(f, "# fake-gpu MIG state: written by the NVML shim on nvmlDeviceSetMigMode and on\n"
               "# creating or destroying GPU/compute instances; format in fake-gpu/README.md\n"
               "version=1\n");
    for (unsigned int i = 0; i < cfg->gpu_count; i++) {
        const struct fg_gpu *g = &cfg->gpus[i];
        if (!g->mig_capable)
            continue;
        unsigned int count = 0;
        for (unsigned int j = 0; j < FG_MAX_MIG; j++)
            count += g->mig[j].present != 0;
        fprintf(f, "gpu.%u.mig_mode=%d\ngpu.%u.mig_count=%u\n", i, g->mig_mode, i, count);
        unsigned int k = 0;
        for (unsigned int j = 0; j < FG_MAX_MIG; j++) {
            const struct fg_mig *m = &g->mig[j];
            if (!m->present)
                continue;
            char ci[16] = "-";
            if (m->has_ci)
                snprintf(ci, sizeof ci, "%u", m->ci_id);
            fprintf(f, "gpu.%u.mig.%u=%s,%u,%u,%s,%u\n", i, k++, m->uuid, m->profile, m->gi_id, ci,
                    m->start);
        }
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}
