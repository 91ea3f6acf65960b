/* Connections that have not sent a whole request: `ckptfs serve` bounds how long one may take
 * over its request line and headers, and how many may be at it at once, so clients that drip
 * a header byte every few seconds (with or without a token, which is only seen once the
 * headers are whole) cannot hold every connection slot. */
#ifndef CKPT_SERVE_GUARD_H
#define CKPT_SERVE_GUARD_H

#include <microhttpd.h>
#include <stdbool.h>

/* Seconds a connection has for the request line and headers of a request, from its accept or
 * from the end of its previous answer (a keep-alive connection that asks nothing more is
 * closed then too). */
#define SERVE_HEADER_SECONDS 10

typedef struct serve_guard serve_guard;

/* At most max_waiting connections may be waiting for their headers at once: when one more
 * connects, the one waiting longest is closed. NULL when out of memory or no thread. */
serve_guard *serve_guard_start(unsigned max_waiting, unsigned header_seconds);
void serve_guard_stop(serve_guard *g);
/* MHD_OPTION_NOTIFY_CONNECTION (cls: the guard). */
void serve_guard_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                            enum MHD_ConnectionNotificationCode toe);
/* The access handler has a whole request of c: c stops waiting. */
void serve_guard_request(struct MHD_Connection *c);
/* MHD_OPTION_NOTIFY_COMPLETED's part: c's answer ended; it waits for its next request. */
void serve_guard_completed(struct MHD_Connection *c);

#endif
