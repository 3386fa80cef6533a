/* Fault log reader; see faultlog.h for the format. */
#include "faultlog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

long fg_log_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

static int parse_line(const char *s, struct fg_fault_line *out)
{
    char verb[8], target[16];
    int n = 0;
    memset(out, 0, sizeof *out);
    if (sscanf(s, "%llu %7s %15s%n", &out->seq, verb, target, &n) != 3)
        return -1;
    char *end;
    if (!strcmp(verb, "clear")) {
        out->is_clear = 1;
        if (!strcmp(target, "all")) {
            out->gpu = -1;
            return 0;
        }
    } else if (strcmp(verb, "fault")) {
        return -1;
    }
    long gpu = strtol(target, &end, 10);
    if (*end != '\0' || gpu < 0 || gpu > 4096)
        return -1;
    out->gpu = (int)gpu;
    if (out->is_clear)
        return 0;
    if (sscanf(s + n, "%llu %llu", &out->event_type, &out->event_data) != 2)
        return -1;
    return 0;
}

void fg_log_read(const char *path, long *offset, long limit, fg_fault_cb cb, void *ctx)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && st.st_size < *offset)
        *offset = 0;
    if (fseek(f, *offset, SEEK_SET) != 0) {
        fclose(f);
        return;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0) {
        if (line[len - 1] != '\n')
            break; /* a line still being written: pick it up next time */
        if (limit >= 0 && *offset + len > limit)
            break;
        *offset += len;
        struct fg_fault_line fl;
        if (line[0] != '#' && parse_line(line, &fl) == 0)
            cb(&fl, ctx);
    }
    free(line);
    fclose(f);
}
