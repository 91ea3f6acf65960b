/* The per-layer picture of a repo (L2 norm and absmax of each tensor family over its layers),
 * the one `ckptfs stats --plot` draws. It reads every tensor, so it is drawn on its first
 * request, once per snapshot, never for the page itself. */
#include "serve.h"

#include "common/plot.h"
#include "core/views/stats.h"

#include <math.h>
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

const char *serve_plot(serve_snapshot *s, size_t *len) {
    pthread_mutex_lock(&s->plot_lock);
    if (!s->plot) s->plot = draw(s, &s->plot_len);
    *len = s->plot_len;
    const char *svg = s->plot;
    pthread_mutex_unlock(&s->plot_lock);
    return svg;
}
