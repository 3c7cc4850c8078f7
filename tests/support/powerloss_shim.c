/* powerloss_shim.c: an LD_PRELOAD library that records every mutating file operation under
 * some folders into an append-only log, with its data, for the power-loss tests
 * (tests/faults/test_power_loss.py, which compiles this file with gcc at test time).
 *
 * Environment:
 *   POWERLOSS_LOG    the log file (opened O_APPEND once per process; forks share it)
 *   POWERLOSS_ROOTS  colon-separated absolute folders whose files are recorded
 *   POWERLOSS_MARK_FD  (optional) a descriptor whose write()s are recorded as MARK records
 *                    (the crash writer's acknowledgements on stdout): they place each
 *                    acknowledgement in the order of the file operations around it.
 *
 * Recorded (only when the call succeeds, and only for paths under a root or descriptors opened
 * on one): open/openat/creat (path, flags, whether a folder), write/pwrite/writev/pwritev (the
 * offset and the bytes written), ftruncate, fsync/fdatasync, rename/renameat/renameat2,
 * unlink/unlinkat, mkdir/mkdirat, rmdir, close, fallocate. One mutex serialises each call with
 * its record, so the log's order is the order in which the operations took effect. Each record
 * is one writev(2) on the log (a raw syscall, so the shim never records itself).
 *
 * Record: struct rec_header, then `plen` bytes of path (a rename: "from\0to"), then `dlen`
 * bytes of data, then the end marker "PLRE" (a record that a SIGKILL cut short lacks it, and
 * the reader skips it). Offsets of write() are read with lseek before the call; -1 means
 * O_APPEND.
 * Operations a test does not expect (a dup of a recorded descriptor, say) are not modelled: the
 * reconstructor refuses a log whose operations do not add up rather than guess.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { OP_OPEN = 1, OP_WRITE, OP_TRUNC, OP_SYNC, OP_RENAME, OP_UNLINK, OP_MKDIR, OP_RMDIR,
       OP_CLOSE, OP_MARK };

#pragma pack(push, 1)
struct rec_header {
    uint32_t magic;  /* 0x504c5231 "PLR1" */
    uint8_t op;
    uint8_t isdir;
    uint16_t pad;
    int32_t pid;
    int32_t fd;
    int64_t a;  /* open: flags; write: offset; trunc: length */
    uint32_t plen;
    uint32_t dlen;
};
#pragma pack(pop)

#define MAX_FD 65536
#define MAX_ROOTS 8

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;
static int mark_fd = -1;
static char *roots[MAX_ROOTS];
static size_t root_len[MAX_ROOTS];
static int nroots = 0;
static unsigned char tracked[MAX_FD]; /* 1: a file under a root, 2: opened O_APPEND */

static void init(void) __attribute__((constructor));
static void init(void) {
    const char *log = getenv("POWERLOSS_LOG");
    const char *r = getenv("POWERLOSS_ROOTS");
    const char *m = getenv("POWERLOSS_MARK_FD");
    if (!log || !r) return;
    log_fd = (int)syscall(SYS_openat, AT_FDCWD, log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                          0644);
    if (log_fd < 0) return;
    /* keep the log's descriptor out of the way of low numbers a program expects to own */
    int high = (int)syscall(SYS_fcntl, log_fd, F_DUPFD_CLOEXEC, 1000);
    if (high >= 0) {
        syscall(SYS_close, log_fd);
        log_fd = high;
    }
    if (m) mark_fd = atoi(m);
    char *copy = strdup(r);
    for (char *tok = strtok(copy, ":"); tok && nroots < MAX_ROOTS; tok = strtok(NULL, ":")) {
        roots[nroots] = tok;
        root_len[nroots] = strlen(tok);
        nroots++;
    }
}

static void emit(uint8_t op, uint8_t isdir, int fd, int64_t a, const char *path, size_t plen,
                 const void *data, size_t dlen) {
    struct rec_header h = {0x504c5231u, op, isdir, 0, (int32_t)syscall(SYS_getpid), fd, a,
                           (uint32_t)plen, (uint32_t)dlen};
    uint32_t end = 0x45524c50u; /* "PLRE" */
    struct iovec iov[4] = {{&h, sizeof h}, {(void *)path, plen}, {(void *)data, dlen},
                           {&end, sizeof end}};
    size_t total = sizeof h + plen + dlen + sizeof end;
    ssize_t n = syscall(SYS_writev, log_fd, iov, 4);
    if (n != (ssize_t)total) {
        /* The kernel may stop a write between pages when a SIGKILL is pending: the process is
         * dying then and never gets here. The reader skips such a cut record (see the end
         * marker). Any other short write is a broken log: stop loudly. */
        static const char msg[] = "powerloss_shim: cannot write the log\n";
        syscall(SYS_write, 2, msg, sizeof msg - 1);
        abort();
    }
}

/* The absolute form of `path` (relative to `dirfd`, AT_FDCWD only) in `out`, or 0. */
static int absolute(int dirfd, const char *path, char *out, size_t size) {
    if (!path) return 0;
    if (path[0] == '/') {
        if (strlen(path) >= size) return 0;
        strcpy(out, path);
        return 1;
    }
    if (dirfd != AT_FDCWD) return 0;
    if (!getcwd(out, size)) return 0;
    size_t n = strlen(out);
    if (n + 1 + strlen(path) >= size) return 0;
    out[n] = '/';
    strcpy(out + n + 1, path);
    return 1;
}

static int under_root(const char *abs) {
    for (int i = 0; i < nroots; i++) {
        size_t n = root_len[i];
        if (strncmp(abs, roots[i], n) == 0 && (abs[n] == '/' || abs[n] == '\0')) return 1;
    }
    return 0;
}

static int watched_path(int dirfd, const char *path, char *out) {
    return log_fd >= 0 && absolute(dirfd, path, out, PATH_MAX) && under_root(out);
}

static int watched_fd(int fd) { return log_fd >= 0 && fd >= 0 && fd < MAX_FD && tracked[fd]; }

#define REAL(name) static __typeof__(name) *real_##name; \
    if (!real_##name) real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

/* -- opening --------------------------------------------------------------------------------- */

static int after_open(int fd, int dirfd, const char *path, int flags) {
    if (fd < 0 || fd >= MAX_FD) return fd;
    char abs[PATH_MAX];
    tracked[fd] = 0; /* a new descriptor: whatever this number named before is gone */
    if (!watched_path(dirfd, path, abs)) return fd;
    struct stat st;
    int isdir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    tracked[fd] = (flags & O_APPEND) ? 2 : 1;
    emit(OP_OPEN, (uint8_t)isdir, fd, flags, abs, strlen(abs), NULL, 0);
    return fd;
}

#define OPEN_MODE(flags, mode) \
    mode_t mode = 0; \
    if ((flags) & (O_CREAT | __O_TMPFILE)) { \
        va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); \
    }

int open(const char *path, int flags, ...) {
    OPEN_MODE(flags, mode);
    REAL(open);
    pthread_mutex_lock(&lock);
    int fd = real_open(path, flags, mode);
    after_open(fd, AT_FDCWD, path, flags);
    pthread_mutex_unlock(&lock);
    return fd;
}

int open64(const char *path, int flags, ...) {
    OPEN_MODE(flags, mode);
    REAL(open64);
    pthread_mutex_lock(&lock);
    int fd = real_open64(path, flags, mode);
    after_open(fd, AT_FDCWD, path, flags);
    pthread_mutex_unlock(&lock);
    return fd;
}

int openat(int dirfd, const char *path, int flags, ...) {
    OPEN_MODE(flags, mode);
    REAL(openat);
    pthread_mutex_lock(&lock);
    int fd = real_openat(dirfd, path, flags, mode);
    after_open(fd, dirfd, path, flags);
    pthread_mutex_unlock(&lock);
    return fd;
}

int openat64(int dirfd, const char *path, int flags, ...) {
    OPEN_MODE(flags, mode);
    REAL(openat64);
    pthread_mutex_lock(&lock);
    int fd = real_openat64(dirfd, path, flags, mode);
    after_open(fd, dirfd, path, flags);
    pthread_mutex_unlock(&lock);
    return fd;
}

int creat(const char *path, mode_t mode) { return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode); }
int creat64(const char *path, mode_t mode) {
    return open64(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

int close(int fd) {
    REAL(close);
    pthread_mutex_lock(&lock);
    int watched = watched_fd(fd);
    int rc = real_close(fd);
    if (rc == 0 && fd >= 0 && fd < MAX_FD) {
        tracked[fd] = 0;
        if (watched) emit(OP_CLOSE, 0, fd, 0, NULL, 0, NULL, 0);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* -- data ------------------------------------------------------------------------------------ */

static void record_write(int fd, int64_t offset, const void *buf, ssize_t n) {
    if (n > 0) emit(OP_WRITE, 0, fd, offset, NULL, 0, buf, (size_t)n);
}

static void record_writev(int fd, int64_t offset, const struct iovec *iov, int cnt, ssize_t n) {
    if (n <= 0) return;
    char *flat = malloc((size_t)n);
    if (!flat) abort();
    size_t done = 0;
    for (int i = 0; i < cnt && done < (size_t)n; i++) {
        size_t take = iov[i].iov_len < (size_t)n - done ? iov[i].iov_len : (size_t)n - done;
        memcpy(flat + done, iov[i].iov_base, take);
        done += take;
    }
    record_write(fd, offset, flat, n);
    free(flat);
}

static int64_t position(int fd) {
    if (tracked[fd] == 2) return -1; /* O_APPEND: at the end, wherever that is then */
    return (int64_t)lseek(fd, 0, SEEK_CUR);
}

ssize_t write(int fd, const void *buf, size_t count) {
    REAL(write);
    if (fd == mark_fd && log_fd >= 0) {
        pthread_mutex_lock(&lock);
        ssize_t n = real_write(fd, buf, count);
        if (n > 0) emit(OP_MARK, 0, fd, 0, NULL, 0, buf, (size_t)n);
        pthread_mutex_unlock(&lock);
        return n;
    }
    if (!watched_fd(fd)) return real_write(fd, buf, count);
    pthread_mutex_lock(&lock);
    int64_t off = position(fd);
    ssize_t n = real_write(fd, buf, count);
    record_write(fd, off, buf, n);
    pthread_mutex_unlock(&lock);
    return n;
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    REAL(pwrite);
    if (!watched_fd(fd)) return real_pwrite(fd, buf, count, offset);
    pthread_mutex_lock(&lock);
    ssize_t n = real_pwrite(fd, buf, count, offset);
    record_write(fd, offset, buf, n);
    pthread_mutex_unlock(&lock);
    return n;
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t offset) {
    REAL(pwrite64);
    if (!watched_fd(fd)) return real_pwrite64(fd, buf, count, offset);
    pthread_mutex_lock(&lock);
    ssize_t n = real_pwrite64(fd, buf, count, offset);
    record_write(fd, offset, buf, n);
    pthread_mutex_unlock(&lock);
    return n;
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    REAL(writev);
    if (!watched_fd(fd)) return real_writev(fd, iov, cnt);
    pthread_mutex_lock(&lock);
    int64_t off = position(fd);
    ssize_t n = real_writev(fd, iov, cnt);
    record_writev(fd, off, iov, cnt, n);
    pthread_mutex_unlock(&lock);
    return n;
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t offset) {
    REAL(pwritev);
    if (!watched_fd(fd)) return real_pwritev(fd, iov, cnt, offset);
    pthread_mutex_lock(&lock);
    ssize_t n = real_pwritev(fd, iov, cnt, offset);
    record_writev(fd, offset, iov, cnt, n);
    pthread_mutex_unlock(&lock);
    return n;
}

ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off64_t offset) {
    REAL(pwritev64);
    if (!watched_fd(fd)) return real_pwritev64(fd, iov, cnt, offset);
    pthread_mutex_lock(&lock);
    ssize_t n = real_pwritev64(fd, iov, cnt, offset);
    record_writev(fd, offset, iov, cnt, n);
    pthread_mutex_unlock(&lock);
    return n;
}

int ftruncate(int fd, off_t length) {
    REAL(ftruncate);
    if (!watched_fd(fd)) return real_ftruncate(fd, length);
    pthread_mutex_lock(&lock);
    int rc = real_ftruncate(fd, length);
    if (rc == 0) emit(OP_TRUNC, 0, fd, length, NULL, 0, NULL, 0);
    pthread_mutex_unlock(&lock);
    return rc;
}

int ftruncate64(int fd, off64_t length) {
    REAL(ftruncate64);
    if (!watched_fd(fd)) return real_ftruncate64(fd, length);
    pthread_mutex_lock(&lock);
    int rc = real_ftruncate64(fd, length);
    if (rc == 0) emit(OP_TRUNC, 0, fd, length, NULL, 0, NULL, 0);
    pthread_mutex_unlock(&lock);
    return rc;
}

/* fallocate only reserves space (mode 0 may extend the size: recorded as a truncate up) */
int fallocate(int fd, int mode, off_t offset, off_t len) {
    REAL(fallocate);
    if (!watched_fd(fd)) return real_fallocate(fd, mode, offset, len);
    pthread_mutex_lock(&lock);
    struct stat before;
    int have = fstat(fd, &before) == 0;
    int rc = real_fallocate(fd, mode, offset, len);
    struct stat after;
    if (rc == 0 && have && fstat(fd, &after) == 0 && after.st_size != before.st_size)
        emit(OP_TRUNC, 0, fd, after.st_size, NULL, 0, NULL, 0);
    pthread_mutex_unlock(&lock);
    return rc;
}

/* -- durability points ----------------------------------------------------------------------- */

int fsync(int fd) {
    REAL(fsync);
    if (!watched_fd(fd)) return real_fsync(fd);
    pthread_mutex_lock(&lock);
    int rc = real_fsync(fd);
    if (rc == 0) emit(OP_SYNC, 0, fd, 0, NULL, 0, NULL, 0);
    pthread_mutex_unlock(&lock);
    return rc;
}

int fdatasync(int fd) {
    REAL(fdatasync);
    if (!watched_fd(fd)) return real_fdatasync(fd);
    pthread_mutex_lock(&lock);
    int rc = real_fdatasync(fd);
    if (rc == 0) emit(OP_SYNC, 1, fd, 0, NULL, 0, NULL, 0);
    pthread_mutex_unlock(&lock);
    return rc;
}

/* -- names ----------------------------------------------------------------------------------- */

static int name_op(uint8_t op, int rc, const char *abs) {
    if (rc == 0) emit(op, 0, -1, 0, abs, strlen(abs), NULL, 0);
    return rc;
}

int unlink(const char *path) {
    REAL(unlink);
    char abs[PATH_MAX];
    if (!watched_path(AT_FDCWD, path, abs)) return real_unlink(path);
    pthread_mutex_lock(&lock);
    int rc = name_op(OP_UNLINK, real_unlink(path), abs);
    pthread_mutex_unlock(&lock);
    return rc;
}

int unlinkat(int dirfd, const char *path, int flags) {
    REAL(unlinkat);
    char abs[PATH_MAX];
    if (!watched_path(dirfd, path, abs)) return real_unlinkat(dirfd, path, flags);
    pthread_mutex_lock(&lock);
    int rc = name_op((flags & AT_REMOVEDIR) ? OP_RMDIR : OP_UNLINK,
                     real_unlinkat(dirfd, path, flags), abs);
    pthread_mutex_unlock(&lock);
    return rc;
}

int rmdir(const char *path) {
    REAL(rmdir);
    char abs[PATH_MAX];
    if (!watched_path(AT_FDCWD, path, abs)) return real_rmdir(path);
    pthread_mutex_lock(&lock);
    int rc = name_op(OP_RMDIR, real_rmdir(path), abs);
    pthread_mutex_unlock(&lock);
    return rc;
}

int mkdir(const char *path, mode_t mode) {
    REAL(mkdir);
    char abs[PATH_MAX];
    if (!watched_path(AT_FDCWD, path, abs)) return real_mkdir(path, mode);
    pthread_mutex_lock(&lock);
    int rc = name_op(OP_MKDIR, real_mkdir(path, mode), abs);
    pthread_mutex_unlock(&lock);
    return rc;
}

int mkdirat(int dirfd, const char *path, mode_t mode) {
    REAL(mkdirat);
    char abs[PATH_MAX];
    if (!watched_path(dirfd, path, abs)) return real_mkdirat(dirfd, path, mode);
    pthread_mutex_lock(&lock);
    int rc = name_op(OP_MKDIR, real_mkdirat(dirfd, path, mode), abs);
    pthread_mutex_unlock(&lock);
    return rc;
}

static int record_rename(int rc, const char *from, const char *to) {
    if (rc != 0) return rc;
    size_t a = strlen(from), b = strlen(to);
    char *both = malloc(a + 1 + b);
    if (!both) abort();
    memcpy(both, from, a + 1);
    memcpy(both + a + 1, to, b);
    emit(OP_RENAME, 0, -1, 0, both, a + 1 + b, NULL, 0);
    free(both);
    return rc;
}

int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
              unsigned int flags) {
    REAL(renameat2);
    char from[PATH_MAX], to[PATH_MAX];
    int a = watched_path(olddirfd, oldpath, from), b = watched_path(newdirfd, newpath, to);
    if (!a && !b) return real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
    pthread_mutex_lock(&lock);
    int rc = record_rename(real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags),
                           a ? from : "", b ? to : "");
    pthread_mutex_unlock(&lock);
    return rc;
}

int renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath) {
    return renameat2(olddirfd, oldpath, newdirfd, newpath, 0);
}

int rename(const char *oldpath, const char *newpath) {
    return renameat2(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0);
}
