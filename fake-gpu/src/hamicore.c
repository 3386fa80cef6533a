/* HAMi-core's environment (see hamicore.h): src/multiprocess/multiprocess_memory_limit.c
 * get_limit_from_env and do_init_device_memory_limits. HAMi v2.10.0 pins HAMi-core at
 * b216ba1 (its libvgpu submodule), a later commit than the newest one stored here,
 * 8f3a89c (2026-06-30), which is what was read (docs/hami.md). */
#include "hamicore.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int truthy(const char *v)
{
    /* Go's strconv.ParseBool true values: what the device plugin tests CUDA_DISABLE_CONTROL
     * with before mounting ld.so.preload */
    static const char *const yes[] = {"1", "t", "T", "TRUE", "true", "True"};
    for (size_t i = 0; v && i < sizeof yes / sizeof *yes; i++)
        if (!strcmp(v, yes[i]))
            return 1;
    return 0;
}

int fg_hamicore_load(void)
{
    if (truthy(getenv("CUDA_DISABLE_CONTROL")))
        return 0;
    if (getenv("CUDA_DEVICE_MEMORY_LIMIT") || getenv("CUDA_DEVICE_SM_LIMIT"))
        return 1;
    extern char **environ;
    for (char **e = environ; e && *e; e++)
        if (!strncmp(*e, "CUDA_DEVICE_MEMORY_LIMIT_", 25))
            return 1;
    return 0;
}

static unsigned long long from_env(const char *name)
{
    const char *v = getenv(name);
    size_t len = v ? strlen(v) : 0;
    if (len == 0)
        return 0;
    unsigned long long scalar = 1;
    switch (v[len - 1]) {
    case 'G': case 'g': scalar = 1024ULL * 1024 * 1024; break;
    case 'M': case 'm': scalar = 1024ULL * 1024; break;
    case 'K': case 'k': scalar = 1024ULL; break;
    default: break;
    }
    unsigned long long n = strtoull(v, NULL, 0);
    unsigned long long bytes = n * scalar;
    if (bytes == 0 || bytes / scalar != n)
        return 0; /* "invalid device memory limit" / "Limit overflow": no limit */
    return bytes;
}

unsigned long long fg_hamicore_limit(unsigned int index)
{
    char name[48];
    snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%u", index);
    unsigned long long limit = from_env(name);
    return limit ? limit : from_env("CUDA_DEVICE_MEMORY_LIMIT");
}
