/* test_cuda_tp2_vs_tp1_gpu.c - tensor parallelism over NCCL on two GPUs, one process per rank as
 * the daemon runs them, gives the same greedy tokens as one GPU on the fixture prompts (target F4,
 * docs/TARGETS.md).
 * The test re-executes itself as the two ranks ("rank R IDHEX"), so the ranks start from a clean
 * CUDA state; each prints its tokens, the parent compares them with its own TP1 run. */
#include <unistd.h>

#include "rw_test.h"
#include "rw_worker.h"

#define NPROMPT 4
#define NGEN 24

/* Greedy tokens of the 4 fixture prompts, [NPROMPT][NGEN]. */
static int generate(rw_comm *comm, int device, int32_t out[NPROMPT][NGEN], char *msg, size_t cap) {
    char dir[1024], path[1200];
    rw_err err = {0};
    rw_config cfg;
    rw_st_file *ref = NULL;
    rw_model *m = NULL;
    rw_engine *e = NULL;
    int rc = 1;
    rw_test_path(dir, sizeof dir, RW_TEST_FIXTURE);
    snprintf(path, sizeof path, "%s/config.json", dir);
    memset(&cfg, 0, sizeof cfg);
    if (rw_config_load(path, &cfg, &err)) goto done;
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    if (rw_st_open(path, &ref, &err)) goto done;
    rw_model_opts mo = {RW_BACKEND_CUDA, device, comm ? rw_comm_size(comm) : 1,
                        comm ? rw_comm_rank(comm) : 0, comm};
    if (rw_model_create(&cfg, &mo, &m, &err) || rw_model_load_ckpt(m, dir, &err) ||
        rw_engine_create(m, NULL, &e, &err))
        goto done;
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = NGEN;
    for (int i = 0; i < NPROMPT; i++) {
        char n[32];
        snprintf(n, sizeof n, "prompt.%d", i);
        const rw_st_entry *pe = rw_st_find(ref, n);
        if (!pe) {
            RW_ERR(&err, RW_E_NOT_FOUND, "reference has no %s", n);
            goto done;
        }
        if (rw_engine_add(e, (uint64_t)i, pe->data, (int)pe->shape[0], &sp, &err)) goto done;
    }
    if (rw_engine_run(e, &err)) goto done;
    rw_output *o;
    while ((o = rw_engine_pop_output(e))) {
        for (int j = 0; j < NGEN; j++)
            out[o->id][j] = j < o->n ? o->tokens[j] : -1;
        rw_output_free(o);
    }
    rc = 0;
done:
    if (rc) snprintf(msg, cap, "%s (%s)", err.msg, err.where);
    rw_engine_destroy(e);
    rw_model_destroy(m);
    rw_st_close(ref);
    rw_config_free(&cfg);
    return rc;
}

static int rank_main(int rank, const char *hex) {
    uint8_t id[RW_NCCL_ID_BYTES];
    for (int i = 0; i < RW_NCCL_ID_BYTES; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return 2;
        id[i] = (uint8_t)v;
    }
    rw_err err = {0};
    rw_comm *c = NULL;
    if (rw_comm_create_nccl(id, 2, rank, rank, &c, &err)) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        return 1;
    }
    int32_t tok[NPROMPT][NGEN];
    char msg[600];
    const int rc = generate(c, rank, tok, msg, sizeof msg);
    rw_comm_destroy(c);
    if (rc) {
        fprintf(stderr, "rank %d: %s\n", rank, msg);
        return 1;
    }
    for (int i = 0; i < NPROMPT; i++) {
        for (int j = 0; j < NGEN; j++)
            printf("%d ", tok[i][j]);
        printf("\n");
    }
    return 0;
}

static void test_tp2_equals_tp1(void **state) {
    (void)state;
    char exe[1024];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(n > 0);
    exe[n] = 0;
    uint8_t id[RW_NCCL_ID_BYTES];
    rw_err err = {0};
    RW_ASSERT_OK(rw_comm_nccl_unique_id(id, &err), &err);
    char hex[2 * RW_NCCL_ID_BYTES + 1];
    for (int i = 0; i < RW_NCCL_ID_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", id[i]);
    char cmd[2][1400];
    FILE *p[2];
    for (int r = 0; r < 2; r++) {
        snprintf(cmd[r], sizeof cmd[r], "'%s' rank %d %s", exe, r, hex);
        p[r] = popen(cmd[r], "r");
        assert_non_null(p[r]);
    }
    int32_t tp2[2][NPROMPT][NGEN];
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < NPROMPT; i++)
            for (int j = 0; j < NGEN; j++)
                if (fscanf(p[r], "%d", &tp2[r][i][j]) != 1) tp2[r][i][j] = -2;
        const int st = pclose(p[r]);
        if (st != 0) fail_msg("rank %d exited with status %d", r, st);
    }
    int32_t tp1[NPROMPT][NGEN];
    char msg[600];
    if (generate(NULL, 0, tp1, msg, sizeof msg)) fail_msg("TP1: %s", msg);
    rw_assert_bytes_equal(tp2[0], tp2[1], sizeof tp1, "rank 0 vs rank 1 tokens");
    int same = 0;
    for (int i = 0; i < NPROMPT; i++)
        for (int j = 0; j < NGEN; j++)
            same += tp2[0][i][j] == tp1[i][j];
    print_message("F4: TP2 greedy tokens equal to TP1 at %d of %d positions\n", same,
                  NPROMPT * NGEN);
    rw_assert_bytes_equal(tp2[0], tp1, sizeof tp1, "TP2 vs TP1 greedy tokens");
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "rank") == 0) return rank_main(atoi(argv[2]), argv[3]);
    rw_test_require_gpu(2);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tp2_equals_tp1)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
