# Helpers of the cluster_recover scripts.

# wait_for_line <file> <regex> <seconds>: returns once a line of <file> matches.
wait_for_line() {
    local deadline=$((SECONDS + $3))
    until grep -q "$2" "$1" 2>/dev/null; do
        if [ $SECONDS -ge $deadline ]; then
            echo "no line matching '$2' in $1 within $3 s" >&2
            cat "$1" >&2
            exit 1
        fi
        sleep 0.02
    done
}

# final_hashes <log>: the single final_params_xxh64 that all 4 ranks printed (fails otherwise).
final_hashes() {
    local n distinct
    n=$(grep -c '^rank [0-9]*: final_params_xxh64=' "$1" || true)
    distinct=$(grep -o 'final_params_xxh64=[0-9a-f]*' "$1" | sort -u)
    if [ "$n" -ne 4 ] || [ "$(echo "$distinct" | wc -l)" -ne 1 ]; then
        echo "expected 4 ranks to end with one final_params_xxh64, got $n lines: $distinct" >&2
        exit 1
    fi
    echo "$distinct"
}

# free_port: a loopback TCP port nobody listens on now.
free_port() {
    local p
    for _ in $(seq 1 200); do
        p=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    echo "no free port found" >&2
    exit 1
}
