"""A Hugging Face Hub-shaped site served by nginx (tests/t/480-remote-hub.t and the bench):
api/models/REPO/revision/REV (the commit), api/models/REPO/tree/SHA (the file list, in pages
linked by Link: rel="next" as the Hub does), REPO/resolve/SHA/PATH answered with a 302 to the
bytes elsewhere (as the Hub redirects to its CDN)."""

import json
import os


def build_site(site, files_root, repo, sha, page_size=100, require_token=None):
    """Writes the api/ documents under `site` for every file under files_root; returns the
    nginx `extra` (locations) that serves them.  Files are served from files_root via /cdn/."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(files_root, followlinks=True):
        dirnames.sort()
        for d in dirnames:
            rel = os.path.relpath(os.path.join(dirpath, d), files_root)
            entries.append({"type": "directory", "path": rel, "oid": "0" * 40, "size": 0})
        for f in sorted(filenames):
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, files_root)
            entries.append({"type": "file", "path": rel, "oid": "1" * 40,
                            "size": os.path.getsize(full)})
    api = os.path.join(site, "api", "models", repo)
    os.makedirs(os.path.join(api, "revision"), exist_ok=True)
    os.makedirs(os.path.join(api, "tree"), exist_ok=True)
    for rev in ("main", sha):
        with open(os.path.join(api, "revision", rev), "w") as f:
            json.dump({"id": repo, "sha": sha, "siblings": []}, f)
    pages = [entries[i:i + page_size] for i in range(0, len(entries), page_size)] or [[]]
    for i, page in enumerate(pages):
        with open(os.path.join(api, "tree", "%s.page%d" % (sha, i)), "w") as f:
            json.dump(page, f)
    # Page i links page i+1 with the cursor query the Hub uses.
    links = "\n".join(
        '        if ($uri = /tree-pages/%s.page%d) { add_header Link \'<$scheme://$http_host/api/'
        'models/%s/tree/%s?recursive=true&cursor=%d>; rel="next"\' always; }'
        % (sha, i, repo, sha, i + 1)
        for i in range(len(pages) - 1))
    guard = ('        if ($http_authorization != "Bearer %s") { return 401; }\n' % require_token
             if require_token else "")
    return """
    location /api/models/%(repo)s/revision/ {
%(guard)s        default_type application/json;
        alias %(api)s/revision/;
    }
    location = /api/models/%(repo)s/tree/%(sha)s {
%(guard)s        default_type application/json;
        set $page 0;
        if ($arg_cursor) { set $page $arg_cursor; }
        rewrite ^ /tree-pages/%(sha)s.page$page last;
    }
    location /tree-pages/ {
        internal;
        default_type application/json;
        alias %(api)s/tree/;
%(links)s
    }
    location ~ ^/%(repo)s/resolve/%(sha)s/(.*)$ {
%(guard)s        return 302 /cdn/$1;
    }
    location /cdn/ {
        alias %(files)s/;
    }
""" % {"repo": repo, "api": api, "sha": sha, "links": links, "guard": guard,
       "files": os.path.abspath(files_root)}
