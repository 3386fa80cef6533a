/* Reader for the per-node fault log that `gpulab fake-gpu inject/clear` append to.
 * Line format (one write per line, O_APPEND, so readers never see a torn line):
 *   <seq> fault <gpu> <nvml event type> <event data>
 *   <seq> clear <gpu>|all
 */
#ifndef FAKE_GPU_FAULTLOG_H
#define FAKE_GPU_FAULTLOG_H

struct fg_fault_line {
    unsigned long long seq;
    int is_clear;
    int gpu; /* -1: every GPU (clear all) */
    unsigned long long event_type;
    unsigned long long event_data;
};

typedef void (*fg_fault_cb)(const struct fg_fault_line *line, void *ctx);

/* Feed every complete line between *offset and min(end of file, limit) to cb and advance
 * *offset. limit < 0 means no limit. A missing file is an empty log; a file shorter than
 * *offset was recreated, so reading restarts at 0. */
void fg_log_read(const char *path, long *offset, long limit, fg_fault_cb cb, void *ctx);

/* Current size of the log (0 if missing). */
long fg_log_size(const char *path);

#endif
