/*
 * durable_shadow.c: an LD_PRELOAD library that keeps, beside a process's store, a copy of
 * exactly what the process made durable; after a SIGKILL that copy is the store a power cut
 * would have left (the model: the disk kept what fsync/fdatasync covered, and nothing else).
 *
 * Environment: DURABLE_SHADOW_ROOT (the store directory watched), DURABLE_SHADOW_DIR (where
 * the copy goes, same relative paths).
 *
 * - fsync/fdatasync(fd) of a regular file under the root: the file's whole content is read
 *   *before* the real call (every byte read was in the page cache when the call began, so it is
 *   on disk when the call returns) and published to the copy *after* it returns (a process
 *   killed during the call has not made it durable).  Bytes written after the read are not in
 *   the copy: the adversarial case, nothing written back that was not synced.  A file that is
 *   never synced does not exist in the copy.
 * - rename/renameat/renameat2 and unlink/unlinkat of paths under the root are applied to the
 *   copy too when they succeed (the store fsyncs the directory after a rename that matters;
 *   Linux filesystems order a rename after the data synced before it).
 *
 * Deliberately optimistic in one point: a synced file's directory entry is taken as durable
 * with it (ext4 and xfs behave so; POSIX asks for a directory fsync).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_renameat2)(int, const char *, int, const char *, unsigned int);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);

static void resolve(void) {
    if (real_fsync) return;
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_rename = dlsym(RTLD_NEXT, "rename");
    real_renameat = dlsym(RTLD_NEXT, "renameat");
    real_renameat2 = dlsym(RTLD_NEXT, "renameat2");
    real_unlink = dlsym(RTLD_NEXT, "unlink");
    real_unlinkat = dlsym(RTLD_NEXT, "unlinkat");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
}

/* The copy's path for an absolute path under the root, or 0 when it is not under it. */
static int shadow_of(const char *path, char *out) {
    const char *root = getenv("DURABLE_SHADOW_ROOT");
    const char *dir = getenv("DURABLE_SHADOW_DIR");
    if (!root || !dir || !path) return 0;
    size_t n = strlen(root);
    if (strncmp(path, root, n) != 0 || (path[n] != '/' && path[n] != 0)) return 0;
    return snprintf(out, PATH_MAX, "%s%s", dir, path + n) < PATH_MAX;
}

/* Absolute form of a path relative to dirfd (AT_FDCWD or a directory descriptor). */
static int absolute(int dirfd, const char *path, char *out) {
    char base[PATH_MAX];
    if (path[0] == '/') return snprintf(out, PATH_MAX, "%s", path) < PATH_MAX;
    if (dirfd == AT_FDCWD) {
        if (!getcwd(base, sizeof base)) return 0;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t k = readlink(link, base, sizeof base - 1);
        if (k < 0) return 0;
        base[k] = 0;
    }
    return snprintf(out, PATH_MAX, "%s/%s", base, path) < PATH_MAX;
}

static void make_parents(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            mkdir(path, 0755);
            *p = '/';
        }
    }
}

/* The file's content now, as its data extents (SEEK_DATA/SEEK_HOLE: a store's files are
 * mostly holes, and reading them whole at every sync would make each sync slow). */
struct extent {
    off_t at;
    size_t len;
    char *data;
};

struct snap {
    off_t size;
    int n;
    struct extent *ext;
};

static void drop(struct snap *s) {
    for (int i = 0; i < s->n; i++) free(s->ext[i].data);
    free(s->ext);
}

static int snapshot(int fd, struct snap *out, char *shadow) {
    char link[64], path[PATH_MAX];
    struct stat st;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, path, sizeof path - 1);
    if (k < 0) return 0;
    path[k] = 0;
    if (!shadow_of(path, shadow)) return 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    int rfd = open(link, O_RDONLY);
    if (rfd < 0) return 0;
    out->size = st.st_size;
    out->n = 0;
    out->ext = 0;
    int cap = 0;
    off_t pos = 0;
    while (pos < st.st_size) {
        off_t data = lseek(rfd, pos, SEEK_DATA);
        if (data < 0) break;
        off_t hole = lseek(rfd, data, SEEK_HOLE);
        if (hole < 0) hole = st.st_size;
        if (out->n == cap) {
            cap = cap ? cap * 2 : 8;
            out->ext = realloc(out->ext, cap * sizeof *out->ext);
        }
        struct extent *e = &out->ext[out->n++];
        e->at = data;
        e->len = hole - data;
        e->data = malloc(e->len ? e->len : 1);
        size_t got = 0;
        while (got < e->len) {
            ssize_t r = pread(rfd, e->data + got, e->len - got, data + got);
            if (r <= 0) break;
            got += r;
        }
        e->len = got;
        pos = hole;
    }
    close(rfd);
    return 1;
}

static void publish(const char *shadow, const struct snap *s) {
    char tmp[PATH_MAX + 8];
    char parents[PATH_MAX];
    snprintf(parents, sizeof parents, "%s", shadow);
    make_parents(parents);
    snprintf(tmp, sizeof tmp, "%s.~ds", shadow);
    int wfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (wfd < 0) return;
    if (ftruncate(wfd, s->size) == 0) {
        for (int i = 0; i < s->n; i++) {
            size_t put = 0;
            while (put < s->ext[i].len) {
                ssize_t w = pwrite(wfd, s->ext[i].data + put, s->ext[i].len - put,
                                   s->ext[i].at + put);
                if (w <= 0) break;
                put += w;
            }
        }
    }
    close(wfd);
    real_rename(tmp, shadow);
}

static int synced(int fd, int (*real)(int)) {
    resolve();
    char shadow[PATH_MAX];
    struct snap snap;
    int have = snapshot(fd, &snap, shadow);
    int rc = real(fd);
    if (have) {
        if (rc == 0) {
            pthread_mutex_lock(&lock);
            publish(shadow, &snap);
            pthread_mutex_unlock(&lock);
        }
        drop(&snap);
    }
    return rc;
}

int fsync(int fd) {
    resolve();
    return synced(fd, real_fsync);
}

int fdatasync(int fd) {
    resolve();
    return synced(fd, real_fdatasync);
}

static void mirror_rename(int olddirfd, const char *old, int newdirfd, const char *new) {
    char a[PATH_MAX], b[PATH_MAX], sa[PATH_MAX], sb[PATH_MAX];
    if (!absolute(olddirfd, old, a) || !absolute(newdirfd, new, b)) return;
    if (!shadow_of(a, sa) || !shadow_of(b, sb)) return;
    pthread_mutex_lock(&lock);
    if (access(sa, F_OK) == 0) {
        make_parents(sb);
        real_rename(sa, sb);
    }
    pthread_mutex_unlock(&lock);
}

static void mirror_unlink(int dirfd, const char *path) {
    char a[PATH_MAX], sa[PATH_MAX];
    if (!absolute(dirfd, path, a) || !shadow_of(a, sa)) return;
    pthread_mutex_lock(&lock);
    real_unlink(sa);
    pthread_mutex_unlock(&lock);
}

int rename(const char *old, const char *new) {
    resolve();
    int rc = real_rename(old, new);
    if (rc == 0) mirror_rename(AT_FDCWD, old, AT_FDCWD, new);
    return rc;
}

int renameat(int od, const char *old, int nd, const char *new) {
    resolve();
    int rc = real_renameat(od, old, nd, new);
    if (rc == 0) mirror_rename(od, old, nd, new);
    return rc;
}

int renameat2(int od, const char *old, int nd, const char *new, unsigned int flags) {
    resolve();
    int rc = real_renameat2(od, old, nd, new, flags);
    if (rc == 0) mirror_rename(od, old, nd, new);
    return rc;
}

int unlink(const char *path) {
    resolve();
    int rc = real_unlink(path);
    if (rc == 0) mirror_unlink(AT_FDCWD, path);
    return rc;
}

int unlinkat(int dirfd, const char *path, int flags) {
    resolve();
    int rc = real_unlinkat(dirfd, path, flags);
    if (rc == 0 && !(flags & AT_REMOVEDIR)) mirror_unlink(dirfd, path);
    return rc;
}
