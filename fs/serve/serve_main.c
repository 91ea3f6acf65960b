/* `ckptfs serve [OPTIONS] [NAME=]SOURCE...`: the command line, the listening address and its
 * safety rule (loopback, or a token, or an explicit --insecure-no-auth), then the server until
 * SIGINT/SIGTERM. */
#include "serve.h"
#include "common/message.h"
#include "common/command.h"

#include "common/heap.h"
#include "common/size.h"
#include "core/read/segread.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { EXIT_OK = 0, EXIT_USAGE = 1, EXIT_SOURCE = 2, EXIT_LISTEN = 3 };

extern uint64_t serve_max_shard_size;

static const char help_text[] =
    "Serve checkpoints as Hugging Face Hub repositories ORG/NAME over HTTP: the HF view\n"
    "(config, model.safetensors or shards + index, tokenizer files) assembled on read, the\n"
    "tensor tree under tensors/, and an HTML page per repo at /ORG/NAME.\n"
    "Clients: HF_ENDPOINT=http://HOST:PORT; repo ORG/NAME, revision main.\n"
    "\n"
    "  --listen HOST:PORT     address (default 127.0.0.1:8080; port 0 picks one)\n"
    "  --token-file FILE      require 'Authorization: Bearer TOKEN' (TOKEN: FILE's first line)\n"
    "  --insecure-no-auth     allow a non-loopback address without a token\n"
    "  --threads N            server threads (default: 2 per CPU, at least 4)\n"
    "  --max-connections N    open connections at most (default 64)\n"
    "  --timeout SECONDS      close connections idle this long (default 30)\n"
    "  --max-shard-size S     split the HF view's model.safetensors above S (default 5GB)\n"
    "  -h, --help             this help\n"
    "\n"
    "The id defaults to ORG/NAME for an HF cache folder models--ORG--NAME, else to\n"
    "ckptfs/NAME, NAME the source's file name without its extension. A non-loopback\n"
    "address needs --token-file or --insecure-no-auth. Only GET and HEAD are answered.\n"
    "Exit status: 0 stopped by SIGINT/SIGTERM, 1 usage, 2 bad source, 3 cannot listen.\n";

static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

/* A Hub-valid name from a path: its last component, without an extension for files. */
static void default_name(const char *source, char *out) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", source);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    const char *base = strrchr(buf, '/') ? strrchr(buf, '/') + 1 : buf;
    char name[PATH_MAX];
    snprintf(name, sizeof name, "%s", base);
    struct stat st;
    if (stat(source, &st) == 0 && S_ISREG(st.st_mode)) {
        char *dot = strrchr(name, '.');
        if (dot && strcmp(dot, ".zst") == 0) { /* model.safetensors.zst */
            *dot = '\0';
            dot = strrchr(name, '.');
        }
        if (dot && dot != name) *dot = '\0';
    }
    size_t k = 0;
    for (const char *p = name; *p && k < SERVE_NAME_MAX; p++) out[k++] = name_char(*p) ? *p : '-';
    out[k] = '\0';
    if (out[0] == '.' || out[0] == '-') out[0] = '_';
    if (!k) snprintf(out, SERVE_NAME_MAX + 1, "model");
}

static bool valid_name(const char *s, size_t n) {
    if (n == 0 || n > SERVE_NAME_MAX || s[0] == '.' || s[0] == '-') return false;
    for (size_t i = 0; i < n; i++)
        if (!name_char(s[i])) return false;
    return true;
}

/* ORG/NAME or NAME (then ckptfs/NAME), both parts Hub-valid, into out. */
static bool parse_id(const char *s, size_t n, char *out) {
    const char *slash = memchr(s, '/', n);
    if (!slash) {
        if (!valid_name(s, n)) return false;
        snprintf(out, SERVE_ID_MAX + 1, "ckptfs/%.*s", (int)n, s);
        return true;
    }
    size_t org = (size_t)(slash - s);
    /* "api" would shadow /api/models/... */
    if (!valid_name(s, org) || !valid_name(slash + 1, n - org - 1) ||
        (org == 3 && memcmp(s, "api", 3) == 0))
        return false;
    snprintf(out, SERVE_ID_MAX + 1, "%.*s", (int)n, s);
    return true;
}

/* The repo id of a source: ORG/NAME for an HF cache folder models--ORG--NAME (the Hub's own
 * id, so from_pretrained("ORG/NAME") finds it), ckptfs/NAME for anything else. */
static void default_id(const char *source, char *out) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", source);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    const char *base = strrchr(buf, '/') ? strrchr(buf, '/') + 1 : buf;
    const char *sep = strncmp(base, "models--", 8) == 0 ? strstr(base + 8, "--") : NULL;
    if (sep) {
        char id[SERVE_ID_MAX + 1];
        int w = snprintf(id, sizeof id, "%.*s/%s", (int)(sep - base - 8), base + 8, sep + 2);
        if (w > 0 && (size_t)w < sizeof id && parse_id(id, (size_t)w, out)) return;
    }
    char name[SERVE_NAME_MAX + 1];
    default_name(source, name);
    snprintf(out, SERVE_ID_MAX + 1, "ckptfs/%s", name);
}

static int read_token(const char *path, char **out) {
    FILE *f = fopen(path, "r");
    if (!f) {
        msg_error("serve", "--token-file %s: %s", path, strerror(errno));
        return -1;
    }
    char buf[4097];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    n = strlen(buf);
    while (n && (buf[n - 1] == ' ' || buf[n - 1] == '\t')) buf[--n] = '\0';
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)buf[i] <= 0x20 || (unsigned char)buf[i] >= 0x7f) n = 0;
    if (n < 8) {
        msg_error("serve",
                  "--token-file %s: the first line must be a token of at "
                  "least 8 printable characters without spaces",
                  path);
        return -1;
    }
    *out = strdup(buf);
    return *out ? 0 : -1;
}

static bool loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr) >> 24) ==
               127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

/* HOST:PORT or [V6]:PORT into a socket address. */
static int parse_listen(const char *text, struct sockaddr_storage *ss, socklen_t *len) {
    char host[256];
    const char *colon = strrchr(text, ':');
    if (!colon || !colon[1]) return -1;
    size_t hl = (size_t)(colon - text);
    if (hl >= sizeof host) return -1;
    memcpy(host, text, hl);
    host[hl] = '\0';
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535 || !host[0]) return -1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *res;
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0) return -1;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static bool parse_count(const char *text, unsigned lo, unsigned hi, unsigned *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (errno || *end || !*text || v < lo || v > hi) return false;
    *out = (unsigned)v;
    return true;
}

static int usage_error(const char *fmt, const char *arg) {
    char text[1024];
    snprintf(text, sizeof text, fmt, arg);
    msg_error("serve", "%s (try: ckptfs serve --help)", text);
    return EXIT_USAGE;
}

int serve_main(int argc, char **argv) {
    const char *listen = "127.0.0.1:8080", *token_file = NULL, *max_shard = NULL;
    bool insecure = false;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned threads = ncpu > 2 ? (unsigned)ncpu * 2 : 4, max_conn = 64, timeout = 30;
    char **sources = calloc((size_t)argc, sizeof *sources);
    size_t nsources = 0;
    if (!sources) return EXIT_USAGE;
    int status = EXIT_USAGE;
    /* serve never forks: .zst frames may be decoded ahead and strided bands filled on worker
     * threads, as in a mount. */
    ckpt_read_workers_allow();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = strcmp(a, "--listen") == 0 || strcmp(a, "--token-file") == 0 ||
                     strcmp(a, "--threads") == 0 || strcmp(a, "--max-connections") == 0 ||
                     strcmp(a, "--timeout") == 0 || strcmp(a, "--max-shard-size") == 0;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            command_print_usage(stdout, "serve");
            fputs(help_text, stdout);
            free(sources);
            return EXIT_OK;
        }
        if (takes && !val) {
            free(sources);
            return usage_error("%s needs a value", a);
        }
        bool bad_count = false;
        if (strcmp(a, "--listen") == 0)
            listen = val;
        else if (strcmp(a, "--token-file") == 0)
            token_file = val;
        else if (strcmp(a, "--max-shard-size") == 0)
            max_shard = val;
        else if (strcmp(a, "--threads") == 0)
            bad_count = !parse_count(val, 1, 256, &threads);
        else if (strcmp(a, "--max-connections") == 0)
            bad_count = !parse_count(val, 1, 65536, &max_conn);
        else if (strcmp(a, "--timeout") == 0)
            bad_count = !parse_count(val, 1, 86400, &timeout);
        else if (strcmp(a, "--insecure-no-auth") == 0)
            insecure = true;
        else if (a[0] == '-' && a[1]) {
            free(sources);
            return usage_error("unknown option %s", a);
        } else
            sources[nsources++] = argv[i];
        if (bad_count) {
            free(sources);
            char what[400];
            snprintf(what, sizeof what,
                     "%s %.300s: expected a positive count (threads <= 256, "
                     "connections <= 65536, timeout <= 86400)",
                     a, val);
            return usage_error("%s", what);
        }
        if (takes) i++;
    }
    if (!nsources) {
        free(sources);
        return usage_error("%s", "expected at least one SOURCE");
    }
    if (parse_size_option(max_shard, &serve_max_shard_size) != 0) {
        free(sources);
        return usage_error("--max-shard-size %s: expected a size such as 5GB, 500MB, 2GiB",
                           max_shard);
    }
    struct sockaddr_storage ss;
    socklen_t sslen;
    if (parse_listen(listen, &ss, &sslen) != 0) {
        free(sources);
        return usage_error("--listen %s: expected HOST:PORT or [IPV6]:PORT", listen);
    }
    if (!loopback((struct sockaddr *)&ss) && !token_file && !insecure) {
        free(sources);
        return usage_error("--listen %s is not a loopback address: give --token-file FILE "
                           "(or --insecure-no-auth to serve anyone who can connect)",
                           listen);
    }
    serve_config cfg = {.threads = threads, .max_connections = max_conn, .timeout = timeout};
    char *token = NULL;
    if (token_file && read_token(token_file, &token) != 0) {
        free(sources);
        return EXIT_USAGE;
    }
    cfg.token = token;
    cfg.repos = calloc(nsources, sizeof *cfg.repos);
    struct MHD_Daemon *d = NULL;
    if (!cfg.repos) goto out;
    status = EXIT_SOURCE;
    heap_for_loading();
    for (size_t i = 0; i < nsources; i++) {
        serve_repo *r = &cfg.repos[i];
        const char *eq = strchr(sources[i], '=');
        const char *path = sources[i];
        if (eq && parse_id(sources[i], (size_t)(eq - sources[i]), r->name))
            path = eq + 1;
        else
            default_id(sources[i], r->name);
        /* Two sources of one id: the later ones get -2, -3, ... */
        char base[SERVE_ID_MAX + 1];
        memcpy(base, r->name, sizeof base);
        for (unsigned k = 2;; k++) {
            bool taken = false;
            for (size_t j = 0; j < i; j++) taken |= strcmp(cfg.repos[j].name, r->name) == 0;
            if (!taken) break;
            snprintf(r->name, sizeof r->name, "%.*s-%u", SERVE_ID_MAX - 12, base, k);
        }
        pthread_mutex_init(&r->lock, NULL);
        r->source = strdup(path);
        cfg.nrepos++;
        ckpt_err err = {{0}};
        if (!r->source || serve_snapshot_open(path, &r->cur, &err) != 0) {
            msg_error("serve", "%s", r->source ? err.msg : "out of memory");
            goto out;
        }
    }
    heap_for_serving();
    /* Signals are taken by sigwait below: blocked before the server's threads exist, so they
     * inherit the mask and none of them is interrupted. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
    status = EXIT_LISTEN;
    char msg[300];
    d = serve_http_start(&cfg, &ss, (unsigned)sslen, msg, sizeof msg);
    if (!d) {
        msg_error("serve", "--listen %s: %s", listen, msg);
        goto out;
    }
    char host[NI_MAXHOST] = "?";
    getnameinfo((struct sockaddr *)&ss, sslen, host, sizeof host, NULL, 0, NI_NUMERICHOST);
    printf("ckptfs serve: listening on http://%s%s%s:%u/ (%s)\n",
           ss.ss_family == AF_INET6 ? "[" : "", host, ss.ss_family == AF_INET6 ? "]" : "",
           serve_http_port(d), cfg.token ? "Bearer token required" : "no authentication");
    for (size_t i = 0; i < cfg.nrepos; i++)
        printf("ckptfs serve: %s  <- %s\n", cfg.repos[i].name, cfg.repos[i].source);
    fflush(stdout);
    int sig;
    sigwait(&stop, &sig);
    status = EXIT_OK;
out:
    serve_http_stop(d);
    for (size_t i = 0; i < cfg.nrepos; i++) {
        serve_snapshot_put(cfg.repos[i].cur);
        pthread_mutex_destroy(&cfg.repos[i].lock);
        free(cfg.repos[i].source);
    }
    free(cfg.repos);
    free(token);
    free(sources);
    return status;
}
