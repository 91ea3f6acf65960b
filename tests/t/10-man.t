#!/bin/bash
# Man pages lint clean and document every option that --help lists.
n=0; fail=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi; }
root=$(dirname "$(realpath "$0")")/../..
CKPTFS=${CKPTFS:-$root/build/ckptfs}
for page in "$root"/man/*.[1-8]; do
    out=$(mandoc -T lint -W warning "$page" 2>&1)
    ok $? "mandoc -T lint $(basename "$page")"
    [ -n "$out" ] && echo "$out" | sed 's/^/#   /'
done
help=$("$CKPTFS" --help)
ok $? "ckptfs --help exits 0"
lines=$(printf '%s\n' "$help" | wc -l)
[ "$lines" -le 30 ]; ok $? "--help fits a screen ($lines lines)"
for opt in $(printf '%s\n' "$help" | grep -oE '^  [a-z_]+(=|,)' | tr -d ' =,'); do
    grep -q -- "$opt" "$root/man/ckptfs.1"; ok $? "option $opt is in ckptfs(1)"
done
echo "1..$n"
exit $fail
