/* A load driver for one bookie, or for Redis, in C, like redis-benchmark is for Redis.

   A Python driver (bench/drivers.py) costs the machine most of a core at 64 connections
   x 1 add, CPU the bookie then does not have, while redis-benchmark, C over epoll, costs
   Redis a few percent. This driver does the same work as drivers.closed_loop /
   drivers.open_loop: patched copies of one template Add frame (made by Python from the
   real codec), replies parsed by header only.

     adddriver closed       PORT CONNS WINDOW SECONDS WARMUP LEDGER_BASE HEX ENTRY_OFFSET
     adddriver open         PORT CONNS RATE   SECONDS LEDGER_BASE HEX ENTRY_OFFSET
     adddriver redis-closed PORT CONNS WINDOW SECONDS WARMUP STREAM
     adddriver redis-open   PORT CONNS RATE   SECONDS STREAM

   HEX is the template frame (size prefix included); ENTRY_OFFSET is where its one
   entry starts (its ledger id, then its entry id). The frame's correlation id is at 8,
   its ledger id at 12, its first entry id at 20. Each connection writes a ledger of
   its own, LEDGER_BASE + its index; replies come back in order per connection.

   The redis modes send, instead of an Add frame, `XADD STREAM * f <1 KiB value>` in
   RESP (every connection to the one STREAM), with the same schedule and connections.
   Redis answers in order per connection, so the n-th reply of a connection is its n-th
   command; a bulk string (the new entry's id) counts as done, anything else (an error
   reply, a null) as an error.

   closed: WINDOW adds in flight per connection (refilled at half), counts the replies
   that arrive in SECONDS after WARMUP. open: adds due every 1/RATE s round-robin over
   the connections, latency from the due time (no coordinated omission); the wait for
   the next due time has nanosecond resolution (epoll_pwait2), so the driver itself adds
   no millisecond rounding to the latencies.

   Prints one JSON line: entries_per_s, errors, entries, p50_ms, p99_ms, p999_ms, max_ms.
   Built by bench/cdriver.py with the system's cc; it stops by itself (a bound of 30 s
   past the schedule for the open loop). */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RBUF (1 << 20)
#define VALUE_SIZE 1024

typedef struct {
    int fd;
    int64_t next_cid;
    int64_t next_entry;
    int64_t acked;          /* replies taken (closed: in order, cid == acked) */
    double *sent;           /* closed: ring of send times by cid % window;
                               open: due time by cid (one slot per add of this conn) */
    unsigned char *rbuf;
    size_t rlen;
} conn_t;

static unsigned char *tmpl;
static size_t tmpl_len;
static long entry_off;
static int redis;           /* the redis modes: tmpl is the XADD command, sent as is */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what) {
    fprintf(stderr, "adddriver: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void put64(unsigned char *p, int64_t v) {
    for (int i = 7; i >= 0; i--) { p[i] = (unsigned char)(v & 0xff); v >>= 8; }
}

static void put32(unsigned char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = u >> 24; p[1] = u >> 16; p[2] = u >> 8; p[3] = u;
}

static int32_t get32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
}

static int16_t get16(const unsigned char *p) { return (int16_t)(p[0] << 8 | p[1]); }

static void make(unsigned char *out, int32_t cid, int64_t ledger, int64_t entry) {
    memcpy(out, tmpl, tmpl_len);
    if (redis) return;
    put32(out + 8, cid);
    put64(out + 12, ledger);
    put64(out + 20, entry);
    put64(out + entry_off, ledger);
    put64(out + entry_off + 8, entry);
}

static void send_all(int fd, const unsigned char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
                continue;
            }
            die("send");
        }
        p += k;
        n -= (size_t)k;
    }
}

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (fcntl(fd, F_SETFL, O_NONBLOCK) < 0) die("fcntl");
    return fd;
}

/* Latencies: a growable array of seconds. */
static double *lat;
static size_t nlat, caplat;

static void keep(double v) {
    if (nlat == caplat) {
        caplat = caplat ? caplat * 2 : 1 << 16;
        lat = realloc(lat, caplat * sizeof *lat);
        if (!lat) die("realloc");
    }
    lat[nlat++] = v;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The closed loop's longest wait for a reply with adds in flight, and how many were in
   flight when it ended: a stall is reported as data, not as a low rate alone. */
static double max_gap = 0;
static long gap_inflight = 0;

static void report(double per_s, long errors) {
    qsort(lat, nlat, sizeof *lat, cmp);
    double p50 = 0, p99 = 0, p999 = 0, mx = 0;
    if (nlat) {
        p50 = lat[nlat / 2];
        p99 = lat[(size_t)(nlat * 0.99)];
        size_t i999 = (size_t)(nlat * 0.999);
        p999 = lat[i999 < nlat ? i999 : nlat - 1];
        mx = lat[nlat - 1];
    }
    printf("{\"entries_per_s\": %.1f, \"errors\": %ld, \"entries\": %zu, \"p50_ms\": %.4f, "
           "\"p99_ms\": %.4f, \"p999_ms\": %.4f, \"max_ms\": %.4f, \"max_gap_ms\": %.4f, "
           "\"gap_inflight\": %ld}\n",
           per_s, errors, nlat, p50 * 1e3, p99 * 1e3, p999 * 1e3, mx * 1e3, max_gap * 1e3,
           gap_inflight);
}

/* The RESP reply starting at p (n bytes there): its length, or 0 while incomplete;
   *status is 0 for a bulk string (XADD's new id), 1 for anything else. */
static size_t resp_reply(const unsigned char *p, size_t n, int16_t *status) {
    const unsigned char *eol = memmem(p, n, "\r\n", 2);
    if (!eol) return 0;
    size_t line = (size_t)(eol - p) + 2;
    switch (p[0]) {
    case '$': {
        long len = 0;
        int neg = p[1] == '-';
        for (const unsigned char *q = p + 1 + neg; q < eol; q++) {
            if (*q < '0' || *q > '9') { fprintf(stderr, "adddriver: bad RESP length\n"); exit(2); }
            len = len * 10 + (*q - '0');
        }
        if (neg) { *status = 1; return line; }  /* a null bulk string */
        if (line + (size_t)len + 2 > n) return 0;
        *status = 0;
        return line + (size_t)len + 2;
    }
    case '-': case '+': case ':':
        *status = 1;
        return line;
    default:
        fprintf(stderr, "adddriver: unexpected RESP reply type '%c'\n", p[0]);
        exit(2);
    }
}

/* One recv (epoll is level-triggered: more data wakes us again), then hand each whole
   reply (cid, status) to take(). A Redis reply's cid is its place in the connection's
   order (the replies taken before it). */
static void drain(conn_t *c, void (*take)(conn_t *, int32_t, int16_t, double), double *t) {
    ssize_t k = recv(c->fd, c->rbuf + c->rlen, RBUF - c->rlen, 0);
    if (k == 0) { fprintf(stderr, "adddriver: the server closed a connection\n"); exit(2); }
    if (k < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        die("recv");
    }
    c->rlen += (size_t)k;
    *t = now_s();
    size_t pos = 0;
    while (redis) {
        int16_t status;
        size_t len = resp_reply(c->rbuf + pos, c->rlen - pos, &status);
        if (!len) break;
        take(c, (int32_t)c->acked, status, *t);
        pos += len;
    }
    while (!redis && pos + 4 <= c->rlen) {
        int32_t size = get32(c->rbuf + pos);
        if (size < 6) { fprintf(stderr, "adddriver: bad reply size %d\n", size); exit(2); }
        if (pos + 4 + (size_t)size > c->rlen) break;
        take(c, get32(c->rbuf + pos + 4), get16(c->rbuf + pos + 8), *t);
        pos += 4 + (size_t)size;
    }
    memmove(c->rbuf, c->rbuf + pos, c->rlen - pos);
    c->rlen -= pos;
}

/* -- closed loop ------------------------------------------------------------------- */

static long window;
static double t_start, t_end;
static long acked_in, errors;

static void take_closed(conn_t *c, int32_t cid, int16_t status, double t) {
    double t0 = c->sent[cid % window];
    c->acked++;
    if (t >= t_start && t < t_end) {
        if (status) errors++;
        else { acked_in++; keep(t - t0); }
    }
}

static void refill(conn_t *c, long ledger, unsigned char *out) {
    long n = window - (long)(c->next_cid - c->acked);
    if (n <= 0) return;
    double t = now_s();
    for (long i = 0; i < n; i++) {
        make(out + i * tmpl_len, (int32_t)c->next_cid, ledger, c->next_entry);
        c->sent[c->next_cid % window] = t;
        c->next_cid++;
        c->next_entry++;
    }
    send_all(c->fd, out, (size_t)n * tmpl_len);
}

/* ``conns`` connections in one epoll set, each with ``slots`` send-time slots. */
static conn_t *open_conns(int port, int conns, long slots, int *ep) {
    *ep = epoll_create1(0);
    if (*ep < 0) die("epoll_create1");
    conn_t *cs = calloc((size_t)conns, sizeof *cs);
    if (!cs) die("alloc");
    for (int i = 0; i < conns; i++) {
        cs[i].fd = connect_to(port);
        cs[i].sent = calloc((size_t)slots, sizeof(double));
        cs[i].rbuf = malloc(RBUF);
        if (!cs[i].sent || !cs[i].rbuf) die("alloc");
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        if (epoll_ctl(*ep, EPOLL_CTL_ADD, cs[i].fd, &ev) < 0) die("epoll_ctl");
    }
    return cs;
}

static int closed_loop(int port, int conns, double seconds, double warmup, long base) {
    int ep;
    conn_t *cs = open_conns(port, conns, window, &ep);
    unsigned char *out = malloc((size_t)window * tmpl_len);
    if (!out) die("alloc");
    t_start = now_s() + warmup;
    t_end = t_start + seconds;
    for (int i = 0; i < conns; i++) refill(&cs[i], base + i, out);
    struct epoll_event evs[256];
    double last_reply = now_s();
    for (;;) {
        double t = now_s();
        if (t >= t_end) break;
        int ms = (int)((t_end - t) * 1000) + 1;
        int n = epoll_wait(ep, evs, 256, ms < 100 ? ms : 100);
        if (n < 0 && errno != EINTR) die("epoll_wait");
        for (int k = 0; k < n; k++) {
            conn_t *c = &cs[evs[k].data.u32];
            int64_t before = c->acked;
            long pending = 0;  /* in flight while the silence lasted, before this drain */
            for (int i = 0; i < conns; i++) pending += (long)(cs[i].next_cid - cs[i].acked);
            drain(c, take_closed, &t);
            if (c->acked > before) {
                if (t - last_reply > max_gap) {
                    max_gap = t - last_reply;
                    gap_inflight = pending;
                }
                last_reply = t;
            }
            if (t < t_end && c->next_cid - c->acked <= window / 2)
                refill(c, base + (long)evs[k].data.u32, out);
        }
    }
    report(acked_in / seconds, errors);
    return 0;
}

/* -- open loop --------------------------------------------------------------------- */

static long got_open;

static void take_open(conn_t *c, int32_t cid, int16_t status, double t) {
    got_open++;
    c->acked++;
    if (status) errors++;
    else keep(t - c->sent[cid]);
}

static int wait_until(int ep, struct epoll_event *evs, double due) {
    double d = due - now_s();
    if (d < 0) d = 0;
    struct timespec ts = {(time_t)d, (long)((d - (time_t)d) * 1e9)};
    int n = epoll_pwait2(ep, evs, 256, &ts, NULL);
    if (n < 0 && errno == ENOSYS) {  /* before Linux 5.11: millisecond timeouts */
        n = epoll_wait(ep, evs, 256, (int)(d * 1000));
    }
    return n;
}

static int open_loop(int port, int conns, double rate, double seconds, long base) {
    long total = (long)(rate * seconds);
    long per_conn = total / conns + 2;
    int ep;
    conn_t *cs = open_conns(port, conns, per_conn, &ep);
    double interval = 1.0 / rate;
    double t0 = now_s() + 0.2;
    double deadline = t0 + seconds + 30;
    long sent = 0;
    size_t *used = calloc((size_t)conns, sizeof(size_t));
    unsigned char **bufs = calloc((size_t)conns, sizeof *bufs);
    for (int i = 0; i < conns; i++) bufs[i] = malloc(4096 * tmpl_len);
    struct epoll_event evs[256];
    while (got_open < total) {
        double t = now_s();
        if (t > deadline) {
            fprintf(stderr, "adddriver: %ld adds unanswered 30 s after the schedule\n",
                    total - got_open);
            return 2;
        }
        long due_n = t >= t0 ? (long)((t - t0) / interval) + 1 : 0;
        if (due_n > total) due_n = total;
        while (sent < due_n) {
            for (int i = 0; i < conns; i++) used[i] = 0;
            long stop = due_n - sent > 4096 ? sent + 4096 : due_n;
            for (long k = sent; k < stop; k++) {
                int i = (int)(k % conns);
                conn_t *c = &cs[i];
                c->sent[c->next_cid] = t0 + k * interval;
                make(bufs[i] + used[i], (int32_t)c->next_cid, base + i, c->next_entry);
                used[i] += tmpl_len;
                c->next_cid++;
                c->next_entry++;
            }
            sent = stop;
            for (int i = 0; i < conns; i++)
                if (used[i]) send_all(cs[i].fd, bufs[i], used[i]);
        }
        double next = sent < total ? t0 + sent * interval : now_s() + 0.1;
        int n = wait_until(ep, evs, next);
        if (n < 0 && errno != EINTR) die("epoll_pwait2");
        for (int k = 0; k < n; k++) drain(&cs[evs[k].data.u32], take_open, &t);
    }
    report(rate, errors);
    return 0;
}

static unsigned char *from_hex(const char *h, size_t *n) {
    size_t len = strlen(h);
    if (len % 2) { fprintf(stderr, "adddriver: odd hex length\n"); exit(2); }
    unsigned char *b = malloc(len / 2);
    for (size_t i = 0; i < len / 2; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1) { fprintf(stderr, "adddriver: bad hex\n"); exit(2); }
        b[i] = (unsigned char)v;
    }
    *n = len / 2;
    return b;
}

/* `XADD STREAM * f <VALUE_SIZE bytes>` in RESP: the redis modes' one command. */
static void xadd_template(const char *stream) {
    size_t slen = strlen(stream);
    tmpl = malloc(slen + VALUE_SIZE + 128);
    if (!tmpl) die("alloc");
    int n = sprintf((char *)tmpl, "*5\r\n$4\r\nXADD\r\n$%zu\r\n%s\r\n$1\r\n*\r\n$1\r\nf\r\n"
                    "$%d\r\n", slen, stream, VALUE_SIZE);
    memset(tmpl + n, 'x', VALUE_SIZE);
    memcpy(tmpl + n + VALUE_SIZE, "\r\n", 2);
    tmpl_len = (size_t)n + VALUE_SIZE + 2;
    redis = 1;
}

int main(int argc, char **argv) {
    if (argc == 10 && !strcmp(argv[1], "closed")) {
        window = atol(argv[4]);
        tmpl = from_hex(argv[8], &tmpl_len);
        entry_off = atol(argv[9]);
        if (window < 1 || entry_off < 28 || (size_t)entry_off + 16 > tmpl_len) {
            fprintf(stderr, "adddriver: bad window or entry offset\n");
            return 2;
        }
        return closed_loop(atoi(argv[2]), atoi(argv[3]), atof(argv[5]), atof(argv[6]),
                           atol(argv[7]));
    }
    if (argc == 9 && !strcmp(argv[1], "open")) {
        tmpl = from_hex(argv[7], &tmpl_len);
        entry_off = atol(argv[8]);
        if (entry_off < 28 || (size_t)entry_off + 16 > tmpl_len || atof(argv[4]) <= 0) {
            fprintf(stderr, "adddriver: bad rate or entry offset\n");
            return 2;
        }
        return open_loop(atoi(argv[2]), atoi(argv[3]), atof(argv[4]), atof(argv[5]),
                         atol(argv[6]));
    }
    if (argc == 8 && !strcmp(argv[1], "redis-closed") && argv[7][0]) {
        window = atol(argv[4]);
        if (window < 1) { fprintf(stderr, "adddriver: bad window\n"); return 2; }
        xadd_template(argv[7]);
        return closed_loop(atoi(argv[2]), atoi(argv[3]), atof(argv[5]), atof(argv[6]), 0);
    }
    if (argc == 7 && !strcmp(argv[1], "redis-open") && argv[6][0]) {
        if (atof(argv[4]) <= 0) { fprintf(stderr, "adddriver: bad rate\n"); return 2; }
        xadd_template(argv[6]);
        return open_loop(atoi(argv[2]), atoi(argv[3]), atof(argv[4]), atof(argv[5]), 0);
    }
    fprintf(stderr, "usage: adddriver closed PORT CONNS WINDOW SECONDS WARMUP LEDGER_BASE "
                    "HEX ENTRY_OFFSET\n       adddriver open PORT CONNS RATE SECONDS "
                    "LEDGER_BASE HEX ENTRY_OFFSET\n       adddriver redis-closed PORT CONNS "
                    "WINDOW SECONDS WARMUP STREAM\n       adddriver redis-open PORT CONNS "
                    "RATE SECONDS STREAM\n");
    return 2;
}
