"""cffi API-mode build script for ``native._native``.

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
    long long ldn_pwritev(int fd, const struct ldn_iovec *iov, int count, long long offset);
    long long ldn_pread(int fd, void *buf, size_t len, long long offset);
    int     ldn_fdatasync(int fd);
    int     ldn_fallocate(int fd, int mode, long long offset, long long len);
    int     ldn_fadvise_dontneed(int fd, long long offset, long long len);
    int     ldn_sync_file_range(int fd, long long offset, long long len, unsigned int flags);
    int     ldn_block_device_logical_size(int fd);
    int     ldn_fstat_dev(int fd, unsigned int *major_out, unsigned int *minor_out, int *is_blk);

    #define LDN_O_DIRECT ...
    #define LDN_SYNC_FILE_RANGE_WAIT_BEFORE ...
    #define LDN_SYNC_FILE_RANGE_WRITE ...
    #define LDN_SYNC_FILE_RANGE_WAIT_AFTER ...
    #define LDN_FALLOC_FL_KEEP_SIZE ...
    #define LDN_IOV_MAX ...
    """
)

ffibuilder.set_source(
    "native._native",
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
    #include <unistd.h>

    #define LDN_O_DIRECT O_DIRECT
    #define LDN_SYNC_FILE_RANGE_WAIT_BEFORE SYNC_FILE_RANGE_WAIT_BEFORE
    #define LDN_SYNC_FILE_RANGE_WRITE SYNC_FILE_RANGE_WRITE
    #define LDN_SYNC_FILE_RANGE_WAIT_AFTER SYNC_FILE_RANGE_WAIT_AFTER
    #define LDN_FALLOC_FL_KEEP_SIZE FALLOC_FL_KEEP_SIZE
    #define LDN_IOV_MAX IOV_MAX

    struct ldn_iovec { void *base; size_t len; };

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
        return close(fd) < 0 ? -errno : 0;
    }

    /* Writes every byte or fails: a short write is retried from where it stopped. */
    static long long ldn_pwrite(int fd, const void *buf, size_t len, long long offset) {
        size_t done = 0;
        while (done < len) {
            ssize_t n = pwrite(fd, (const char *)buf + done, len - done, (off_t)(offset + done));
            if (n < 0) {
                if (errno == EINTR) continue;
                return -errno;
            }
            if (n == 0) return -EIO;
            done += (size_t)n;
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
        int rc;
        do { rc = fdatasync(fd); } while (rc < 0 && errno == EINTR);
        return rc < 0 ? -errno : 0;
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
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
