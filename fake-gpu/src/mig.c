/* MIG placement and MIG device UUIDs (see mig.h). */
#include "mig.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

unsigned int fg_mem_slices(const struct fg_gpu *g, unsigned int profile)
{
    const struct fg_gi_profile *p = &g->gi[profile];
    if (!g->memory_mib)
        return 1;
    unsigned long long n =
        (p->memory_mib * FG_MEMORY_SLICES + g->memory_mib / 2) / g->memory_mib;
    if (n < 1)
        n = 1;
    return n > FG_MEMORY_SLICES ? FG_MEMORY_SLICES : (unsigned int)n;
}

/* Compute slices and memory slices in use, and instances of `profile`. */
static void usage(const struct fg_gpu *g, unsigned int profile, unsigned int *compute,
                  unsigned char mem[FG_MEMORY_SLICES], unsigned int *same)
{
    *compute = 0;
    *same = 0;
    memset(mem, 0, FG_MEMORY_SLICES);
    for (unsigned int j = 0; j < FG_MAX_MIG; j++) {
        const struct fg_mig *m = &g->mig[j];
        if (!m->present)
            continue;
        *compute += g->gi[m->profile].slices;
        unsigned int size = fg_mem_slices(g, m->profile);
        for (unsigned int s = m->start; s < m->start + size && s < FG_MEMORY_SLICES; s++)
            mem[s] = 1;
        if (m->profile == profile)
            (*same)++;
    }
}

static int run_free(const unsigned char mem[FG_MEMORY_SLICES], unsigned int start,
                    unsigned int size)
{
    if (start % size || start + size > FG_MEMORY_SLICES)
        return 0;
    for (unsigned int s = start; s < start + size; s++)
        if (mem[s])
            return 0;
    return 1;
}

static int fits(const struct fg_gpu *g, unsigned int profile, int given, unsigned int *start)
{
    const struct fg_gi_profile *p = &g->gi[profile];
    if (profile >= NVML_GPU_INSTANCE_PROFILE_COUNT || !p->present)
        return -1;
    unsigned int compute, same;
    unsigned char mem[FG_MEMORY_SLICES];
    usage(g, profile, &compute, mem, &same);
    if (same >= p->instances || compute + p->slices > FG_COMPUTE_SLICES)
        return -1;
    unsigned int size = fg_mem_slices(g, profile);
    if (given)
        return run_free(mem, *start, size) ? 0 : -1;
    for (unsigned int s = 0; s + size <= FG_MEMORY_SLICES; s += size) {
        if (run_free(mem, s, size)) {
            *start = s;
            return 0;
        }
    }
    return -1;
}

int fg_mig_fit(const struct fg_gpu *g, unsigned int profile, unsigned int *start)
{
    return fits(g, profile, 0, start);
}

unsigned int fg_mig_placements(const struct fg_gpu *g, unsigned int profile, unsigned int *starts,
                               unsigned int max)
{
    if (profile >= NVML_GPU_INSTANCE_PROFILE_COUNT || !g->gi[profile].present)
        return 0;
    unsigned int size = fg_mem_slices(g, profile), n = 0;
    for (unsigned int s = 0; s + size <= FG_MEMORY_SLICES; s += size) {
        if (s + g->gi[profile].slices > FG_COMPUTE_SLICES)
            break;
        if (n < max)
            starts[n] = s;
        n++;
    }
    return n;
}

int fg_mig_fit_at(const struct fg_gpu *g, unsigned int profile, unsigned int start)
{
    unsigned int starts[FG_MEMORY_SLICES];
    unsigned int n = fg_mig_placements(g, profile, starts, FG_MEMORY_SLICES);
    for (unsigned int i = 0; i < n; i++)
        if (starts[i] == start)
            return fits(g, profile, 1, &start);
    return -1;
}

unsigned int fg_mig_capacity(const struct fg_gpu *g, unsigned int profile)
{
    struct fg_gpu copy = *g;
    unsigned int n = 0, start;
    for (unsigned int j = 0; j < FG_MAX_MIG; j++) {
        if (copy.mig[j].present)
            continue;
        if (fits(&copy, profile, 0, &start) != 0)
            break;
        copy.mig[j].present = 1;
        copy.mig[j].profile = profile;
        copy.mig[j].start = start;
        n++;
    }
    return n;
}

int fg_mig_place_all(struct fg_gpu *g)
{
    struct fg_mig wanted[FG_MAX_MIG];
    memcpy(wanted, g->mig, sizeof wanted);
    for (unsigned int j = 0; j < FG_MAX_MIG; j++)
        g->mig[j].present = 0;
    for (unsigned int j = 0; j < FG_MAX_MIG; j++) {
        if (!wanted[j].present)
            continue;
        unsigned int start = wanted[j].start;
        if (fits(g, wanted[j].profile, wanted[j].has_start, &start) != 0)
            return -1;
        g->mig[j].present = 1;
        g->mig[j].start = start;
    }
    return 0;
}

/* FNV-1a, 64 bits, from a chosen offset basis. */
static uint64_t fnv1a(const char *s, uint64_t h)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

void fg_mig_uuid(const struct fg_gpu *g, unsigned int profile, unsigned int gi, unsigned int ci,
                 char *out, size_t len)
{
    char key[FG_STR + 48];
    snprintf(key, sizeof key, "%s/gi%u/ci%u/p%u", g->uuid, gi, ci, profile);
    uint64_t a = fnv1a(key, 0xcbf29ce484222325ULL), b = fnv1a(key, 0x84222325cbf29ce4ULL);
    /* shaped like a version-5 UUID, as the profiles' MIG UUIDs are */
    snprintf(out, len, "MIG-%08x-%04x-5%03x-%04x-%012llx", (unsigned int)(a >> 32),
             (unsigned int)(a >> 16) & 0xFFFF, (unsigned int)a & 0xFFF,
             (unsigned int)((b >> 48) & 0x3FFF) | 0x8000,
             (unsigned long long)(b & 0xFFFFFFFFFFFFULL));
}
