"""cffi API-mode build script for ``ledgerd.native._native``.

setuptools runs this at install time (``cffi_modules`` in setup.py). The C
functions return ``-errno`` on failure instead of touching ``errno`` so the
Python side never races another thread for it. cffi releases the GIL around
every call into this module, so a long fdatasync or pwrite lets the rest of the
process run.
"""

from cffi import FFI

ffibuilder = FFI()

ffibuilder.cdef(
    """
    struct ldn_iovec { void *base; size_t len; };

    void   *ldn_alloc_aligned(size_t size, size_t alignment);
    void    ldn_free(void *ptr);
    int     ldn_open(const char *path, int flags, int mode, int direct);
    int     ldn_close(int fd);
    long long ldn_pwrite(int fd, const void *buf, size_t len, long long offset);
    long long ldn_pwrite_paced(int fd, const void *buf, size_t len, long long offset,
                               size_t piece, long long pause_ns);
    long long ldn_pwritev(int fd, const struct ldn_iovec *iov, int count, long long offset);
    long long ldn_pread(int fd, void *buf, size_t len, long long offset);
    int     ldn_fdatasync(int fd);
    int     ldn_fallocate(int fd, int mode, long long offset, long long len);
    int     ldn_fadvise_dontneed(int fd, long long offset, long long len);
    int     ldn_sync_file_range(int fd, long long offset, long long len, unsigned int flags);
    int     ldn_block_device_logical_size(int fd);
    int     ldn_fstat_dev(int fd, unsigned int *major_out, unsigned int *minor_out, int *is_blk);

    struct ldn_fault_rule { int op; int tag; long long skip; long long times; int err; int shorten; };
    int     ldn_fd_tag(int fd, int tag);
    int     ldn_faults_set(const struct ldn_fault_rule *rules, int count);
    long long ldn_faults_injected(void);
    #define LDN_FAULT_WRITE ...
    #define LDN_FAULT_SYNC ...
    #define LDN_FAULT_MAX_RULES ...
    #define LDN_FAULT_MAX_FD ...

    struct ldn_syncer;
    struct ldn_syncer *ldn_syncer_new(void);
    int     ldn_syncer_fd(struct ldn_syncer *s);
    int     ldn_syncer_submit(struct ldn_syncer *s, int fd, const void *buf, size_t len,
                              long long offset, int sync, int nsends, const int *send_fds,
                              void **send_bufs, const size_t *send_lens,
                              long long *send_sent);
    void    ldn_send_resume(int fd);
    void    ldn_send_stop(int fd);
    #define LDN_SEND_MAX_FD ...
    long long ldn_syncer_collect(struct ldn_syncer *s, long long *nanos);
    void    ldn_syncer_free(struct ldn_syncer *s);

    #define LDN_O_DIRECT ...
    #define LDN_SYNC_FILE_RANGE_WAIT_BEFORE ...
    #define LDN_SYNC_FILE_RANGE_WRITE ...
    #define LDN_SYNC_FILE_RANGE_WAIT_AFTER ...
    #define LDN_FALLOC_FL_KEEP_SIZE ...
    #define LDN_IOV_MAX ...
    """
)

ffibuilder.set_source(
    "ledgerd.native._native",
    r"""
    #ifndef _GNU_SOURCE
    #define _GNU_SOURCE
    #endif
    #include <errno.h>
    #include <fcntl.h>
    #include <limits.h>
    #include <stdlib.h>
    #include <string.h>
    #include <sys/ioctl.h>
    #include <sys/stat.h>
    #include <sys/sysmacros.h>
    #include <sys/types.h>
    #include <sys/uio.h>
    #include <linux/fs.h>
    #include <linux/falloc.h>
    #include <pthread.h>
    #include <signal.h>
    #include <stdint.h>
    #include <sys/eventfd.h>
    #include <sys/socket.h>
    #include <time.h>
    #include <unistd.h>

    #define LDN_O_DIRECT O_DIRECT
    #define LDN_SYNC_FILE_RANGE_WAIT_BEFORE SYNC_FILE_RANGE_WAIT_BEFORE
    #define LDN_SYNC_FILE_RANGE_WRITE SYNC_FILE_RANGE_WRITE
    #define LDN_SYNC_FILE_RANGE_WAIT_AFTER SYNC_FILE_RANGE_WAIT_AFTER
    #define LDN_FALLOC_FL_KEEP_SIZE FALLOC_FL_KEEP_SIZE
    #define LDN_IOV_MAX IOV_MAX

    struct ldn_iovec { void *base; size_t len; };

    /* Fault injection for tests (tests/faults, bench/soak.py): rules armed from Python
       make the next matching write fail with an errno or come back short (the loop
       below then writes the rest, as after a real short write), or a matching
       fdatasync fail. A rule matches an operation on a file whose tag it names (the
       journal and entry logs tag their files; 0 in a rule means any file), after
       skipping ``skip`` matches, for ``times`` matches. With no rules armed the check
       is one load of a counter. */
    #define LDN_FAULT_WRITE 1
    #define LDN_FAULT_SYNC 2
    #define LDN_FAULT_MAX_RULES 16
    #define LDN_FAULT_MAX_FD 65536
    struct ldn_fault_rule { int op; int tag; long long skip; long long times; int err; int shorten; };
    static unsigned char ldn_tags[LDN_FAULT_MAX_FD];
    static struct ldn_fault_rule ldn_rules[LDN_FAULT_MAX_RULES];
    static volatile int ldn_nrules = 0;
    static long long ldn_injected = 0;
    static pthread_mutex_t ldn_fault_lock = PTHREAD_MUTEX_INITIALIZER;

    static int ldn_fd_tag(int fd, int tag) {
        if (fd < 0 || fd >= LDN_FAULT_MAX_FD || tag < 0 || tag > 255) return -EINVAL;
        ldn_tags[fd] = (unsigned char)tag;
        return 0;
    }

    static int ldn_faults_set(const struct ldn_fault_rule *rules, int count) {
        if (count < 0 || count > LDN_FAULT_MAX_RULES) return -EINVAL;
        pthread_mutex_lock(&ldn_fault_lock);
        for (int i = 0; i < count; i++) ldn_rules[i] = rules[i];
        ldn_nrules = count;
        pthread_mutex_unlock(&ldn_fault_lock);
        return 0;
    }

    static long long ldn_faults_injected(void) {
        pthread_mutex_lock(&ldn_fault_lock);
        long long n = ldn_injected;
        pthread_mutex_unlock(&ldn_fault_lock);
        return n;
    }

    /* 0: no fault; < 0: fail with that -errno; > 0: write only that many bytes. */
    static long long ldn_fault_check(int op, int fd, size_t len) {
        if (ldn_nrules == 0) return 0;
        int tag = (fd >= 0 && fd < LDN_FAULT_MAX_FD) ? ldn_tags[fd] : 0;
        long long out = 0;
        pthread_mutex_lock(&ldn_fault_lock);
        for (int i = 0; i < ldn_nrules; i++) {
            struct ldn_fault_rule *r = &ldn_rules[i];
            if (r->op != op || r->times <= 0 || (r->tag != 0 && r->tag != tag)) continue;
            if (r->skip > 0) { r->skip--; continue; }
            if (r->shorten) {
                /* Half, in whole 4 KiB blocks (O_DIRECT files accept nothing else). */
                size_t part = (len / 2) & ~(size_t)4095;
                if (part == 0) continue;
                out = (long long)part;
            } else {
                out = -(long long)r->err;
            }
            r->times--;
            ldn_injected++;
            break;
        }
        pthread_mutex_unlock(&ldn_fault_lock);
        return out;
    }

    static void *ldn_alloc_aligned(size_t size, size_t alignment) {
        void *ptr = NULL;
        if (size == 0) size = alignment;
        if (posix_memalign(&ptr, alignment, size) != 0) return NULL;
        memset(ptr, 0, size);
        return ptr;
    }

    static void ldn_free(void *ptr) { free(ptr); }

    static int ldn_open(const char *path, int flags, int mode, int direct) {
        int fd;
        if (direct) flags |= O_DIRECT;
        do { fd = open(path, flags | O_CLOEXEC, mode); } while (fd < 0 && errno == EINTR);
        return fd < 0 ? -errno : fd;
    }

    static int ldn_close(int fd) {
        if (fd >= 0 && fd < LDN_FAULT_MAX_FD) ldn_tags[fd] = 0;
        return close(fd) < 0 ? -errno : 0;
    }

    /* Writes every byte or fails: a short write is retried from where it stopped. */
    static long long ldn_pwrite(int fd, const void *buf, size_t len, long long offset) {
        size_t done = 0;
        while (done < len) {
            size_t want = len - done;
            long long fault = ldn_fault_check(LDN_FAULT_WRITE, fd, want);
            if (fault < 0) return fault;
            if (fault > 0) want = (size_t)fault;
            ssize_t n = pwrite(fd, (const char *)buf + done, want, (off_t)(offset + done));
            if (n < 0) {
                if (errno == EINTR) continue;
                return -errno;
            }
            if (n == 0) return -EIO;
            done += (size_t)n;
        }
        return (long long)done;
    }

    /* ldn_pwrite in ``piece``-byte writes with a ``pause_ns`` sleep between them, in one
       call (so one GIL release): the journal's zeroer, whose writes each fdatasync of the
       journal flushes from the disk's cache along with its own records. */
    static long long ldn_pwrite_paced(int fd, const void *buf, size_t len, long long offset,
                                      size_t piece, long long pause_ns) {
        size_t done = 0;
        if (piece == 0) piece = len;
        while (done < len) {
            size_t want = len - done < piece ? len - done : piece;
            long long rc = ldn_pwrite(fd, (const char *)buf + done, want,
                                      offset + (long long)done);
            if (rc < 0) return rc;
            done += want;
            if (done < len && pause_ns > 0) {
                struct timespec ts = {pause_ns / 1000000000LL, pause_ns % 1000000000LL};
                while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
            }
        }
        return (long long)done;
    }

    static long long ldn_pwritev(int fd, const struct ldn_iovec *iov, int count, long long offset) {
        struct iovec local[IOV_MAX];
        long long total = 0;
        if (count < 0 || count > IOV_MAX) return -EINVAL;
        for (int i = 0; i < count; i++) {
            local[i].iov_base = iov[i].base;
            local[i].iov_len = iov[i].len;
            total += (long long)iov[i].len;
        }
        long long done = 0;
        int first = 0;
        long long fault = ldn_fault_check(LDN_FAULT_WRITE, fd, (size_t)total);
        if (fault < 0) return fault;
        while (done < total) {
            ssize_t n = pwritev(fd, local + first, count - first, (off_t)(offset + done));
            if (n < 0) {
                if (errno == EINTR) continue;
                return -errno;
            }
            if (n == 0) return -EIO;
            done += n;
            /* Advance past fully written vectors and trim a partly written one. */
            size_t left = (size_t)n;
            while (first < count && left >= local[first].iov_len) {
                left -= local[first].iov_len;
                first++;
            }
            if (first < count && left > 0) {
                local[first].iov_base = (char *)local[first].iov_base + left;
                local[first].iov_len -= left;
            }
        }
        return done;
    }

    static long long ldn_pread(int fd, void *buf, size_t len, long long offset) {
        size_t done = 0;
        while (done < len) {
            ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(offset + done));
            if (n < 0) {
                if (errno == EINTR) continue;
                return -errno;
            }
            if (n == 0) break;
            done += (size_t)n;
        }
        return (long long)done;
    }

    static int ldn_fdatasync(int fd) {
        long long fault = ldn_fault_check(LDN_FAULT_SYNC, fd, 0);
        if (fault < 0) return (int)fault;
        int rc;
        do { rc = fdatasync(fd); } while (rc < 0 && errno == EINTR);
        return rc < 0 ? -errno : 0;
    }

    /* The journal's syncer: one thread of its own that writes a group and fdatasyncs it
       without the GIL. A thread from Python's pool needs the GIL to start and again to
       return, and under load the event loop holds it, so each group cycle waited 1-3 ms
       for the GIL around a 0.3 ms sync (bench/latency.py). This thread never runs Python:
       it takes one job (the journal's group on this syncer), runs it, and signals an
       eventfd the event loop waits on. */
    struct ldn_syncer {
        pthread_mutex_t mu;
        pthread_cond_t cv;
        pthread_t thread;
        int efd, stop, has_job, done, sync;
        int fd;
        const void *buf;
        size_t len;
        long long offset, result, nanos;
        int nsends;
        const int *send_fds;
        void **send_bufs;
        const size_t *send_lens;
        long long *send_sent;
    };

    /* Replies sent by a syncer right after its group is durable (the connection hub's
       adds): no event-loop pass between the sync and the reply. A send that does not
       take everything stops that socket here: later groups' bytes for it are left
       unsent (reported as such) until Python, having sent the rest in order, resumes
       it. One table for every syncer, indexed by descriptor. */
    #define LDN_SEND_MAX_FD 65536
    static unsigned char ldn_send_stopped[LDN_SEND_MAX_FD];

    static void ldn_send_resume(int fd) {
        if (fd >= 0 && fd < LDN_SEND_MAX_FD) __atomic_store_n(&ldn_send_stopped[fd], 0, __ATOMIC_RELEASE);
    }

    static void ldn_send_stop(int fd) {
        if (fd >= 0 && fd < LDN_SEND_MAX_FD) __atomic_store_n(&ldn_send_stopped[fd], 1, __ATOMIC_RELEASE);
    }

    static void ldn_send_replies(int n, const int *fds, void **bufs, const size_t *lens,
                                 long long *sent) {
        for (int i = 0; i < n; i++) {
            int fd = fds[i];
            size_t done = 0;
            if (fd >= 0 && fd < LDN_SEND_MAX_FD
                    && !__atomic_load_n(&ldn_send_stopped[fd], __ATOMIC_ACQUIRE)) {
                const char *p = (const char *)bufs[i];
                while (done < lens[i]) {
                    ssize_t w = send(fd, p + done, lens[i] - done, MSG_DONTWAIT | MSG_NOSIGNAL);
                    if (w < 0) {
                        if (errno == EINTR) continue;
                        break;
                    }
                    done += (size_t)w;
                }
            }
            if (done < lens[i] && fd >= 0 && fd < LDN_SEND_MAX_FD)
                __atomic_store_n(&ldn_send_stopped[fd], 1, __ATOMIC_RELEASE);
            sent[i] = (long long)done;
        }
    }

    static long long ldn_now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }

    static void *ldn_syncer_main(void *arg) {
        struct ldn_syncer *s = (struct ldn_syncer *)arg;
        pthread_mutex_lock(&s->mu);
        for (;;) {
            while (!s->has_job && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
            if (!s->has_job) break;
            int fd = s->fd, sync = s->sync;
            const void *buf = s->buf;
            size_t len = s->len;
            long long offset = s->offset;
            int nsends = s->nsends;
            pthread_mutex_unlock(&s->mu);
            long long t0 = ldn_now_ns();
            long long rc = ldn_pwrite(fd, buf, len, offset);
            if (rc >= 0) rc = sync ? ldn_fdatasync(fd) : 0;
            long long t1 = ldn_now_ns();
            /* Only what is durable is answered: a failed group's replies stay unsent. */
            if (rc == 0 && nsends > 0)
                ldn_send_replies(nsends, s->send_fds, s->send_bufs, s->send_lens, s->send_sent);
            pthread_mutex_lock(&s->mu);
            s->result = rc;
            s->nanos = t1 - t0;
            s->has_job = 0;
            s->done = 1;
            uint64_t one = 1;
            ssize_t w;
            do { w = write(s->efd, &one, sizeof one); } while (w < 0 && errno == EINTR);
        }
        pthread_mutex_unlock(&s->mu);
        return NULL;
    }

    static struct ldn_syncer *ldn_syncer_new(void) {
        struct ldn_syncer *s = calloc(1, sizeof *s);
        if (s == NULL) return NULL;
        s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (s->efd < 0) { free(s); return NULL; }
        pthread_mutex_init(&s->mu, NULL);
        pthread_cond_init(&s->cv, NULL);
        /* Signals stay with Python's threads: the syncer starts with all blocked. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int rc = pthread_create(&s->thread, NULL, ldn_syncer_main, s);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc != 0) {
            close(s->efd);
            free(s);
            return NULL;
        }
        return s;
    }

    static int ldn_syncer_fd(struct ldn_syncer *s) { return s->efd; }

    /* 0: taken; -EBUSY: a job is in flight or its result was not collected. */
    static int ldn_syncer_submit(struct ldn_syncer *s, int fd, const void *buf, size_t len,
                                 long long offset, int sync, int nsends, const int *send_fds,
                                 void **send_bufs, const size_t *send_lens,
                                 long long *send_sent) {
        pthread_mutex_lock(&s->mu);
        if (s->has_job || s->done || s->stop) {
            pthread_mutex_unlock(&s->mu);
            return -EBUSY;
        }
        s->fd = fd;
        s->buf = buf;
        s->len = len;
        s->offset = offset;
        s->sync = sync;
        s->nsends = nsends;
        s->send_fds = send_fds;
        s->send_bufs = send_bufs;
        s->send_lens = send_lens;
        s->send_sent = send_sent;
        s->has_job = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        return 0;
    }

    /* The finished job's result (0 or -errno) and its write + sync time; 1 while it
       runs (or if there is none). Clears the eventfd. */
    static long long ldn_syncer_collect(struct ldn_syncer *s, long long *nanos) {
        pthread_mutex_lock(&s->mu);
        long long rc = 1;
        if (s->done) {
            rc = s->result;
            *nanos = s->nanos;
            s->done = 0;
            uint64_t count;
            ssize_t r;
            do { r = read(s->efd, &count, sizeof count); } while (r < 0 && errno == EINTR);
        }
        pthread_mutex_unlock(&s->mu);
        return rc;
    }

    static void ldn_syncer_free(struct ldn_syncer *s) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        close(s->efd);
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
    }

    static int ldn_fallocate(int fd, int mode, long long offset, long long len) {
        int rc;
        do { rc = fallocate(fd, mode, (off_t)offset, (off_t)len); } while (rc < 0 && errno == EINTR);
        return rc < 0 ? -errno : 0;
    }

    static int ldn_fadvise_dontneed(int fd, long long offset, long long len) {
        /* posix_fadvise returns the error number instead of setting errno. */
        int rc = posix_fadvise(fd, (off_t)offset, (off_t)len, POSIX_FADV_DONTNEED);
        return rc == 0 ? 0 : -rc;
    }

    static int ldn_sync_file_range(int fd, long long offset, long long len, unsigned int flags) {
        int rc;
        do { rc = sync_file_range(fd, (off64_t)offset, (off64_t)len, flags); } while (rc < 0 && errno == EINTR);
        return rc < 0 ? -errno : 0;
    }

    static int ldn_block_device_logical_size(int fd) {
        int size = 0;
        if (ioctl(fd, BLKSSZGET, &size) < 0) return -errno;
        return size;
    }

    static int ldn_fstat_dev(int fd, unsigned int *major_out, unsigned int *minor_out, int *is_blk) {
        struct stat st;
        if (fstat(fd, &st) < 0) return -errno;
        if (S_ISBLK(st.st_mode)) {
            *major_out = major(st.st_rdev);
            *minor_out = minor(st.st_rdev);
            *is_blk = 1;
        } else {
            *major_out = major(st.st_dev);
            *minor_out = minor(st.st_dev);
            *is_blk = 0;
        }
        return 0;
    }
    """,
    extra_compile_args=["-O2", "-Wall", "-Werror"],
    # A failed compile (no C compiler on a client-only host) does not fail the install:
    # the client never imports this module, and a bookie says what is missing.
    optional=True,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
