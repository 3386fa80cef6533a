/* Where GPU instances go on a MIG-capable GPU: the rules the shim applies when a layout is
 * loaded and when nvmlDeviceCreateGpuInstance is called. An A100/H100 has 7 compute
 * slices and 8 memory slices; an instance of a profile takes its compute slices and a
 * run of memory slices aligned to the run's length (a 1g.10gb on a 40 GB A100 takes 2,
 * a 3g.20gb 4, a 7g.40gb all 8), and no profile has more than its instanceCount
 * instances. (The real placement tables are per board; these rules reproduce the
 * layouts NVIDIA documents for A100 and H100.) */
#ifndef FAKE_GPU_MIG_H
#define FAKE_GPU_MIG_H

#include <stddef.h>

#include "config.h"

#define FG_COMPUTE_SLICES 7
#define FG_MEMORY_SLICES 8

/* Memory slices an instance of `profile` occupies on g (its share of the GPU's memory). */
unsigned int fg_mem_slices(const struct fg_gpu *g, unsigned int profile);

/* Where one more instance of `profile` would go: 0 and *start, or -1 if it does not fit. */
int fg_mig_fit(const struct fg_gpu *g, unsigned int profile, unsigned int *start);

/* The places an instance of `profile` can have on g whatever else is there (what
 * nvmlDeviceGetGpuInstancePossiblePlacements lists): starts in memory slices, aligned to
 * its memory share, within the 8 memory slices, and leaving its compute slices within the
 * 7 (so a 1g.5gb on an A100 has starts 0-6, a 2g.10gb 0, 2, 4, a 4g.20gb only 0, as
 * NVIDIA's documentation lists them). Writes up to `max` starts; returns how many there are. */
unsigned int fg_mig_placements(const struct fg_gpu *g, unsigned int profile, unsigned int *starts,
                               unsigned int max);

/* Does one more instance of `profile` fit at `start` (a possible placement, free)? 0 or -1. */
int fg_mig_fit_at(const struct fg_gpu *g, unsigned int profile, unsigned int start);

/* How many more instances of `profile` fit next to the existing ones. */
unsigned int fg_mig_capacity(const struct fg_gpu *g, unsigned int profile);

/* Place the instances marked present in slot order (a given start is checked, else the
 * first fitting one is chosen). Returns 0, or -1 if the layout does not fit. */
int fg_mig_place_all(struct fg_gpu *g);

/* The UUID of the MIG device (GPU instance gi, compute instance ci) of `profile` on g:
 * "MIG-" and a UUID derived from those, so the same instance always has the same one. */
void fg_mig_uuid(const struct fg_gpu *g, unsigned int profile, unsigned int gi, unsigned int ci,
                 char *out, size_t len);

#endif
