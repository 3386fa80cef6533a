/* HAMi-core, as far as NVML goes: HAMi's in-container library (libvgpu.so, preloaded
 * through /etc/ld.so.preload, which HAMi's device plugin mounts into a vGPU container)
 * hooks exactly two NVML calls to change what they return, nvmlDeviceGetMemoryInfo and
 * nvmlDeviceGetMemoryInfo_v2 (Project-HAMi/HAMi-core src/nvml/hook.c
 * _nvmlDeviceGetMemoryInfo); every other NVML call it exports (src/nvml/hook.c,
 * src/nvml/nvml_entry.c) passes through unchanged. The shim applies that hook itself when
 * a process carries the envs HAMi's Allocate sets together with that mount. */
#ifndef FAKE_GPU_HAMICORE_H
#define FAKE_GPU_HAMICORE_H

/* Is HAMi-core in this process? The lab's stand-in for "libvgpu.so is preloaded": HAMi's
 * Allocate set CUDA_DEVICE_MEMORY_LIMIT[_<i>] or CUDA_DEVICE_SM_LIMIT (it sets them exactly
 * when it mounts the library), and CUDA_DISABLE_CONTROL is not true (then it mounts no
 * ld.so.preload). Read from the environment at nvmlInit. */
int fg_hamicore_load(void);

/* get_limit_from_env for CUDA device `index`: CUDA_DEVICE_MEMORY_LIMIT_<index>, else
 * CUDA_DEVICE_MEMORY_LIMIT, in bytes ("3000m", "3g", "1024k", plain bytes; strtoul base 0);
 * 0 for none, an invalid value or an overflow (HAMi-core: no limit). */
unsigned long long fg_hamicore_limit(unsigned int index);

#endif
