/* test_layout_tool.c - runs the rw-layout program (path given as argv[1]) on the Qwen3-30B-A3B
 * config and checks its JSON: the issue's check (TP 8, rank 3, up_proj reads [288, 384)), the
 * whole-model array, and the refusal of a bad TP degree. */
#include "rw_test.h"

#include <jansson.h>

/* Runs the tool with `args`, returns its stdout (malloc'd) and exit status. */
static char *run_tool(const char *tool, const char *args, int *status) {
    char cfg[1024], cmd[4096];
    rw_test_path(cfg, sizeof cfg, "tests/moe/qwen3-30b-a3b.json");
    snprintf(cmd, sizeof cmd, "'%s' --config '%s' %s 2>/dev/null", tool, cfg, args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap) buf = realloc(buf, cap *= 2);
        size_t n = fread(buf + len, 1, 4096, f);
        if (n == 0) break;
        len += n;
    }
    buf[len] = 0;
    *status = pclose(f);
    return buf;
}

static void test_issue_check(void **state) {
    int st;
    char *out = run_tool(
        *state, "--tp 8 --rank 3 --tensor model.layers.0.mlp.experts.0.up_proj.weight", &st);
    assert_int_equal(st, 0);
    json_error_t je;
    json_t *o = json_loads(out, 0, &je);
    if (!o) fail_msg("rw-layout printed invalid JSON: %s (%s)", je.text, out);
    assert_true(json_is_object(o));
    assert_string_equal(json_string_value(json_object_get(o, "tensor")),
                        "model.layers.0.mlp.experts.0.up_proj.weight");
    assert_int_equal(json_integer_value(json_object_get(o, "dim")), 0);
    assert_int_equal(json_integer_value(json_object_get(o, "src_begin")), 288);
    assert_int_equal(json_integer_value(json_object_get(o, "src_end")), 384);
    json_t *ds = json_object_get(o, "dst_shape");
    assert_int_equal(json_array_size(ds), 2);
    assert_int_equal(json_integer_value(json_array_get(ds, 0)), 128);
    assert_int_equal(json_integer_value(json_array_get(ds, 1)), 2048);
    assert_true(json_is_true(json_object_get(o, "padded")));
    json_decref(o);
    free(out);
}

static void test_whole_model(void **state) {
    int st;
    char *out = run_tool(*state, "--tp 4 --rank 1", &st);
    assert_int_equal(st, 0);
    json_error_t je;
    json_t *a = json_loads(out, 0, &je);
    if (!a) fail_msg("rw-layout printed invalid JSON: %s", je.text);
    assert_true(json_is_array(a));
    /* embed + 48 layers x (9 + 3 x 128) + norm + lm_head */
    assert_int_equal(json_array_size(a), 1 + 48 * (9 + 3 * 128) + 2);
    size_t i;
    json_t *o;
    int norms = 0, downs = 0;
    json_array_foreach(a, i, o) {
        const char *kind = json_string_value(json_object_get(o, "kind"));
        assert_non_null(kind);
        if (!strcmp(kind, "input_layernorm")) {
            assert_true(json_is_null(json_object_get(o, "dim")));
            norms++;
        }
        if (!strcmp(kind, "expert.down_proj")) {
            /* S = 192, P = 256 at TP 4: rank 1 reads columns [192, 384) */
            assert_int_equal(json_integer_value(json_object_get(o, "dim")), 1);
            assert_int_equal(json_integer_value(json_object_get(o, "src_begin")), 192);
            assert_int_equal(json_integer_value(json_object_get(o, "src_end")), 384);
            downs++;
        }
    }
    assert_int_equal(norms, 48);
    assert_int_equal(downs, 48 * 128);
    json_decref(a);
    free(out);
}

static void test_refuses_bad_input(void **state) {
    int st;
    char *out = run_tool(*state, "--tp 3 --rank 0", &st); /* 3 does not divide 32 heads */
    assert_int_not_equal(st, 0);
    free(out);
    out = run_tool(*state, "--tp 8 --rank 8", &st);
    assert_int_not_equal(st, 0);
    free(out);
    out =
        run_tool(*state, "--tp 8 --rank 0 --tensor model.layers.0.mlp.experts.0.nope.weight", &st);
    assert_int_not_equal(st, 0);
    free(out);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH-TO-rw-layout\n", argv[0]);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_issue_check, argv[1]),
        cmocka_unit_test_prestate(test_whole_model, argv[1]),
        cmocka_unit_test_prestate(test_refuses_bad_input, argv[1]),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
