/* SVG written by hand: a fixed 1200 px wide page, text in a system sans-serif font, axes with
 * round-numbered ticks. Only what the pictures need (polylines, circles, rectangles, text), so
 * every browser and image viewer renders it the same. */
#include "plot.h"
#include "message.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    WIDTH = 1200,
    PANEL_H = 290,
    HEADER_H = 70,
    MARGIN_L = 78,
    MARGIN_R = 16,
    MARGIN_T = 34,
    MARGIN_B = 48,
    COLUMNS = 3,
    MARKS_UPTO = 48
};

/* ---- grouping names into families ---- */

bool plot_family(const char *name, size_t len, strbuf *family, uint64_t *layer) {
    sb_clear(family);
    size_t start = 0;
    bool found = false;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && name[i] != '.' && name[i] != '/') continue;
        size_t n = i - start;
        bool digits = !found && n > 0 && n <= 18;
        for (size_t k = start; digits && k < i; k++) digits = name[k] >= '0' && name[k] <= '9';
        if (digits) {
            uint64_t v = 0;
            for (size_t k = start; k < i; k++) v = v * 10 + (uint64_t)(name[k] - '0');
            *layer = v;
            found = true;
            sb_putc(family, '*');
        } else {
            sb_put(family, name + start, n);
        }
        if (i < len) sb_putc(family, name[i]);
        start = i + 1;
    }
    if (!family->data) sb_puts(family, "");
    return found && !family->failed;
}

typedef struct member {
    char *family;
    uint64_t layer;
    size_t index;
} member;

static int by_family(const void *a, const void *b) {
    const member *x = a, *y = b;
    int c = strcmp(x->family, y->family);
    if (c) return c;
    return x->layer < y->layer ? -1 : x->layer > y->layer;
}

void plot_panels_free(plot_panel *p, size_t n) {
    for (size_t i = 0; p && i < n; i++) {
        free(p[i].title);
        free(p[i].layer);
        free(p[i].alarm);
        for (size_t s = 0; s < p[i].nseries; s++) free(p[i].series[s].y);
    }
    free(p);
}

int plot_group(const char *const *names, const size_t *name_lens, const double *const *vals,
               const uint64_t *alarm, size_t n, const plot_series *proto, size_t nseries,
               plot_panel **out, size_t *npanels) {
    *out = NULL;
    *npanels = 0;
    member *m = calloc(n ? n : 1, sizeof *m);
    if (!m) return -ENOMEM;
    size_t k = 0;
    strbuf fam;
    sb_init(&fam);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        uint64_t layer;
        if (!plot_family(names[i], name_lens[i], &fam, &layer)) continue;
        m[k] = (member){.family = strdup(fam.data), .layer = layer, .index = i};
        if (!m[k++].family) rc = -ENOMEM;
    }
    sb_free(&fam);
    if (!rc) qsort(m, k, sizeof *m, by_family);
    plot_panel *p = calloc(k ? k : 1, sizeof *p);
    size_t np = 0;
    if (!p) rc = -ENOMEM;
    for (size_t a = 0; !rc && a < k;) {
        size_t b = a + 1;
        while (b < k && strcmp(m[b].family, m[a].family) == 0) b++;
        plot_panel *q = &p[np++];
        q->title = strdup(m[a].family);
        q->npoints = b - a;
        q->layer = calloc(b - a, sizeof *q->layer);
        q->alarm = alarm ? calloc(b - a, sizeof *q->alarm) : NULL;
        q->nseries = nseries;
        bool ok = q->title && q->layer && (q->alarm || !alarm);
        for (size_t s = 0; s < nseries; s++) {
            q->series[s] = proto[s];
            q->series[s].y = calloc(b - a, sizeof(double));
            ok = ok && q->series[s].y;
        }
        for (size_t j = a; ok && j < b; j++) {
            q->layer[j - a] = m[j].layer;
            if (alarm) q->alarm[j - a] = alarm[m[j].index];
            for (size_t s = 0; s < nseries; s++) q->series[s].y[j - a] = vals[m[j].index][s];
        }
        if (!ok) rc = -ENOMEM;
        a = b;
    }
    for (size_t i = 0; i < k; i++) free(m[i].family);
    free(m);
    if (rc) {
        plot_panels_free(p, np);
        return rc;
    }
    *out = p;
    *npanels = np;
    return 0;
}

/* ---- drawing ---- */

/* Text for XML: markup characters escaped, bytes outside printable ASCII as '?'. */
static void put_text(strbuf *sb, const char *s, size_t max) {
    size_t n = strlen(s);
    bool cut = n > max;
    if (cut) n = max - 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '&')
            sb_puts(sb, "&amp;");
        else if (c == '<')
            sb_puts(sb, "&lt;");
        else if (c == '>')
            sb_puts(sb, "&gt;");
        else if (c == '"')
            sb_puts(sb, "&quot;");
        else
            sb_putc(sb, c >= 0x20 && c < 0x7f ? (char)c : '?');
    }
    if (cut) sb_puts(sb, "\xe2\x80\xa6"); /* an ellipsis */
}

static void put_num(strbuf *sb, double v) {
    char b[32];
    if (v != 0 && (fabs(v) >= 1e5 || fabs(v) < 1e-3))
        snprintf(b, sizeof b, "%.2g", v);
    else
        snprintf(b, sizeof b, "%.4g", v);
    sb_puts(sb, b);
}

typedef struct axis {
    bool log;
    double lo, hi; /* in axis units (log10 when log) */
    double step;
} axis;

static double nice_step(double span, int want) {
    double raw = span / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

static void axis_fit(axis *a, double lo, double hi, bool allow_log) {
    a->log = allow_log && lo > 0 && hi / lo > 20;
    if (a->log) {
        a->lo = floor(log10(lo));
        a->hi = ceil(log10(hi));
        if (a->hi == a->lo) a->hi += 1;
        a->step = ceil((a->hi - a->lo) / 6);
        return;
    }
    if (lo > 0) lo = 0; /* magnitudes read best from zero */
    if (hi <= lo) hi = lo + 1;
    a->step = nice_step(hi - lo, 5);
    a->lo = floor(lo / a->step) * a->step;
    a->hi = ceil(hi / a->step) * a->step;
}

static double axis_pos(const axis *a, double v) {
    double u = a->log ? log10(v) : v;
    return (u - a->lo) / (a->hi - a->lo);
}

/* The plot area and its horizontal grid lines, labelled with the y axis's values. */
static void put_frame(strbuf *sb, const axis *ay, double px, double py, double pw, double ph) {
    sb_printf(sb,
              "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fafafa\" "
              "stroke=\"#888\"/>\n",
              px, py, pw, ph);
    for (double t = ay->lo; t <= ay->hi + ay->step / 2; t += ay->step) {
        double fy = py + ph - (t - ay->lo) / (ay->hi - ay->lo) * ph;
        sb_printf(sb,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">",
                  px, fy, px + pw, fy, px - 5, fy + 4);
        put_num(sb, ay->log ? pow(10, t) : t);
        sb_puts(sb, "</text>\n");
    }
}

static void svg_open(strbuf *sb, int height, const char *title) {
    sb_printf(sb,
              "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
              "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
              "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Arial, Helvetica, sans-serif\" "
              "font-size=\"12\">\n"
              "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
              WIDTH, height, WIDTH, height);
    sb_puts(sb, "<text x=\"16\" y=\"28\" font-size=\"18\" font-weight=\"bold\">");
    put_text(sb, title, 110);
    sb_puts(sb, "</text>\n");
}

static void legend(strbuf *sb, const plot_panel *p, bool alarm) {
    double x = 16;
    for (size_t s = 0; s < p->nseries; s++) {
        sb_printf(sb,
                  "<line x1=\"%.0f\" y1=\"50\" x2=\"%.0f\" y2=\"50\" stroke=\"%s\" "
                  "stroke-width=\"2.5\"/><text x=\"%.0f\" y=\"54\">",
                  x, x + 24, p->series[s].color, x + 30);
        put_text(sb, p->series[s].label, 60);
        sb_puts(sb, "</text>\n");
        x += 40 + 7.5 * (double)strlen(p->series[s].label);
    }
    if (alarm)
        sb_printf(sb,
                  "<path d=\"M%.0f 45 h12 l-6 10 z\" fill=\"#d62728\"/><text x=\"%.0f\" y=\"54\">"
                  "count of NaN and Inf values (when not 0)</text>\n",
                  x, x + 18);
}

static void panel_svg(strbuf *sb, const plot_panel *p, double x0, double y0, double w,
                      const char *y_label) {
    double px = x0 + MARGIN_L, py = y0 + MARGIN_T, pw = w - MARGIN_L - MARGIN_R,
           ph = PANEL_H - MARGIN_T - MARGIN_B;
    sb_printf(sb, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">", px,
              y0 + 20);
    put_text(sb, p->title, (size_t)(pw / 7.2));
    sb_puts(sb, "</text>\n");
    double lo = INFINITY, hi = -INFINITY;
    bool all_positive = true;
    for (size_t s = 0; s < p->nseries; s++)
        for (size_t k = 0; k < p->npoints; k++) {
            double v = p->series[s].y[k];
            if (!isfinite(v)) continue;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
            all_positive = all_positive && v > 0;
        }
    if (lo > hi) lo = 0, hi = 1;
    axis ay;
    axis_fit(&ay, lo, hi, all_positive);
    uint64_t xmin = p->layer[0], xmax = p->layer[p->npoints - 1];
    double xspan = xmax > xmin ? (double)(xmax - xmin) : 1;
    double xpad = xmax > xmin ? 0.03 : 0.5;
    /* frame and grid */
    put_frame(sb, &ay, px, py, pw, ph);
    double xstep = ceil(nice_step(xspan, 8));
    if (xstep < 1) xstep = 1;
    for (double t = ceil((double)xmin / xstep) * xstep; t <= (double)xmax; t += xstep) {
        double fx = px + (xpad + (t - (double)xmin) / xspan * (1 - 2 * xpad)) * pw;
        if (xmax == xmin) fx = px + pw / 2;
        sb_printf(sb,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n",
                  fx, py + ph, fx, py + ph + 5, fx, py + ph + 18, t);
    }
    sb_printf(sb, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#444\">layer</text>\n",
              px + pw / 2, py + ph + 36);
    sb_printf(sb,
              "<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\" "
              "fill=\"#444\">",
              x0 + 14, py + ph / 2);
    put_text(sb, y_label, 40);
    sb_puts(sb, ay.log ? " (log)</text>\n" : "</text>\n");
    /* series */
    for (size_t s = 0; s < p->nseries; s++) {
        const plot_series *se = &p->series[s];
        bool open = false;
        for (size_t k = 0; k < p->npoints; k++) {
            double v = se->y[k];
            bool ok = isfinite(v) && (!ay.log || v > 0);
            if (!ok) {
                if (open) sb_puts(sb, "\"/>\n");
                open = false;
                continue;
            }
            double fx =
                xmax == xmin
                    ? px + pw / 2
                    : px + (xpad + (double)(p->layer[k] - xmin) / xspan * (1 - 2 * xpad)) * pw;
            double fy = py + ph - axis_pos(&ay, v) * ph;
            if (!open)
                sb_printf(sb,
                          "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
                          "stroke-linejoin=\"round\" points=\"",
                          se->color);
            sb_printf(sb, "%s%.1f,%.1f", open ? " " : "", fx, fy);
            open = true;
        }
        if (open) sb_puts(sb, "\"/>\n");
        if (p->npoints <= MARKS_UPTO)
            for (size_t k = 0; k < p->npoints; k++) {
                double v = se->y[k];
                if (!isfinite(v) || (ay.log && v <= 0)) continue;
                double fx =
                    xmax == xmin
                        ? px + pw / 2
                        : px + (xpad + (double)(p->layer[k] - xmin) / xspan * (1 - 2 * xpad)) * pw;
                sb_printf(sb, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", fx,
                          py + ph - axis_pos(&ay, v) * ph, se->color);
            }
    }
    /* A layer with NaN or Inf: a red band across the plot, its count on a white label. */
    double band = p->npoints > 1 ? pw * (1 - 2 * xpad) / xspan : 12;
    if (band < 4) band = 4;
    for (size_t k = 0; p->alarm && k < p->npoints; k++) {
        if (!p->alarm[k]) continue;
        double fx = xmax == xmin
                        ? px + pw / 2
                        : px + (xpad + (double)(p->layer[k] - xmin) / xspan * (1 - 2 * xpad)) * pw;
        char count[24];
        int lw = snprintf(count, sizeof count, "%llu", (unsigned long long)p->alarm[k]) * 7 + 18;
        sb_printf(sb,
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#d62728\" "
                  "fill-opacity=\"0.15\"/>\n"
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"16\" rx=\"3\" fill=\"white\" "
                  "stroke=\"#d62728\"/><path d=\"M%.1f %.1f h8 l-4 7 z\" fill=\"#d62728\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\" font-size=\"11\">%s</text>\n",
                  fx - band / 2, py, band, ph, fx - lw / 2.0, py + 3, lw, fx - lw / 2.0 + 4,
                  py + 7.5, fx - lw / 2.0 + 15, py + 15, count);
    }
}

void plot_panels_svg(strbuf *sb, const char *title, const char *y_label, const plot_panel *p,
                     size_t n) {
    size_t cols = n < COLUMNS ? (n ? n : 1) : COLUMNS, rows = (n + cols - 1) / cols;
    int height = HEADER_H + (int)(rows ? rows : 1) * PANEL_H + 10;
    svg_open(sb, height, title);
    bool alarm = false;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; p[i].alarm && k < p[i].npoints; k++) alarm = alarm || p[i].alarm[k];
    if (n) legend(sb, &p[0], alarm);
    if (!n)
        sb_puts(sb, "<text x=\"16\" y=\"110\" font-size=\"14\">No tensor name has a layer number "
                    "(a component of digits, as in model.layers.3.mlp): nothing to plot per "
                    "layer.</text>\n");
    double w = (double)WIDTH / (double)cols;
    for (size_t i = 0; i < n; i++)
        panel_svg(sb, &p[i], (double)(i % cols) * w, HEADER_H + (double)(i / cols) * PANEL_H, w,
                  y_label);
    sb_puts(sb, "</svg>\n");
}

void plot_histogram_svg(strbuf *sb, const char *title, double lo, double hi, const uint64_t *bins,
                        size_t nbins, const char *note) {
    const int height = 560;
    svg_open(sb, height, title);
    sb_puts(sb, "<text x=\"16\" y=\"52\" fill=\"#444\">");
    put_text(sb, note, 160);
    sb_puts(sb, "</text>\n");
    double px = 90, py = 80, pw = WIDTH - 90 - 30, ph = height - 80 - 70;
    uint64_t top = 1;
    for (size_t i = 0; i < nbins; i++) top = bins[i] > top ? bins[i] : top;
    axis ay;
    axis_fit(&ay, 0, (double)top, false);
    axis ax = {.lo = lo, .hi = hi > lo ? hi : lo + 1};
    ax.step = nice_step(ax.hi - ax.lo, 10);
    put_frame(sb, &ay, px, py, pw, ph);
    double bw = pw / (double)nbins;
    for (size_t i = 0; i < nbins; i++) {
        if (!bins[i]) continue;
        double h = (double)bins[i] / (ay.hi - ay.lo) * ph;
        sb_printf(sb,
                  "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#1f77b4\"/>\n",
                  px + bw * (double)i, py + ph - h, bw > 2 ? bw - 0.5 : bw, h);
    }
    for (double t = ceil(ax.lo / ax.step) * ax.step; t <= ax.hi + ax.step * 1e-9; t += ax.step) {
        double fx = px + (t - ax.lo) / (ax.hi - ax.lo) * pw;
        sb_printf(sb,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
                  fx, py + ph, fx, py + ph + 5, fx, py + ph + 19);
        put_num(sb, fabs(t) < ax.step * 1e-9 ? 0 : t);
        sb_puts(sb, "</text>\n");
    }
    sb_printf(sb, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#444\">value</text>\n",
              px + pw / 2, py + ph + 44);
    sb_printf(sb,
              "<text transform=\"translate(24 %.1f) rotate(-90)\" text-anchor=\"middle\" "
              "fill=\"#444\">count of values per bin (%zu bins)</text>\n",
              py + ph / 2, nbins);
    sb_puts(sb, "</svg>\n");
}

int plot_write(const char *cmd, const char *path, const strbuf *sb) {
    if (sb->failed || !sb->data) {
        msg_error(cmd, "out of memory");
        return ENOMEM;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        msg_error(cmd, "%.200s: %s", path, strerror(e));
        return e;
    }
    int rc = 0;
    for (size_t done = 0; done < sb->len && !rc;) {
        ssize_t w = write(fd, sb->data + done, sb->len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0)
            rc = errno;
        else
            done += (size_t)w;
    }
    if (close(fd) != 0 && !rc) rc = errno;
    if (rc) msg_error(cmd, "%.200s: %s", path, strerror(rc));
    return rc ? EIO : 0;
}
