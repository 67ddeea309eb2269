/* file.c - opening the files a client names (a checkpoint directory's shards and index) so that
 * nothing in them can stall or fool the worker: opened without blocking, checked as a regular
 * file on the open descriptor, then read normally. A FIFO opened for reading without O_NONBLOCK
 * waits until a writer appears, and with one control thread that wait stops every client. */
#include "rw_core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a plain file";
}

rw_status rw_open_regular(const char *path, int *fd, struct stat *sb, rw_err *err) {
    *fd = -1;
    if (!path) RW_FAIL(err, RW_E_INVALID_ARG, "rw_open_regular: NULL path");
    /* O_NOCTTY: a terminal named by a client must not become the worker's controlling tty */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (f < 0)
        RW_FAIL(err, errno == ENOENT ? RW_E_NOT_FOUND : RW_E_IO, "cannot open %s: %s", path,
                strerror(errno));
    struct stat st;
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        RW_FAIL(err, RW_E_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        RW_FAIL(err, RW_E_IO, "%s is not a regular file (%s)", path, kind_of(st.st_mode));
    }
    /* reads of a regular file never block on O_NONBLOCK, but later users of the descriptor
     * (pread loops, stdio) should see a plain one */
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(f);
        RW_FAIL(err, RW_E_IO, "cannot set %s to blocking reads: %s", path, strerror(e));
    }
    if (sb) *sb = st;
    *fd = f;
    return RW_OK;
}

rw_status rw_read_regular_file(const char *path, size_t max_bytes, char **out, size_t *len,
                               rw_err *err) {
    *out = NULL;
    if (len) *len = 0;
    int fd;
    struct stat sb;
    RW_CHECK(rw_open_regular(path, &fd, &sb, err));
    if ((uint64_t)sb.st_size > max_bytes) {
        close(fd);
        RW_FAIL(err, RW_E_RANGE, "%s: %lld bytes (limit %zu)", path, (long long)sb.st_size,
                max_bytes);
    }
    /* read to the end, not to st_size: a file that grows meanwhile is cut at the limit */
    size_t cap = (size_t)sb.st_size + 1, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        RW_FAIL(err, RW_E_OOM, "out of memory reading %s", path);
    }
    for (;;) {
        if (n == cap) {
            if (cap > max_bytes) {
                free(buf);
                close(fd);
                RW_FAIL(err, RW_E_RANGE, "%s: more than %zu bytes", path, max_bytes);
            }
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                close(fd);
                RW_FAIL(err, RW_E_OOM, "out of memory reading %s", path);
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            RW_FAIL(err, RW_E_IO, "read error on %s: %s", path, strerror(e));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return RW_OK;
}
