#!/usr/bin/env bash
# Every example answers --help with its usage on stdout (exit 0), and an unknown option with
# the reason and its usage on stderr and nothing on stdout (exit 2); options that could not
# work (a fault step 0, --ranks against the launcher's world size) exit 2 before anything runs.
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
    # a fault that would never fire is refused before anything runs
    case "$name" in last_words | uce_recover)
        status=0
        err=$("$program" --fail-step 0 2>&1 > /dev/null) || status=$?
        if [ "$status" -ne 2 ] || ! grep -q -- "--fail-step must be at least 1" <<< "$err"; then
            fail "$name --fail-step 0: status $status, stderr:"$'\n'"$err"
        fi
        ;;
    esac
    if [ "$name" = last_words ]; then  # under a launcher, --nproc sets the ranks
        status=0
        err=$(RANK=0 WORLD_SIZE=2 CKPT_STORE=file:///nonexistent "$program" --ranks 4 2>&1 > /dev/null) || status=$?
        if [ "$status" -ne 2 ] || ! grep -q "differs from the launcher's WORLD_SIZE 2" <<< "$err"; then
            fail "$name --ranks 4 under a launcher of 2: status $status, stderr:"$'\n'"$err"
        fi
    fi
done
exit "$failed"
