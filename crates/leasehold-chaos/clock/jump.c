/*
 * A wall-clock jump for one process, without root and without libfaketime:
 * loaded with LD_PRELOAD, it adds an offset to every CLOCK_REALTIME reading
 * (clock_gettime, gettimeofday, time). The offset, in nanoseconds, is read
 * from the file named by LEASEHOLD_CHAOS_CLOCK_FILE at every reading, so
 * the chaos harness jumps a running server's clock by rewriting that file.
 * The monotonic clocks are untouched: that is the point of the fault (the
 * server must time leases by the monotonic clock and treat its wall clock
 * as a label). Built by the harness with the machine's C compiler.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_ns(void) {
    const char *path = getenv("LEASEHOLD_CHAOS_CLOCK_FILE");
    if (path == NULL) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[32];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    return strtoll(buf, NULL, 10);
}

static void shift(struct timespec *ts, long long off) {
    long long ns = (long long)ts->tv_nsec + off % 1000000000LL;
    long long s = (long long)ts->tv_sec + off / 1000000000LL;
    if (ns < 0) { ns += 1000000000LL; s -= 1; }
    if (ns >= 1000000000LL) { ns -= 1000000000LL; s += 1; }
    ts->tv_sec = (time_t)s;
    ts->tv_nsec = (long)ns;
}

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static int real_clock_gettime(clockid_t id, struct timespec *ts) {
    static clock_gettime_fn real;
    if (real == NULL) real = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    return real(id, ts);
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int r = real_clock_gettime(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        shift(ts, offset_ns());
    }
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
