/* The FUSE request loop of our own: one thread at a time holds the device (the "seat"), spins
 * briefly for the next request after answering one, and answers the requests that never block
 * itself; every other request is handed with the seat to an idle thread first, so large READs
 * still run in parallel. Why: on a VM a request that finds the daemon asleep pays a cross-CPU
 * wake-up (an IPI, ~45 us measured), and a walk is 2 requests per directory, each awaited by
 * the walker. The spin is adaptive: it happens only while requests keep coming within the
 * window, so an idle mount's daemon sleeps in poll() and costs no CPU. */
#ifndef CKPTFS_LOOP_H
#define CKPTFS_LOOP_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdint.h>

typedef struct loop_opts {
    unsigned threads;    /* at most this many serving threads; 1 = the calling thread only */
    unsigned spin_us;    /* how long to wait for the next request before sleeping */
    uint64_t inline_ops; /* bit n: requests of opcode n never block (the seat holder answers) */
} loop_opts;

/* The requests a walk is made of, answered from memory by the read-only mount. */
uint64_t loop_metadata_ops(void);

/* Serves se until unmount or an exit signal (libfuse's handlers end the session): returns 0, or
 * a negative errno (-ECONNABORTED for an aborted connection). */
int loop_serve(struct fuse_session *se, const loop_opts *o);

#endif
