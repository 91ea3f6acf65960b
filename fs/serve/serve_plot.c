/* The per-layer picture of a repo (L2 norm and absmax of each tensor family over its layers),
 * the one `ckptfs stats --plot` draws. It reads every tensor, so it is drawn on its first
 * request, once per snapshot, never for the page itself, and on a thread of its own: the
 * requests for it wait suspended (libmicrohttpd's suspend/resume), holding no server thread,
 * so a slow source cannot make the server's other answers wait behind it. */
#include "serve.h"

#include "common/plot.h"
#include "core/views/stats.h"

#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static char *draw(const serve_snapshot *s, size_t *len) {
    const ckpt_catalog *cat = s->cat;
    size_t n = 0, cap = cat->ntensors ? cat->ntensors : 1;
    const ckpt_tensor **t = calloc(cap, sizeof *t);
    ckpt_stats *st = calloc(cap, sizeof *st);
    int *status = calloc(cap, sizeof *status);
    const char **names = calloc(cap, sizeof *names);
    size_t *lens = calloc(cap, sizeof *lens);
    double(*vals)[2] = calloc(cap, sizeof *vals);
    const double **rows = calloc(cap, sizeof *rows);
    uint64_t *alarm = calloc(cap, sizeof *alarm);
    char *svg = NULL;
    if (!t || !st || !status || !names || !lens || !vals || !rows || !alarm) goto out;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *x = &cat->tensors[i];
        strbuf fam;
        uint64_t layer;
        sb_init(&fam);
        bool per_layer = plot_family(x->name, x->name_len, &fam, &layer);
        sb_free(&fam);
        if (!x->aside && !x->incomplete && per_layer && ckpt_stats_supported(x->dtype)) t[n++] = x;
    }
    if (n == 0 || ckpt_stats_run(cat, t, n, 0, st, status, NULL, NULL, NULL) != 0) goto out;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (status[i]) continue;
        names[k] = t[i]->name;
        lens[k] = t[i]->name_len;
        vals[k][0] = ckpt_stats_l2(&st[i]);
        vals[k][1] = st[i].finite ? st[i].absmax : NAN;
        rows[k] = vals[k];
        alarm[k++] = st[i].nan + st[i].posinf + st[i].neginf;
    }
    static const plot_series proto[] = {{"L2 norm", "#1f77b4", NULL}, {"absmax", "#ff7f0e", NULL}};
    plot_panel *panels = NULL;
    size_t np = 0;
    if (plot_group(names, lens, rows, alarm, k, proto, 2, &panels, &np) != 0) goto out;
    strbuf sb;
    sb_init(&sb);
    plot_panels_svg(&sb, "per layer", "norm / absmax", panels, np);
    plot_panels_free(panels, np);
    svg = sb_take(&sb, len);
out:
    free(t);
    free(st);
    free(status);
    free(names);
    free(lens);
    free(vals);
    free(rows);
    free(alarm);
    return svg;
}

static void *draw_thread(void *arg) {
    serve_snapshot *s = arg;
    size_t len = 0;
    char *svg = draw(s, &len);
    pthread_mutex_lock(&s->plot_lock);
    s->plot = svg;
    s->plot_len = len;
    s->plot_state = SERVE_PLOT_DONE;
    struct MHD_Connection **w = s->plot_waiters;
    size_t n = s->plot_nwaiters;
    s->plot_waiters = NULL;
    s->plot_nwaiters = s->plot_cap = 0;
    pthread_mutex_unlock(&s->plot_lock);
    for (size_t i = 0; i < n; i++) MHD_resume_connection(w[i]);
    free(w);
    serve_snapshot_put(s);
    return NULL;
}

/* Under plot_lock: c waits for the drawing. */
static int add_waiter(serve_snapshot *s, struct MHD_Connection *c) {
    if (s->plot_nwaiters == s->plot_cap) {
        size_t cap = s->plot_cap ? 2 * s->plot_cap : 8;
        struct MHD_Connection **w = realloc(s->plot_waiters, cap * sizeof *w);
        if (!w) return -ENOMEM;
        s->plot_waiters = w;
        s->plot_cap = cap;
    }
    s->plot_waiters[s->plot_nwaiters++] = c;
    MHD_suspend_connection(c);
    return 0;
}

int serve_plot(serve_snapshot *s, struct MHD_Connection *c, const char **svg, size_t *len) {
    int rc = SERVE_PLOT_DRAWING;
    pthread_mutex_lock(&s->plot_lock);
    if (s->plot_state == SERVE_PLOT_NONE) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        atomic_fetch_add(&s->refs, 1); /* the drawing thread's hold */
        if (pthread_create(&t, &attr, draw_thread, s) == 0) {
            s->plot_state = SERVE_PLOT_DRAWING;
        } else {
            atomic_fetch_sub(&s->refs, 1); /* the caller holds one too: never the last */
            rc = -ENOMEM;
        }
        pthread_attr_destroy(&attr);
    }
    if (s->plot_state == SERVE_PLOT_DONE) {
        *svg = s->plot;
        *len = s->plot_len;
        rc = SERVE_PLOT_DONE;
    } else if (rc == SERVE_PLOT_DRAWING && add_waiter(s, c) != 0) {
        rc = -ENOMEM;
    }
    pthread_mutex_unlock(&s->plot_lock);
    return rc;
}
