/* SVG pictures for `ckptfs stats --plot/--hist` and `ckptfs diff --plot`, written directly
 * (no plotting dependency): small multiples of per-layer figures, and histograms. */
#ifndef CKPTFS_PLOT_H
#define CKPTFS_PLOT_H

#include "core/util/strbuf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { PLOT_MAX_SERIES = 3 };

/* One line of a panel: y[k] at x = layer[k]; NaN leaves a gap. */
typedef struct plot_series {
    const char *label;
    const char *color;
    double *y;
} plot_series;

/* One tensor family: "model.layers.*.mlp.down_proj.weight" over its layers. */
typedef struct plot_panel {
    char *title;
    size_t npoints;
    uint64_t *layer; /* ascending */
    uint64_t *alarm; /* per point: a count drawn as a red mark when not 0 (NaN/Inf), or NULL */
    plot_series series[PLOT_MAX_SERIES];
    size_t nseries;
} plot_panel;

/* The family of a tensor name: the first dot-separated component made of digits becomes "*"
 * and its value the layer. False for a name without one (not plotted per layer). */
bool plot_family(const char *name, size_t len, strbuf *family, uint64_t *layer);

/* Groups named per-layer values into panels: names[i] with values vals[i][0..nseries).
 * Returns the number of panels in *out (malloc'd; free with plot_panels_free). */
int plot_group(const char *const *names, const size_t *name_lens, const double *const *vals,
               const uint64_t *alarm, size_t n, const plot_series *proto, size_t nseries,
               plot_panel **out, size_t *npanels);
void plot_panels_free(plot_panel *p, size_t n);

/* The SVG of the panels, 1200 px wide, three to a row. y axes are logarithmic when every value
 * is positive and the largest is more than 20 times the smallest. */
void plot_panels_svg(strbuf *sb, const char *title, const char *y_label, const plot_panel *p,
                     size_t n);
/* A histogram of counts over nbins equal bins of [lo, hi]. */
void plot_histogram_svg(strbuf *sb, const char *title, double lo, double hi, const uint64_t *bins,
                        size_t nbins, const char *note);

/* Writes the document to path (0, or an errno with a message already printed). */
int plot_write(const char *cmd, const char *path, const strbuf *sb);

#endif
