/* probe.c - rw_client_probe: is anything listening at a control address? ZeroMQ connects in the
 * background and retries forever, so a client pointed at the wrong address would otherwise wait
 * for its reply timeout in silence; command-line tools probe first and say what is wrong. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rw_client.h"

static rw_status probe_tcp(const char *addr, const char *hp, int timeout_ms, rw_err *err) {
    char host[256];
    const char *colon = strrchr(hp, ':');
    if (!colon || colon == hp || (size_t)(colon - hp) >= sizeof host)
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: expected tcp://HOST:PORT", addr);
    memcpy(host, hp, (size_t)(colon - hp));
    host[colon - hp] = 0;
    if (host[0] == '[') { /* [v6] */
        size_t n = strlen(host);
        memmove(host, host + 1, n);
        if (n >= 2 && host[n - 2] == ']') host[n - 2] = 0;
    }
    if (!strcmp(host, "*") || !strcmp(host, "0.0.0.0")) snprintf(host, sizeof host, "127.0.0.1");
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc || !res)
        RW_FAIL(err, RW_E_ZMQ, "%s: cannot resolve '%s': %s", addr, host, gai_strerror(rc));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        RW_FAIL(err, RW_E_ZMQ, "%s: socket: %s", addr, strerror(errno));
    }
    int e = 0;
    if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        e = errno;
        if (e == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int n = poll(&p, 1, timeout_ms);
            if (n == 0) {
                e = ETIMEDOUT;
            } else {
                socklen_t len = sizeof e;
                e = 0;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len);
            }
        }
    }
    close(fd);
    freeaddrinfo(res);
    if (e == ETIMEDOUT)
        RW_FAIL(err, RW_E_ZMQ,
                "nothing answers at %s within %d ms (a firewall, or a host that is down)", addr,
                timeout_ms);
    if (e)
        RW_FAIL(err, RW_E_ZMQ,
                "nothing listens at %s (%s): is rw-worker running there? (its ready "
                "line names its control address)",
                addr, strerror(e));
    return RW_OK;
}

rw_status rw_client_probe(const char *addr, int timeout_ms, rw_err *err) {
    if (!strncmp(addr, "tcp://", 6)) return probe_tcp(addr, addr + 6, timeout_ms, err);
    if (!strncmp(addr, "ipc://", 6)) {
        struct stat st;
        if (stat(addr + 6, &st) != 0)
            RW_FAIL(err, RW_E_ZMQ, "nothing listens at %s (%s): is rw-worker running there?", addr,
                    strerror(errno));
        if (!S_ISSOCK(st.st_mode)) RW_FAIL(err, RW_E_ZMQ, "%s: %s is not a socket", addr, addr + 6);
    }
    return RW_OK;
}
