/* The loader pattern of safetensors and transformers: map a file, then copy it out in 16 MiB
 * pieces from THREADS threads at once (piece i to thread i % THREADS), each page faulted in
 * where it comes.
 * Usage: mmapload FILE THREADS    prints MB/s (1e6 bytes/s) of the whole load, mmap included,
 * and a checksum of the bytes copied (a sum of 64-bit words) on a second line. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { PIECE = 16 << 20, MAX_THREADS = 64 };

static const unsigned char *map;
static size_t size;
static unsigned nthreads;

typedef struct worker {
    pthread_t tid;
    unsigned index;
    unsigned char *dst; /* PIECE bytes, touched before the clock starts */
    uint64_t sum;
} worker;

static void *copy_pieces(void *arg) {
    worker *w = arg;
    for (size_t at = (size_t)w->index * PIECE; at < size; at += (size_t)nthreads * PIECE) {
        size_t n = size - at < PIECE ? size - at : PIECE;
        memcpy(w->dst, map + at, n);
        for (size_t i = 0; i + 8 <= n; i += 4096) { /* one word a page: the copy happened */
            uint64_t v;
            memcpy(&v, w->dst + i, 8);
            w->sum += v;
        }
    }
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3 || (nthreads = (unsigned)atoi(argv[2])) == 0 || nthreads > MAX_THREADS) {
        fprintf(stderr, "usage: mmapload FILE THREADS (1..%d)\n", MAX_THREADS);
        return 2;
    }
    static worker w[MAX_THREADS];
    for (unsigned i = 0; i < nthreads; i++) {
        w[i].index = i;
        if (!(w[i].dst = malloc(PIECE))) return 1;
        memset(w[i].dst, 1, PIECE);
    }
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
        perror(argv[1]);
        return 1;
    }
    size = (size_t)st.st_size;
    double t0 = now();
    void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    map = m;
    for (unsigned i = 0; i < nthreads; i++)
        if (pthread_create(&w[i].tid, NULL, copy_pieces, &w[i]) != 0) return 1;
    uint64_t sum = 0;
    for (unsigned i = 0; i < nthreads; i++) {
        pthread_join(w[i].tid, NULL);
        sum += w[i].sum;
    }
    double secs = now() - t0;
    munmap(m, size);
    close(fd);
    printf("%.1f\n%llu\n", (double)size / secs / 1e6, (unsigned long long)sum);
    return 0;
}
