/* The chaos harness's disk faults, interposed under a broker process with LD_PRELOAD.
 *
 * cli/chaos/disk.py compiles this file (gcc -shared -fPIC) and starts every broker with
 * LD_PRELOAD pointing at the result and RMQ_CHAOS_DISK_CONTROL naming a control file of its
 * own.  The file holds one word and an optional number:
 *
 *   ok            every call goes straight to libc (also: no file, an empty file, no env var)
 *   slow SECONDS  fsync, fdatasync, msync and sync_file_range sleep SECONDS, then run
 *   full          posix_fallocate(64) returns ENOSPC, fallocate(64) fails with errno ENOSPC,
 *                 and statvfs(64) / fstatvfs(64) report the filesystem 95% used
 *
 * The harness replaces the file atomically (rename), and every interposed call stats it and
 * re-reads it only when its inode, size or mtime changed, so a fault switches on and off
 * within one call while a run goes on, for the cost of one stat per call.
 *
 * What "full" does not do: write(2) and stores through a mapping still succeed, because the
 * real disk is not full.  The broker takes its filesystem blocks with posix_fallocate before
 * any mapped write (broker/store/mapped_file.py) and measures the disk with statvfs
 * (clean_service.py, DLedger's disk check), so those two are where it learns of a full disk;
 * log lines and config files written with plain write(2) are not refused.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

enum mode { MODE_OK, MODE_SLOW, MODE_FULL };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* the control file as last read, and what it said (guarded by lock) */
static ino_t seen_ino;
static off_t seen_size = -1;
static struct timespec seen_mtime;
static enum mode cur_mode = MODE_OK;
static double cur_delay;

/* libc's own function of that name.  Each wrapper looks it up on its first call; two threads
 * racing there store the same pointer, so no lock is needed. */
static void *next(const char *name) {
    void *fn = dlsym(RTLD_NEXT, name);
    if (fn == NULL) {
        fprintf(stderr, "chaos disk shim: no %s after the shim\n", name);
        abort();
    }
    return fn;
}

/* The mode now, and the delay for "slow"; re-reads the control file only when it changed. */
static enum mode current(double *delay) {
    const char *path = getenv("RMQ_CHAOS_DISK_CONTROL");
    struct stat st;
    if (path == NULL || stat(path, &st) != 0) {
        *delay = 0;
        return MODE_OK;
    }
    pthread_mutex_lock(&lock);
    if (st.st_ino != seen_ino || st.st_size != seen_size ||
        st.st_mtim.tv_sec != seen_mtime.tv_sec || st.st_mtim.tv_nsec != seen_mtime.tv_nsec) {
        char buf[64] = {0};
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
        if (fd >= 0)
            close(fd);
        cur_mode = MODE_OK;
        cur_delay = 0;
        if (n > 0) {
            buf[n] = 0;
            if (strncmp(buf, "slow", 4) == 0) {
                cur_mode = MODE_SLOW;
                cur_delay = strtod(buf + 4, NULL);
            } else if (strncmp(buf, "full", 4) == 0) {
                cur_mode = MODE_FULL;
            }
        }
        seen_ino = st.st_ino;
        seen_size = st.st_size;
        seen_mtime = st.st_mtim;
    }
    enum mode m = cur_mode;
    *delay = cur_delay;
    pthread_mutex_unlock(&lock);
    return m;
}

static void maybe_sleep(void) {
    double delay;
    if (current(&delay) != MODE_SLOW || delay <= 0)
        return;
    struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int is_full(void) {
    double delay;
    return current(&delay) == MODE_FULL;
}

/* ---- slow: the calls that wait for the disk ------------------------------------------- */

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL)
        real = next("fsync");
    int saved = errno;
    maybe_sleep();
    errno = saved;
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL)
        real = next("fdatasync");
    int saved = errno;
    maybe_sleep();
    errno = saved;
    return real(fd);
}

int msync(void *addr, size_t length, int flags) {
    static int (*real)(void *, size_t, int);
    if (real == NULL)
        real = next("msync");
    int saved = errno;
    if (flags & MS_SYNC)  /* MS_ASYNC only schedules the write-back: it never waited */
        maybe_sleep();
    errno = saved;
    return real(addr, length, flags);
}

int sync_file_range(int fd, off64_t offset, off64_t nbytes, unsigned int flags) {
    static int (*real)(int, off64_t, off64_t, unsigned int);
    if (real == NULL)
        real = next("sync_file_range");
    int saved = errno;
    maybe_sleep();
    errno = saved;
    return real(fd, offset, nbytes, flags);
}

/* ---- full: no blocks to reserve, and a disk that looks full ---------------------------- */

int posix_fallocate(int fd, off_t offset, off_t len) {
    static int (*real)(int, off_t, off_t);
    if (real == NULL)
        real = next("posix_fallocate");
    return is_full() ? ENOSPC : real(fd, offset, len);  /* returns the error, errno untouched */
}

int posix_fallocate64(int fd, off64_t offset, off64_t len) {
    static int (*real)(int, off64_t, off64_t);
    if (real == NULL)
        real = next("posix_fallocate64");
    return is_full() ? ENOSPC : real(fd, offset, len);
}

int fallocate(int fd, int mode, off_t offset, off_t len) {
    static int (*real)(int, int, off_t, off_t);
    if (real == NULL)
        real = next("fallocate");
    if (is_full()) {
        errno = ENOSPC;
        return -1;
    }
    return real(fd, mode, offset, len);
}

int fallocate64(int fd, int mode, off64_t offset, off64_t len) {
    static int (*real)(int, int, off64_t, off64_t);
    if (real == NULL)
        real = next("fallocate64");
    if (is_full()) {
        errno = ENOSPC;
        return -1;
    }
    return real(fd, mode, offset, len);
}

/* 95% used: RocketMQ's ratio is (blocks - free) / blocks, over the 0.90 refusal line */
#define FILL(buf)                                        \
    do {                                                 \
        if (rc == 0 && is_full()) {                      \
            (buf)->f_bfree = (buf)->f_blocks / 20;       \
            (buf)->f_bavail = (buf)->f_blocks / 20;      \
        }                                                \
    } while (0)

int statvfs(const char *path, struct statvfs *buf) {
    static int (*real)(const char *, struct statvfs *);
    if (real == NULL)
        real = next("statvfs");
    int rc = real(path, buf);
    FILL(buf);
    return rc;
}

int statvfs64(const char *path, struct statvfs64 *buf) {
    static int (*real)(const char *, struct statvfs64 *);
    if (real == NULL)
        real = next("statvfs64");
    int rc = real(path, buf);
    FILL(buf);
    return rc;
}

int fstatvfs(int fd, struct statvfs *buf) {
    static int (*real)(int, struct statvfs *);
    if (real == NULL)
        real = next("fstatvfs");
    int rc = real(fd, buf);
    FILL(buf);
    return rc;
}

int fstatvfs64(int fd, struct statvfs64 *buf) {
    static int (*real)(int, struct statvfs64 *);
    if (real == NULL)
        real = next("fstatvfs64");
    int rc = real(fd, buf);
    FILL(buf);
    return rc;
}
