/* nccl_none.c - the NCCL transport in a build without CUDA: every entry point reports
 * RW_E_NO_DEVICE, so the protocol answers "init_weights_update_group" with a clear error. */
#include "sync_internal.h"

#define NO_NCCL(err) RW_FAIL(err, RW_E_NO_DEVICE, "NCCL transport: this build has no CUDA / NCCL")

rw_status rw_sync_group_unique_id(uint8_t id[RW_NCCL_ID_BYTES], rw_err *err) {
    (void)id;
    NO_NCCL(err);
}
rw_status rw_sync_group_create(const uint8_t id[RW_NCCL_ID_BYTES], int world, int rank,
                               const char *name, int device, double timeout_s, rw_sync_group **out,
                               rw_err *err) {
    *out = NULL;
    NO_NCCL(err);
}
void rw_sync_group_destroy(rw_sync_group *g) {
    (void)g;
}
const char *rw_sync_group_name(const rw_sync_group *g) {
    return g ? "" : "";
}
int rw_sync_group_rank(const rw_sync_group *g) {
    return g ? -1 : -1;
}
int rw_sync_group_world(const rw_sync_group *g) {
    return g ? 0 : 0;
}
int rw_sync_group_device(const rw_sync_group *g) {
    return g ? -1 : -1;
}
bool rw_sync_group_ok(const rw_sync_group *g) {
    return g && false;
}
rw_status rw_sync_group_bcast(rw_sync_group *g, void *buf, uint64_t nbytes, rw_stream s,
                              rw_err *err) {
    NO_NCCL(err);
}
rw_status rw_sync_group_wait(rw_sync_group *g, rw_stream s, double timeout_s, rw_err *err) {
    NO_NCCL(err);
}
static rw_status none_read(rw_sync_source *src, void *dst, rw_place place, uint64_t nbytes,
                           rw_stream s, rw_err *err) {
    NO_NCCL(err);
}
rw_sync_source rw_sync_source_nccl(rw_sync_group *g, uint64_t nbytes) {
    rw_sync_source s = {
        .kind = RW_SYNC_SRC_NCCL, .name = "nccl", .nbytes = nbytes, .read = none_read, .ctx = g};
    return s;
}
rw_status rw_sync_group_check(rw_sync_group *g, rw_err *err) {
    NO_NCCL(err);
}
void rw_sync_group_abort(rw_sync_group *g) {
    (void)g;
}
void *rw_sync_group_stream(rw_sync_group *g) {
    return g ? NULL : NULL;
}
