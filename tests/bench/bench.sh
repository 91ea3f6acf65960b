#!/usr/bin/env bash
# Read benchmark: ckptfs vs a bare FUSE passthrough vs the source file, 1 GiB, page cache warm.
#
# usage: tests/bench/bench.sh CKPTFS PASSTHROUGH OUTDIR        (as root; `make bench` calls this)
#
# env:  RUNS=5          rounds; every round remounts every configuration
#       CKPTFS_SRC=...  what to mount with CKPTFS (default OUTDIR/data/big/model.safetensors)
#       CKPTFS_FILE=weight  the file to read inside the ckptfs mount
#       RA_KB=1024      readahead_kb value of the "ra" configurations
#       DD_BS=1M        dd block size
#       PIPE_MAX_SIZE=N set fs.pipe-max-size to N for the run (restored on exit); see the note below
#
# Every configuration is mounted fresh, so "first" is a read with an empty FUSE page cache (the
# source stays cached) and "reread" is served from the FUSE mount's page cache (keep_cache).
# A mount that fails (e.g. an option the daemon does not know yet) is recorded as n/a.
# Writes OUTDIR/bench-read.json (all raw numbers) and OUTDIR/bench-read.tsv; prints a table.
# MB/s is 10^6 bytes per second, as dd reports it.
#
# Splice note: libfuse sends a spliced reply through a pipe that must hold the whole reply (data +
# a few pages). A 1 MiB READ (readahead_kb=1024) needs more than the default fs.pipe-max-size of
# 1 MiB; without CAP_SYS_RESOURCE libfuse cannot exceed it and silently falls back to a copy that
# mallocs (mmaps) a fresh buffer per request. The JSON records both facts; PIPE_MAX_SIZE=4194304
# shows what splice does when the pipe can grow.
set -euo pipefail
export LC_ALL=C

if (($# != 3)); then
    echo "usage: $0 CKPTFS PASSTHROUGH OUTDIR" >&2
    exit 2
fi
CKPTFS=$1
PASSTHROUGH=$2
OUT=$3
RUNS=${RUNS:-5}
RA_KB=${RA_KB:-1024}
DD_BS=${DD_BS:-1M}
PIPE_MAX_SIZE=${PIPE_MAX_SIZE:-}
OLD_PIPE_MAX=
SIZE=1073741824 # 1 GiB, F32 [268435456]
DD_TIMEOUT=120

[[ $RUNS =~ ^[1-9][0-9]*$ && $RA_KB =~ ^[1-9][0-9]*$ && $PIPE_MAX_SIZE =~ ^([1-9][0-9]*)?$ ]] ||
    { echo "bench: RUNS, RA_KB and PIPE_MAX_SIZE must be positive integers" >&2; exit 2; }
((EUID == 0)) || echo "bench: warning: not root; read_ahead_kb cannot be set" >&2
for b in "$CKPTFS" "$PASSTHROUGH"; do
    [[ -x $b ]] || echo "bench: warning: $b is not executable; its mounts will be n/a" >&2
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DATA=$OUT/data
CKPTFS_SRC=${CKPTFS_SRC:-$DATA/big/model.safetensors}
CKPTFS_FILE=${CKPTFS_FILE:-weight}

MNT=$(mktemp -d "${TMPDIR:-/tmp}/ckptfs-bench.XXXXXX")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckptfs-bench-work.XXXXXX")
RESULTS=$WORK/results.tsv # workload settings phase round mbps bytes secs
META=$WORK/meta.tsv       # workload settings key value
: >"$RESULTS"
: >"$META"

is_mounted() { awk -v m="$MNT" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }
mount_dev() { awk -v m="$MNT" '$5 == m { d = $3 } END { print d }' /proc/self/mountinfo; }

unmount() {
    is_mounted || return 0
    local dev i
    dev=$(mount_dev)
    for i in 1 2 3 4 5; do
        timeout --foreground -k 2 10 fusermount3 -u "$MNT" 2>/dev/null && return 0
        is_mounted || return 0
        sleep 0.2
    done
    # Busy or hung daemon: abort the FUSE connection, then detach lazily.
    echo "bench: warning: $MNT busy, aborting connection $dev" >&2
    if [[ -n $dev && -e /sys/fs/fuse/connections/${dev#*:}/abort ]]; then
        echo 1 >"/sys/fs/fuse/connections/${dev#*:}/abort" 2>/dev/null || true
    fi
    timeout --foreground -k 2 10 fusermount3 -uz "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    unmount
    if [[ -n $OLD_PIPE_MAX ]]; then
        { echo "$OLD_PIPE_MAX" >/proc/sys/fs/pipe-max-size; } 2>/dev/null || true
    fi
    is_mounted && echo "bench: ERROR: could not unmount $MNT" >&2 || rmdir "$MNT" 2>/dev/null || true
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- data -----------------------------------------------------------------------------------
make_data() {
    mkdir -p "$DATA/raw" "$DATA/big"
    if [[ ! -f $DATA/raw/weight || $(stat -c %s "$DATA/raw/weight") != "$SIZE" ]]; then
        echo "bench: writing $DATA/raw/weight (1 GiB from /dev/urandom)" >&2
        head -c "$SIZE" /dev/urandom >"$DATA/raw/weight.tmp"
        mv "$DATA/raw/weight.tmp" "$DATA/raw/weight"
        rm -f "$DATA/big/model.safetensors"
    fi
    local json='{"weight":{"dtype":"F32","shape":[268435456],"data_offsets":[0,1073741824]}}'
    while ((${#json} % 8)); do json+=' '; done
    local hlen=${#json} total=$((8 + ${#json} + SIZE))
    local st=$DATA/big/model.safetensors
    if [[ ! -f $st || $(stat -c %s "$st") != "$total" ]]; then
        echo "bench: writing $st" >&2
        {
            local i
            for i in 0 1 2 3 4 5 6 7; do printf '%b' "\\x$(printf %02x $(((hlen >> (8 * i)) & 255)))"; done
            printf '%s' "$json"
            cat "$DATA/raw/weight"
        } >"$st.tmp"
        mv "$st.tmp" "$st"
    fi
}
make_data
if [[ -n $PIPE_MAX_SIZE ]]; then
    OLD_PIPE_MAX=$(cat /proc/sys/fs/pipe-max-size)
    echo "$PIPE_MAX_SIZE" >/proc/sys/fs/pipe-max-size
fi
PIPE_MAX=$(cat /proc/sys/fs/pipe-max-size)
CAP_EFF=$(awk '/^CapEff:/ { print $2 }' /proc/self/status)
CAP_SYS_RESOURCE=false
(((16#$CAP_EFF >> 24) & 1)) && CAP_SYS_RESOURCE=true
if ((PIPE_MAX <= RA_KB * 1024)) && [[ $CAP_SYS_RESOURCE == false ]]; then
    echo "bench: note: fs.pipe-max-size=$PIPE_MAX and no CAP_SYS_RESOURCE: spliced" \
        "${RA_KB} KiB replies fall back to copying (try PIPE_MAX_SIZE=4194304)" >&2
fi
echo "bench: warming the page cache" >&2
cat "$DATA/raw/weight" "$DATA/big/model.safetensors" >/dev/null

# ---- measurement ----------------------------------------------------------------------------
# record WORKLOAD SETTINGS PHASE ROUND FILE: one dd pass, appended to RESULTS (n/a on failure)
record() {
    local w=$1 s=$2 p=$3 r=$4 f=$5 log=$WORK/dd.log line bytes secs
    if timeout --foreground -k 5 "$DD_TIMEOUT" dd if="$f" of=/dev/null bs="$DD_BS" 2>"$log"; then
        line=$(grep copied "$log" | tail -n 1)
        bytes=${line%% *}
        secs=$(awk '{ print $(NF - 3) }' <<<"$line")
        if [[ $bytes == "$SIZE" ]] && awk -v s="$secs" 'BEGIN { exit !(s > 0) }'; then
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$w" "$s" "$p" "$r" \
                "$(awk -v b="$bytes" -v s="$secs" 'BEGIN { printf "%.1f", b / s / 1e6 }')" \
                "$bytes" "$secs" >>"$RESULTS"
            return 0
        fi
        echo "bench: $w/$s/$p: short read ($bytes bytes) from $f" >&2
    else
        echo "bench: $w/$s/$p: dd failed or timed out on $f: $(tail -n 1 "$log")" >&2
    fi
    printf '%s\t%s\t%s\t%s\tna\t\t\n' "$w" "$s" "$p" "$r" >>"$RESULTS"
    return 1
}

meta() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$META"; }
declare -A SAID # print each configuration's mount error once

# run_mount WORKLOAD SETTINGS ROUND BINARY SOURCE FILE [daemon options...]
run_mount() {
    local w=$1 s=$2 r=$3 bin=$4 src=$5 file=$6 log=$WORK/mount.log
    shift 6
    unmount
    if ! timeout --foreground -k 5 60 "$bin" "$src" "$MNT" "$@" >"$log" 2>&1 || ! is_mounted; then
        if [[ -z ${SAID[$w/$s]:-} ]]; then
            echo "bench: $w/$s: mount failed ($bin $src MNT $*): $(head -c 300 "$log")" >&2
            SAID[$w/$s]=1
        fi
        unmount
        printf '%s\t%s\t%s\t%s\tna\t\t\n' "$w" "$s" first "$r" "$w" "$s" reread "$r" >>"$RESULTS"
        return 0
    fi
    [[ -s $log && -z ${SAID[$w/$s]:-} ]] && sed "s|^|bench: $w/$s: daemon says: |" "$log" >&2
    SAID[$w/$s]=1
    record "$w" "$s" first "$r" "$MNT/$file" || true
    record "$w" "$s" reread "$r" "$MNT/$file" || true
    if ((r == 1)); then
        local dev
        dev=$(mount_dev)
        meta "$w" "$s" readahead_kb "$(cat "/sys/class/bdi/$dev/read_ahead_kb" 2>/dev/null || echo na)"
        if cmp -s "$MNT/$file" "$DATA/raw/weight"; then
            meta "$w" "$s" verified true
        else
            echo "bench: WARNING: $w/$s: $MNT/$file differs from the source bytes" >&2
            meta "$w" "$s" verified false
        fi
    fi
    unmount
}

start=$(date +%s)
for ((r = 1; r <= RUNS; r++)); do
    echo "bench: round $r/$RUNS" >&2
    record source - read "$r" "$DATA/raw/weight" || true
    run_mount bare-copy default "$r" "$PASSTHROUGH" "$DATA/raw" weight
    run_mount bare-copy "ra$RA_KB" "$r" "$PASSTHROUGH" "$DATA/raw" weight -o "readahead_kb=$RA_KB"
    run_mount bare-splice default "$r" "$PASSTHROUGH" "$DATA/raw" weight -o splice
    run_mount bare-splice "ra$RA_KB" "$r" "$PASSTHROUGH" "$DATA/raw" weight -o splice \
        -o "readahead_kb=$RA_KB"
    run_mount ckptfs default "$r" "$CKPTFS" "$CKPTFS_SRC" "$CKPTFS_FILE"
    run_mount ckptfs "ra$RA_KB" "$r" "$CKPTFS" "$CKPTFS_SRC" "$CKPTFS_FILE" -o "readahead_kb=$RA_KB"
done
elapsed=$(($(date +%s) - start))
cp "$RESULTS" "$OUT/bench-read.tsv"

# ---- summary: table on stdout, JSON file --------------------------------------------------
# Reference for "vs bare" is bare-copy with the same settings and phase; for bare-copy itself
# it is left empty. Rows keep the order in which they first appear in RESULTS.
awk -F '\t' -v json="$OUT/bench-read.json" -v metaf="$META" -v runs="$RUNS" -v size="$SIZE" \
    -v ckptfs="$CKPTFS" -v pt="$PASSTHROUGH" -v src="$CKPTFS_SRC" -v elapsed="$elapsed" \
    -v pipemax="$PIPE_MAX" -v capres="$CAP_SYS_RESOURCE" -v bs="$DD_BS" -v kernel="$(uname -r)" -v ncpu="$(nproc)" -v date="$(date -u +%Y-%m-%dT%H:%M:%SZ)" '
function jstr(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return "\"" s "\"" }
function jnum(x) { return x == "" ? "null" : x }
function median(k,    n, i, j, a, t) {
    n = 0
    for (i = 1; i <= cnt[k]; i++) if (v[k, i] != "na") a[++n] = v[k, i] + 0
    if (n == 0) return ""
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    lo[k] = a[1]; hi[k] = a[n]; ok[k] = n
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function ratio(a, b) { return (a == "" || b == "" || b == 0) ? "" : sprintf("%.2f", a / b) }
FILENAME == metaf { m[$1 "|" $2 "|" $3] = $4; next }
{
    k = $1 "|" $2 "|" $3
    if (!(k in cnt)) { order[++nk] = k; W[k] = $1; S[k] = $2; P[k] = $3 }
    cnt[k]++; v[k, cnt[k]] = $5; sec[k, cnt[k]] = $7
}
END {
    for (i = 1; i <= nk; i++) { k = order[i]; med[k] = median(k) }
    srck = "source|-|read"
    printf "%-34s %10s %19s %9s %8s %6s\n", "workload (1 GiB, dd bs=" bs ")", "median MB/s", "min-max", "vs source", "vs bare", "ra_kb"
    print "---------------------------------- ----------- ------------------- --------- -------- ------"
    printf "{\n  \"benchmark\": \"read\",\n  \"bytes\": %d,\n  \"runs\": %d,\n  \"unit\": \"MB/s (1e6 bytes/s)\",\n  \"dd_bs\": %s,\n", size, runs, jstr(bs) > json
    printf "  \"kernel\": %s,\n  \"cpus\": %d,\n  \"date\": %s,\n  \"elapsed_s\": %d,\n", jstr(kernel), ncpu, jstr(date), elapsed > json
    printf "  \"pipe_max_size\": %d,\n  \"cap_sys_resource\": %s,\n", pipemax, capres > json
    printf "  \"ckptfs\": %s,\n  \"passthrough\": %s,\n  \"ckptfs_source\": %s,\n  \"results\": [\n", jstr(ckptfs), jstr(pt), jstr(src) > json
    for (i = 1; i <= nk; i++) {
        k = order[i]
        bk = "bare-copy|" S[k] "|" P[k]
        vs_src = ratio(med[k], med[srck])
        vs_bare = (W[k] == "bare-copy" || W[k] == "source") ? "" : ratio(med[k], med[bk])
        ra = m[W[k] "|" S[k] "|readahead_kb"]
        label = W[k] (S[k] == "-" ? "" : " " S[k]) " " P[k]
        if (med[k] == "")
            printf "%-34s %10s %19s %9s %8s %6s\n", label, "n/a", "", "", "", ""
        else
            printf "%-34s %10.0f %19s %9s %8s %6s\n", label, med[k], sprintf("%.0f-%.0f", lo[k], hi[k]),
                vs_src == "" ? "-" : vs_src "x", vs_bare == "" ? "-" : vs_bare "x", ra
        mb = ""; ss = ""
        for (j = 1; j <= cnt[k]; j++) {
            mb = mb (j > 1 ? ", " : "") (v[k, j] == "na" ? "null" : v[k, j])
            ss = ss (j > 1 ? ", " : "") jnum(sec[k, j])
        }
        ver = m[W[k] "|" S[k] "|verified"]
        printf "    {\"workload\": %s, \"settings\": %s, \"phase\": %s, \"mbps\": [%s], \"seconds\": [%s], ", jstr(W[k]), jstr(S[k]), jstr(P[k]), mb, ss > json
        printf "\"median_mbps\": %s, \"min_mbps\": %s, \"max_mbps\": %s, \"ok_runs\": %d, ", jnum(med[k]), jnum(med[k] == "" ? "" : lo[k]), jnum(med[k] == "" ? "" : hi[k]), ok[k] + 0 > json
        printf "\"vs_source\": %s, \"vs_bare\": %s, \"readahead_kb\": %s, \"verified\": %s}%s\n", jnum(vs_src), jnum(vs_bare), (ra == "" || ra == "na") ? "null" : ra, ver == "" ? "null" : ver, i < nk ? "," : "" > json
    }
    print "  ]\n}" > json
}' "$META" "$RESULTS"
echo "bench: raw numbers in $OUT/bench-read.json ($elapsed s)" >&2
