/* What every command of fs/cli shares: the process setup, -o options, opening the source,
 * messages, output. (fs/main.c's table dispatches to the commands.) */
#include "common/heap.h"
#include "cli_internal.h"
#include "core/read/segread.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cli_start(void) {
    /* A closed pipe must end the output quietly (`ckptfs cat ... | head -c 10`): writes then
     * fail with EPIPE, which cli_write_all turns into a silent exit status 4. */
    signal(SIGPIPE, SIG_IGN);
    heap_for_loading(); /* a command opens one catalog and exits: no need to give memory back */
    /* No command forks after this point, so reads may decode .zst frames ahead and fill
     * strided bands on worker threads, as a mount does (cat, convert, verify). */
    ckpt_read_workers_allow();
}

/* ---- messages ---- */

void cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    msg_verror(cmd, fmt, ap);
    va_end(ap);
}

int cli_bad_option(const char *cmd, int optopt_value, const char *word, bool missing_arg) {
    char shown[64];
    bool has_value = false;
    if (optopt_value > 0 && optopt_value < CLI_LONG) {
        snprintf(shown, sizeof shown, "-%c", optopt_value);
    } else {
        const char *w = word ? word : "?";
        size_t n = strcspn(w, "=");
        has_value = w[n] == '=';
        snprintf(shown, sizeof shown, "%.*s", (int)(n > 60 ? 60 : n), w);
    }
    if (missing_arg)
        cli_error(cmd, "option %s needs a value (see: ckptfs %s --help)", shown, cmd);
    else if (has_value && optopt_value >= CLI_LONG)
        cli_error(cmd, "option %s takes no value (see: ckptfs %s --help)", shown, cmd);
    else
        cli_error(cmd, "unknown option %s (see: ckptfs %s --help)", shown, cmd);
    return CLI_USAGE;
}

bool cli_parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s) return false;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return false;
        if (__builtin_mul_overflow(v, 10, &v) ||
            __builtin_add_overflow(v, (uint64_t)(*p - '0'), &v))
            return false;
    }
    *out = v;
    return true;
}

/* ---- -o options ---- */

/* Mount options that mean nothing without a mount; accepted so one option string serves both. */
static const char *const mount_only[] = {
    "readahead_kb", "splice", "nosplice",       "max_threads", "spin_us",
    "timeout",      "view",   "max_shard_size", "allow_other", "npy",
    "ro",           "fsname", "subtype",        "debug",       "default_permissions",
};

static int apply_option(cli_common *c, const char *opt) {
    const char *eq = strchr(opt, '=');
    size_t klen = eq ? (size_t)(eq - opt) : strlen(opt);
    char **value = NULL;
    if (klen == 8 && strncmp(opt, "tp_split", 8) == 0 && eq) value = &c->tp_split;
    if (klen == 8 && strncmp(opt, "revision", 8) == 0 && eq) value = &c->revision;
    if (value) {
        char *v = strdup(eq + 1);
        if (!v) {
            cli_error(c->cmd, "out of memory");
            return CLI_USAGE;
        }
        free(*value);
        *value = v;
        return 0;
    }
    char why[256];
    int r = remote_opts_apply(&c->remote, opt, why, sizeof why);
    if (r < 0) {
        cli_error(c->cmd, "%s", why);
        return CLI_USAGE;
    }
    if (r > 0) return 0;
    for (size_t i = 0; i < sizeof mount_only / sizeof *mount_only; i++)
        if (strlen(mount_only[i]) == klen && strncmp(opt, mount_only[i], klen) == 0) return 0;
    cli_error(c->cmd,
              "unknown -o option %.200s (subcommands use tp_split=RULES, revision=REV and the "
              "remote-source options)",
              opt);
    return CLI_USAGE;
}

int cli_parse_o(cli_common *c, const char *arg) {
    size_t n = strlen(arg);
    char *opt = malloc(n + 1);
    if (!opt) {
        cli_error(c->cmd, "out of memory");
        return CLI_USAGE;
    }
    int rc = 0;
    size_t k = 0;
    for (size_t i = 0; i <= n && !rc; i++) {
        if (i < n && arg[i] == '\\' && i + 1 < n) { /* "\," is a comma inside a value */
            opt[k++] = arg[++i];
        } else if (i == n || arg[i] == ',') {
            opt[k] = '\0';
            if (k) rc = apply_option(c, opt);
            k = 0;
        } else {
            opt[k++] = arg[i];
        }
    }
    free(opt);
    return rc;
}

void cli_common_free(cli_common *c) {
    free(c->tp_split);
    c->tp_split = NULL;
    free(c->revision);
    c->revision = NULL;
    remote_opts_free(&c->remote);
}

int cli_open(const cli_common *c, const char *source, ckpt_catalog **cat) {
    ckpt_err err = {{0}};
    ckpt_options opts = {.tp_split = c->tp_split, .revision = c->revision, .remote = c->remote.o};
    if (ckpt_open(source, &opts, cat, &err) != 0) {
        cli_error(c->cmd, "%s", err.msg);
        *cat = NULL;
        return CLI_SOURCE;
    }
    return 0;
}

/* ---- output ---- */

int cli_write_all(const char *cmd, int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            if (errno != EPIPE) cli_error(cmd, "writing the output: %s", strerror(errno));
            return CLI_OUTPUT;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

void cli_out_init(cli_out *o, const char *cmd) {
    sb_init(&o->sb);
    o->cmd = cmd;
    o->status = 0;
}

static int out_write(cli_out *o) {
    if (o->status == 0 && o->sb.failed) {
        cli_error(o->cmd, "out of memory");
        o->status = CLI_OUTPUT;
    }
    if (o->status == 0 && o->sb.len) o->status = cli_write_all(o->cmd, 1, o->sb.data, o->sb.len);
    sb_clear(&o->sb);
    return o->status;
}

int cli_out_flush(cli_out *o) {
    return out_write(o);
}

int cli_out_maybe_flush(cli_out *o) {
    if (o->sb.len >= 65536 || o->sb.failed) return out_write(o);
    return o->status;
}

int cli_out_finish(cli_out *o) {
    int rc = out_write(o);
    sb_free(&o->sb);
    return rc;
}
