/* client_internal.h - what the trainer-side files (client.c, sums.c, group.c, push.c) share
 * beyond rw_client.h. Not part of the contract (and not exported to ctypes users on purpose). */
#ifndef RW_CLIENT_INTERNAL_H
#define RW_CLIENT_INTERNAL_H

#include "rw_client.h"
#include "sync_internal.h"

/* Records the outcome of a call on the handle (rw_client_last_error); returns st. */
rw_status rw_client_note(rw_client *c, rw_status st, rw_err *err);
/* send + wait with an args writer (NULL: {}); the decoded reply stays in *m for the caller
 * (free with rw_msg_free). */
rw_status rw_client_call(rw_client *c, const char *cmd, rw_mw *args, int timeout_ms, rw_msg **m,
                         rw_reply *r, rw_err *err);
/* The trainer group's own stream (a cudaStream_t) used when callers pass none. */
void *rw_client_group_stream(rw_client_group *g);
/* The worker's quantization config as a checksum reply reports it (strings borrowed from s). */
rw_status rw_client_sums_quant(const rw_client_sums *s, rw_quant_config *q, rw_err *err);

/* Generate results in parts (parts.c): whether a result is a part with more to come, joining a
 * part into *acc (NULL at first; a jansson object, json_decref it; its routes fields' offsets
 * moved by frame_base, where its data frame starts in the joined frame), and the joined result as
 * JSON text (malloc'd). */
struct json_t;
bool rw_client_is_part(const rw_mobj *result);
rw_status rw_client_join_part(struct json_t **acc, const rw_mobj *part, uint64_t frame_base,
                              rw_err *err);
rw_status rw_client_parts_done(struct json_t *acc, char **out, rw_err *err);
/* A result in parts whose first part is (m, r) with data frame *frame (NULL: none): waits for
 * the others and joins them all into *result_json (malloc'd) and their frames into *frame /
 * *frame_len (NULL frame: the joined frame is dropped). Frees m. */
rw_status rw_client_join_rest(rw_client *c, uint64_t id, int timeout_ms, rw_msg *m,
                              rw_reply *r, char **result_json, void **frame, size_t *frame_len,
                              rw_err *err);

#endif
