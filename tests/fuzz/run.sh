#!/bin/bash
# Builds the libFuzzer harnesses (tests/fuzz/fuzz_*.c) with ASan + UBSan and runs each from its
# seed corpus for $FUZZ_SECONDS, then replays every saved regression input once.
#
# Environment:
#   FUZZ_SECONDS  seconds per harness (default 60)
#   FUZZ_ONLY     space-separated harness names to build and run (default: all)
#   FUZZ_JOBS     harnesses run at the same time (default 1)
#   FUZZ_BUILD    build directory (default build-fuzz)
#   CC            a clang with libFuzzer (default clang)
#   FUZZ_ARGS     more libFuzzer flags, e.g. "-fork=1 -ignore_crashes=1" to keep going after a
#                 finding (exploration; the default stops at the first one, as CI should)
#   FUZZ_EXTRA_CFLAGS  more compiler flags for the core and the harnesses
#
# The seed corpora are never written: each run fuzzes a scratch copy in $FUZZ_BUILD/run/NAME/
# (new inputs land there; crash-*, leak-*, timeout-*, oom-* files too). Exit status 1 when any
# harness crashed, leaked, timed out or ran out of memory, or a regression input fails.
set -u
cd "$(dirname "$0")/../.." || exit 2
B=${FUZZ_BUILD:-build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-60}
JOBS=${FUZZ_JOBS:-1}
CC=${CC:-clang}
case "$CC" in cc | gcc | */gcc | */cc) CC=clang ;; esac # make's default CC is no libFuzzer

if ! command -v "$CC" >/dev/null; then
    echo "run.sh: $CC not found (libFuzzer needs clang)" >&2
    exit 2
fi

harnesses=${FUZZ_ONLY:-$(ls tests/fuzz/fuzz_*.c | sed 's|.*/fuzz_||; s|\.c$||')}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all"
HDF5_CFLAGS=$(pkg-config --cflags hdf5 2>/dev/null || echo -I/usr/include/hdf5/serial)
HDF5_LIBS="-L/usr/lib/$(gcc -print-multiarch)/hdf5/serial -lhdf5_hl -lhdf5"
# core/util/version.c takes the version from VERSION, as the Makefile passes it.
VERSION_DEF="-DCKPT_VERSION=\"$(cat VERSION)\""
CFLAGS_FUZZ="-std=c17 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer $SAN -Icore -Itests/fuzz $HDF5_CFLAGS $VERSION_DEF ${FUZZ_EXTRA_CFLAGS:-}"

# ---- build: the core once (instrumented for coverage), then one binary per harness ----
mkdir -p "$B/obj" "$B/run"
echo "== building core with $CC ($SAN)"
objs=()
compile() { # src obj
    $CC $CFLAGS_FUZZ -fsanitize=fuzzer-no-link -c "$1" -o "$2" ||
        { echo "run.sh: cannot compile $1" >&2; return 1; }
}
active=0
build_failed=0
for src in $(find core -name "*.c" | sort); do
    obj="$B/obj/$(echo "${src%.c}" | tr / _).o"
    objs+=("$obj")
    compile "$src" "$obj" &
    active=$((active + 1))
    if [ "$active" -ge 2 ]; then
        wait -n || build_failed=1
        active=$((active - 1))
    fi
done
while [ "$active" -gt 0 ]; do
    wait -n || build_failed=1
    active=$((active - 1))
done
[ "$build_failed" -eq 0 ] || exit 2
rm -f "$B/libckpt-fuzz.a"
ar rcs "$B/libckpt-fuzz.a" "${objs[@]}" || exit 2
for h in $harnesses; do
    $CC $CFLAGS_FUZZ -fsanitize=fuzzer "tests/fuzz/fuzz_$h.c" "$B/libckpt-fuzz.a" -lcbor -lz -lzstd -lm -lcurl $HDF5_LIBS -lpthread \
        -o "$B/fuzz_$h" || { echo "run.sh: cannot build fuzz_$h" >&2; exit 2; }
done
echo "== built: $(echo $harnesses)"

# Inputs go to files in a scratch directory of their own (tmpfs when there is one).
if [ -d /dev/shm ] && [ -w /dev/shm ]; then tmp_base=/dev/shm; else tmp_base=$(pwd)/$B; fi
export CKPTFS_FUZZ_TMP="$tmp_base/ckptfs-fuzz-run.$$"
mkdir -p "$CKPTFS_FUZZ_TMP"
trap 'rm -rf "$CKPTFS_FUZZ_TMP"' EXIT
# Leaks are findings; so are sanitizer reports of any kind.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1"

run_one() {
    local h=$1 dir="$B/run/$1"
    rm -rf "$dir"
    mkdir -p "$dir/corpus"
    cp tests/fuzz/corpus/"$h"/* "$dir/corpus/" 2>/dev/null
    local seeds
    seeds=$(ls "$dir/corpus" | wc -l)
    "$B/fuzz_$h" -max_total_time="$SECONDS_EACH" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$dir/" ${FUZZ_ARGS:-} "$dir/corpus" >"$dir/log" 2>&1
    local rc=$?
    local execs new found
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
    # -fork mode prints no final stats: its last "#N:" status line has the count.
    [ -n "$execs" ] || execs=$(grep -a -o '^#[0-9]*' "$dir/log" | tail -1 | tr -d '#')
    new=$(($(ls "$dir/corpus" | wc -l) - seeds))
    found=$(ls "$dir" | grep -cE '^(crash|leak|timeout|oom|slow-unit)-')
    printf '%-12s executions %10s  new corpus items %5d  crashes %d  exit %d\n' \
        "$h" "${execs:-?}" "$new" "$found" "$rc" >"$dir/summary"
    if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
        grep -a -m1 -E 'ERROR: |invariant broken|runtime error' "$dir/log" | sed 's/^/    /' >>"$dir/summary"
        ls "$dir" | grep -E '^(crash|leak|timeout|oom)-' | sed "s|^|    artifact: $dir/|" >>"$dir/summary"
        return 1
    fi
}

echo "== fuzzing each harness for $SECONDS_EACH s ($JOBS at a time)"
failed=0
running=0
for h in $harnesses; do
    run_one "$h" &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then
        wait -n || failed=1
        running=$((running - 1))
    fi
done
while [ "$running" -gt 0 ]; do
    wait -n || failed=1
    running=$((running - 1))
done
for h in $harnesses; do cat "$B/run/$h/summary"; done

# ---- regressions: every saved input must now pass ----
echo "== regression inputs"
nreg=0
for d in tests/fuzz/regressions/*/; do
    [ -d "$d" ] || continue
    h=$(basename "$d")
    case " $(echo $harnesses) " in *" $h "*) ;; *) continue ;; esac
    files=$(find "$d" -maxdepth 1 -type f ! -name '*.md' ! -name '.*' | sort)
    [ -n "$files" ] || continue
    if [ ! -x "$B/fuzz_$h" ]; then
        echo "regressions/$h: no harness fuzz_$h was built" >&2
        failed=1
        continue
    fi
    for f in $files; do
        nreg=$((nreg + 1))
        if ! "$B/fuzz_$h" -timeout=10 -rss_limit_mb=2048 "$f" >"$B/run/regression.log" 2>&1; then
            echo "FAIL $f"
            grep -a -m3 -E 'ERROR: |invariant broken|runtime error|SUMMARY' "$B/run/regression.log" |
                sed 's/^/    /'
            failed=1
        fi
    done
done
echo "$nreg regression inputs replayed"
[ "$failed" -eq 0 ] && echo "== fuzz: no findings" || echo "== fuzz: FINDINGS (see above)"
exit "$failed"
