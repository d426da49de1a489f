#!/usr/bin/env bash
# Every example answers --help with its usage on stdout (exit 0), and an unknown option with
# the reason and its usage on stderr and nothing on stdout (exit 2).
#   examples_help.sh <example binary>...
set -uo pipefail
failed=0
fail() {
    echo "FAIL: $*" >&2
    failed=1
}
for program in "$@"; do
    name=$(basename "$program")
    status=0
    out=$("$program" --help 2> /dev/null) || status=$?
    if [ "$status" -ne 0 ] || ! grep -q "^usage: $name " <<< "$out" || ! grep -q -- '--fresh' <<< "$out"; then
        fail "$name --help: status $status, stdout:"$'\n'"$out"
    fi
    status=0
    err=$("$program" --no-such-option 2>&1 > "${TMPDIR:-/tmp}/examples_help.$$") || status=$?
    out=$(cat "${TMPDIR:-/tmp}/examples_help.$$")
    rm -f "${TMPDIR:-/tmp}/examples_help.$$"
    if [ "$status" -ne 2 ] || [ -n "$out" ] || ! grep -q "unknown option '--no-such-option'" <<< "$err" ||
        ! grep -q "^usage: $name " <<< "$err"; then
        fail "$name --no-such-option: status $status, stdout '$out', stderr:"$'\n'"$err"
    fi
    [ "$failed" -ne 0 ] || echo "$name: --help exits 0 with its usage, an unknown option exits 2"
done
exit "$failed"
