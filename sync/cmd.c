/* cmd.c - the one table of command names of the control protocol (rw_msg.h): the daemon, the sync
 * handlers, the clients and rw-ctl name commands through it; the Python client's copy is checked
 * against it by a test. The order is the protocol's (docs/PROTOCOL.md) and the index is the
 * rw_cmd number. */
#include "rw_msg.h"

#include <string.h>

typedef struct cmd_row {
    const char *name;
    unsigned flags;
} cmd_row;

static const cmd_row table[RW_CMD_COUNT] = {
    [RW_CMD_NONE] = {NULL, 0},
    [RW_CMD_GENERATE] = {"generate", 0},
    [RW_CMD_ABORT] = {"abort", 0},
    [RW_CMD_PAUSE] = {"pause", 0},
    [RW_CMD_RESUME] = {"resume", 0},
    [RW_CMD_FLUSH_CACHE] = {"flush_cache", 0},
    [RW_CMD_INIT_WEIGHTS_UPDATE_GROUP] = {"init_weights_update_group", RW_CMDF_SYNC},
    [RW_CMD_BEGIN_UPDATE] = {"begin_update", RW_CMDF_SYNC | RW_CMDF_UPDATE},
    [RW_CMD_UPDATE_WEIGHTS] = {"update_weights", RW_CMDF_SYNC | RW_CMDF_UPDATE},
    [RW_CMD_UPDATE_WEIGHTS_FROM_DISK] = {"update_weights_from_disk", RW_CMDF_SYNC | RW_CMDF_UPDATE},
    [RW_CMD_COMMIT_UPDATE] = {"commit_update", RW_CMDF_SYNC | RW_CMDF_UPDATE},
    [RW_CMD_ABORT_UPDATE] = {"abort_update", RW_CMDF_SYNC},
    [RW_CMD_GET_WEIGHT_VERSION] = {"get_weight_version", RW_CMDF_SYNC},
    [RW_CMD_GET_WEIGHTS] = {"get_weights", RW_CMDF_SYNC},
    [RW_CMD_CHECKSUM] = {"checksum", RW_CMDF_SYNC},
    [RW_CMD_RELEASE_MEMORY] = {"release_memory", 0},
    [RW_CMD_RESUME_MEMORY] = {"resume_memory", 0},
    [RW_CMD_HEALTH] = {"health", 0},
    [RW_CMD_STATS] = {"stats", 0},
    [RW_CMD_SHUTDOWN] = {"shutdown", 0},
    [RW_CMD_SCORE] = {"score", 0},
};

const char *rw_cmd_name(rw_cmd c) {
    return (unsigned)c < RW_CMD_COUNT ? table[c].name : NULL;
}

unsigned rw_cmd_flags(rw_cmd c) {
    return (unsigned)c < RW_CMD_COUNT ? table[c].flags : 0;
}

rw_cmd rw_cmd_parse(const char *name) {
    for (int c = 1; name && c < RW_CMD_COUNT; c++)
        if (!strcmp(name, table[c].name)) return (rw_cmd)c;
    return RW_CMD_NONE;
}

const char *rw_cmd_list(char *dst, size_t cap) {
    size_t k = 0;
    if (cap) dst[0] = 0;
    for (int c = 1; c < RW_CMD_COUNT && k + 1 < cap; c++) {
        size_t n = strlen(table[c].name);
        const char *sep = c > 1 ? ", " : "";
        if (k + strlen(sep) + n >= cap) break;
        memcpy(dst + k, sep, strlen(sep));
        k += strlen(sep);
        memcpy(dst + k, table[c].name, n);
        k += n;
        dst[k] = 0;
    }
    return dst;
}
