/* hf://org/name[@revision][/path] for Hugging Face Hub model repos: the revision is resolved to
 * a commit once (api/models/REPO/revision/REV), the file list comes from the tree API (all
 * pages of api/models/REPO/tree/SHA?recursive=true), bytes from REPO/resolve/SHA/PATH with
 * redirects followed. HF_ENDPOINT, HF_TOKEN (or its file) as the Hub's own tools use them. */
#include "../../util/json.h"
#include "listing.h"
#include "remote.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct hf_file {
    char *path;
    bool dir;
    uint64_t size; /* the tree's "size", or REMOTE_SIZE_UNKNOWN */
} hf_file;

typedef struct hf_repo {
    char *repo; /* org/name */
    char sha[64];
    hf_file *files;
    size_t n;
    struct hf_repo *next;
} hf_repo;

static pthread_mutex_t hf_lock = PTHREAD_MUTEX_INITIALIZER;
static hf_repo *repos;
static http_auth hf_auth;
static char auth_header[4200];
static bool auth_ready;

static const char *endpoint(void) {
    const char *e = getenv("HF_ENDPOINT");
    return e && *e ? e : "https://huggingface.co";
}

static void setup_auth(void) {
    if (auth_ready) return;
    auth_ready = true;
    char token[4096] = "";
    const char *t = getenv("HF_TOKEN");
    if (t && *t) {
        snprintf(token, sizeof token, "%s", t);
    } else {
        char path[1024];
        const char *file = getenv("HF_TOKEN_PATH");
        if (!file || !*file) {
            const char *home = getenv("HF_HOME");
            if (home && *home)
                snprintf(path, sizeof path, "%s/token", home);
            else if (getenv("HOME"))
                snprintf(path, sizeof path, "%s/.cache/huggingface/token", getenv("HOME"));
            else
                path[0] = 0;
            file = path;
        }
        FILE *f = *file ? fopen(file, "r") : NULL;
        if (f) {
            if (!fgets(token, sizeof token, f)) token[0] = 0;
            fclose(f);
            token[strcspn(token, "\r\n")] = 0;
        }
    }
    if (token[0]) {
        snprintf(auth_header, sizeof auth_header, "Authorization: Bearer %s", token);
        hf_auth.header1 = auth_header;
    }
}

/* hf://ORG/NAME[@REV][/PATH]: repo "ORG/NAME", rev (or "main"), path (or ""). */
static int parse(const char *path, char *repo, size_t rcap, char *rev, size_t vcap,
                 const char **sub, ckpt_err *err) {
    const char *p = path + 5;
    const char *s1 = strchr(p, '/');
    if (!s1 || s1 == p) return ckpt_fail(err, -EINVAL, "%s: expected hf://ORG/NAME[@REV]", path);
    const char *name = s1 + 1;
    size_t nl = strcspn(name, "@/");
    if (!nl) return ckpt_fail(err, -EINVAL, "%s: expected hf://ORG/NAME[@REV]", path);
    size_t rl = (size_t)(name + nl - p);
    if (rl >= rcap) return ckpt_fail(err, -ENAMETOOLONG, "%s: repo name too long", path);
    memcpy(repo, p, rl);
    repo[rl] = 0;
    const char *q = name + nl;
    if (*q == '@') {
        size_t vl = strcspn(q + 1, "/");
        if (!vl || vl >= vcap) return ckpt_fail(err, -EINVAL, "%s: bad revision", path);
        memcpy(rev, q + 1, vl);
        rev[vl] = 0;
        q += 1 + vl;
    } else {
        snprintf(rev, vcap, "main");
    }
    *sub = *q == '/' ? q + 1 : q;
    return 0;
}

static int get_json(const char *url, const char *shown, strbuf *body, char **next, ckpt_err *err) {
    pthread_mutex_lock(&hf_lock);
    setup_auth();
    pthread_mutex_unlock(&hf_lock);
    char msg[512];
    http_req rq = {.url = url,
                   .shown = shown,
                   .auth = &hf_auth,
                   .body = body,
                   .body_cap = REMOTE_LIST_PAGE_BYTES};
    http_resp rs;
    int rc = http_perform(&rq, &rs, msg, sizeof msg);
    if (rc)
        rc = ckpt_fail(err, rc, "%s", msg);
    else if (rs.status != 200)
        rc = ckpt_fail(err,
                       rs.status == 404                       ? -ENOENT
                       : rs.status == 401 || rs.status == 403 ? -EACCES
                                                              : -EIO,
                       "%s: HTTP %ld%s", shown, rs.status,
                       rs.status == 401 || rs.status == 403
                           ? " (a gated or private repo needs HF_TOKEN)"
                       : rs.status == 404 ? " not found"
                                          : "");
    if (next) {
        *next = rs.next_link;
        rs.next_link = NULL;
    }
    http_resp_free(&rs);
    return rc;
}

static int add_tree_page(hf_repo *r, const char *text, size_t len, const char *shown,
                         remote_budget *budget, ckpt_err *err) {
    json_doc doc;
    json_error jerr;
    int rc = json_parse(&doc, text, len, &jerr);
    if (rc)
        return ckpt_fail(err, rc, "%s: tree JSON: %s (byte offset %zu)", shown, jerr.msg, jerr.pos);
    if (doc.root->type != JSON_ARRAY) {
        json_doc_free(&doc);
        return ckpt_fail(err, -EINVAL, "%s: tree JSON is not an array", shown);
    }
    hf_file *f = realloc(r->files, (r->n + doc.root->count + 1) * sizeof *f);
    if (!f)
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
    else
        r->files = f;
    for (const json_value *v = doc.root->head; v && !rc; v = v->next) {
        const json_value *p = json_member(v, "path"), *t = json_member(v, "type"),
                         *sz = json_member(v, "size");
        if (!p || p->type != JSON_STRING || !p->len || memchr(p->str, 0, p->len)) continue;
        if ((rc = remote_budget_entry(budget, p->len, err))) break;
        char *s = strndup(p->str, p->len);
        if (!s) {
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
            break;
        }
        uint64_t size = REMOTE_SIZE_UNKNOWN;
        if (sz && !json_as_u64(sz, &size)) size = REMOTE_SIZE_UNKNOWN;
        r->files[r->n++] = (hf_file){s, t && json_str_eq(t, "directory"), size};
    }
    json_doc_free(&doc);
    return rc;
}

int hf_pin(const char *path, char *out, size_t cap, ckpt_err *err) {
    char repo[512], rev[256];
    const char *sub;
    int rc = parse(path, repo, sizeof repo, rev, sizeof rev, &sub, err);
    if (rc) return rc;
    strbuf url, body;
    sb_init(&url);
    sb_init(&body);
    sb_printf(&url, "%s/api/models/%s/revision/", endpoint(), repo);
    http_escape(&url, rev, strlen(rev), false);
    char shown[1024];
    snprintf(shown, sizeof shown, "hf://%s@%s", repo, rev);
    hf_repo *r = calloc(1, sizeof *r);
    if (!r || !(r->repo = strdup(repo))) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    if (!rc) rc = get_json(url.data, shown, &body, NULL, err);
    if (!rc) {
        json_doc doc;
        json_error jerr;
        if ((rc = json_parse(&doc, body.data, body.len, &jerr)))
            rc = ckpt_fail(err, rc, "%s: revision JSON: %s", shown, jerr.msg);
        else {
            const json_value *sha = json_member(doc.root, "sha");
            bool hex = sha && sha->type == JSON_STRING && sha->len >= 7 && sha->len < sizeof r->sha;
            for (size_t i = 0; hex && i < sha->len; i++)
                hex = (sha->str[i] >= '0' && sha->str[i] <= '9') ||
                      (sha->str[i] >= 'a' && sha->str[i] <= 'f');
            if (!hex)
                rc = ckpt_fail(err, -EINVAL, "%s: the Hub named no commit (\"sha\")", shown);
            else
                memcpy(r->sha, sha->str, sha->len);
            json_doc_free(&doc);
        }
    }
    /* Every page of the recursive tree of that commit. */
    char *next = NULL;
    if (!rc) {
        sb_clear(&url);
        sb_printf(&url, "%s/api/models/%s/tree/%s?recursive=true", endpoint(), repo, r->sha);
        next = strdup(url.data);
        if (!next) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    }
    remote_budget budget;
    remote_budget_init(&budget, shown);
    while (!rc && next) {
        char *cur = next;
        next = NULL;
        rc = get_json(cur, shown, &body, &next, err);
        free(cur);
        if (!rc) rc = remote_budget_page(&budget, body.len, err);
        if (!rc) rc = add_tree_page(r, body.data ? body.data : "[]", body.len, shown, &budget, err);
    }
    free(next);
    sb_free(&url);
    sb_free(&body);
    if (!rc) {
        int w = snprintf(out, cap, "hf://%s@%s%s%s", repo, r->sha, *sub ? "/" : "", sub);
        if (w < 0 || (size_t)w >= cap) rc = ckpt_fail(err, -ENAMETOOLONG, "%s: too long", path);
        size_t l = strlen(out);
        while (l && out[l - 1] == '/') out[--l] = 0;
    }
    if (rc) {
        if (r) {
            for (size_t i = 0; i < r->n; i++) free(r->files[i].path);
            free(r->files);
            free(r->repo);
            free(r);
        }
        return rc;
    }
    pthread_mutex_lock(&hf_lock);
    r->next = repos;
    repos = r;
    pthread_mutex_unlock(&hf_lock);
    return 0;
}

int hf_target(const char *path, remote_target *t, ckpt_err *err) {
    char repo[512], rev[256];
    const char *sub;
    int rc = parse(path, repo, sizeof repo, rev, sizeof rev, &sub, err);
    if (rc) return rc;
    pthread_mutex_lock(&hf_lock);
    setup_auth();
    pthread_mutex_unlock(&hf_lock);
    sb_printf(&t->url, "%s/%s/resolve/", endpoint(), repo);
    http_escape(&t->url, rev, strlen(rev), false);
    sb_putc(&t->url, '/');
    http_escape(&t->url, sub, strlen(sub), true);
    t->auth = &hf_auth;
    return 0;
}

int hf_list(const char *dir, remote_entry **out, size_t *count, ckpt_err *err) {
    *out = NULL;
    *count = 0;
    char repo[512], rev[256];
    const char *sub;
    int rc = parse(dir, repo, sizeof repo, rev, sizeof rev, &sub, err);
    if (rc) return rc;
    pthread_mutex_lock(&hf_lock);
    hf_repo *r = repos;
    while (r && !(strcmp(r->repo, repo) == 0 && strcmp(r->sha, rev) == 0)) r = r->next;
    remote_listing l;
    remote_listing_init(&l, dir);
    size_t sl = strlen(sub);
    for (size_t i = 0; r && !rc && i < r->n; i++) {
        const char *p = r->files[i].path;
        if (sl && (strncmp(p, sub, sl) != 0 || p[sl] != '/')) continue;
        const char *rest = sl ? p + sl + 1 : p;
        size_t nl = strcspn(rest, "/");
        if (!nl) continue;
        bool dir_entry = rest[nl] == '/' || r->files[i].dir;
        rc = remote_listing_add(&l, rest, nl, dir_entry, r->files[i].size, err);
    }
    pthread_mutex_unlock(&hf_lock);
    if (!r && !rc)
        rc = ckpt_fail(err, -ENOENT, "%s: not a pinned repo (open it by its hf:// name)", dir);
    if (rc) {
        remote_listing_free(&l);
        return rc;
    }
    remote_listing_take(&l, out, count);
    return 0;
}
