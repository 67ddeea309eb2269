/* replay.c - runs a fuzz target's entry point (LLVMFuzzerTestOneInput) over every file of its
 * committed corpus, so the cpu suite replays the corpora with a normal compiler and no libFuzzer.
 * A broken invariant aborts (the test fails with the file's name printed just before); a crash
 * or, in a sanitizer build, any report does the same.
 *
 * usage: fuzz_replay_<target> CORPUS_DIR [FILE...] */
#include "fuzz_util.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "rw_test.h"

static const char *corpus_dir;

/* Reads a whole file (the corpus holds small files: a few hundred KiB at most). */
static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) fail_msg("cannot stat %s", path);
    size_t n = (size_t)sb.st_size;
    /* an exact-size allocation, as libFuzzer gives, so ASan sees a read one past the end */
    uint8_t *b = malloc(n ? n : 1);
    assert_non_null(b);
    if (n && fread(b, 1, n, f) != n) fail_msg("short read on %s", path);
    fclose(f);
    *len = n;
    return b;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void run_file(const char *path) {
    size_t n;
    uint8_t *b = slurp(path, &n);
    /* printed before the run: when an input aborts, the last line names it */
    fprintf(stderr, "replay %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(b, n);
    free(b);
}

static void test_replay_corpus(void **state) {
    (void)state;
    DIR *d = opendir(corpus_dir);
    if (!d) fail_msg("cannot open corpus directory %s: %s", corpus_dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            names = realloc(names, cap * sizeof *names);
            assert_non_null(names);
        }
        names[n] = strdup(de->d_name);
        assert_non_null(names[n]);
        n++;
    }
    closedir(d);
    /* a target without a corpus replays nothing: that is a packaging error, not a pass */
    if (n == 0) fail_msg("corpus directory %s is empty", corpus_dir);
    qsort(names, n, sizeof *names, by_name); /* a fixed order, for reproducible failures */
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", corpus_dir, names[i]);
        run_file(path);
        free(names[i]);
    }
    free(names);
    fprintf(stderr, "replayed %zu inputs from %s\n", n, corpus_dir);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR [FILE...]\n", argv[0]);
        return 2;
    }
    /* extra arguments: single inputs (e.g. a crash file from the fuzzer), run outside cmocka */
    if (argc > 2) {
        for (int i = 2; i < argc; i++)
            run_file(argv[i]);
        return 0;
    }
    corpus_dir = argv[1];
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_replay_corpus)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
