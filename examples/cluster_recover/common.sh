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

# start_redis <work dir> <port> <appendonly: yes|no> <n>: a redis-server on loopback, without
# snapshots (with an append-only file fsynced on every write when asked), its log in
# <work dir>/redis-<n>.log; returns once it accepts connections, its pid in redis_pid.
start_redis() {
    /usr/bin/redis-server --port "$2" --bind 127.0.0.1 --save "" --appendonly "$3" --appendfsync always --dir "$1" \
        > "$1/redis-$4.log" 2>&1 &
    redis_pid=$!
    wait_for_line "$1/redis-$4.log" "Ready to accept connections" 20
}

# free_port: a loopback TCP port nobody listens on now, below the kernel's range of ephemeral
# ports (or above it): a port in that range can be taken at any moment as the local port of
# an outgoing connection, a concurrent test's among them, and a server then cannot bind it.
free_port() {
    local p low high
    read -r low high < /proc/sys/net/ipv4/ip_local_port_range
    for _ in $(seq 1 200); do
        if [ "$low" -gt 11024 ]; then p=$((10000 + RANDOM % (low - 10000))); else p=$((high + 1 + RANDOM % (65535 - high))); fi
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    echo "no free port found" >&2
    exit 1
}

# start_redis_on_free_port <work dir> <appendonly: yes|no> <n>: start_redis on a free port, in
# port; another one when a concurrent test took the port between the look and the bind.
start_redis_on_free_port() {
    local try
    for try in 1 2 3 4 5; do
        port=$(free_port)
        /usr/bin/redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly "$2" --appendfsync always \
            --dir "$1" > "$1/redis-$3.log" 2>&1 &
        redis_pid=$!
        local deadline=$((SECONDS + 20))
        until grep -q "Ready to accept connections\|Address already in use" "$1/redis-$3.log" 2>/dev/null; do
            if [ $SECONDS -ge $deadline ] || ! kill -0 "$redis_pid" 2>/dev/null; then break; fi
            sleep 0.02
        done
        grep -q "Ready to accept connections" "$1/redis-$3.log" && return
        kill -9 "$redis_pid" 2>/dev/null || true
        wait "$redis_pid" 2>/dev/null || true
        grep -q "Address already in use" "$1/redis-$3.log" || break
        echo "port $port was taken; trying another" >&2
    done
    echo "redis-server did not start:" >&2
    cat "$1/redis-$3.log" >&2
    exit 1
}

# same_as_straight <job log> <ckpt-run> <cluster_recover> <work dir> <options…>: checks that
# every rank of <job log> ended with the final_params_xxh64 of the job run on one host with
# nothing failing. That run's hash is kept beside the work dir, by the program's checksum and
# the options that change the numbers (not those of saving, recovery or timing), so that the
# tests of one build run it once; concurrent tests wait for each other's run (flock).
same_as_straight() {
    local log=$1 launcher=$2 program=$3 work=$4 recovered straight key cache
    shift 4
    recovered=$(final_hashes "$log")
    key=$(
        md5sum < "$program" | cut -c1-16
        echo "$@" | sed -E 's/--(cooldown-ms|memory-every|keep|save-every|timeout-ms|die-in-transfer|die-rank) [0-9]+//g;
                             s/--(last-words|fresh)//g; s/ +/ /g; s/^ //; s/ $//'
    )
    cache="$(dirname "$work")/cluster_recover_straight"
    mkdir -p "$cache"
    local file
    file="$cache/$(echo "$key" | md5sum | cut -c1-16)"
    straight=$(
        exec 9> "$file.lock"
        flock 9
        if [ ! -s "$file.hash" ]; then
            rm -rf "$file.dir" && mkdir -p "$file.dir"
            "$launcher" --nproc 4 --store "file://$file.dir/store" -- \
                "$program" --dir "$file.dir/checkpoints" "$@" > "$file.log" 2>&1 || { cat "$file.log" >&2; exit 1; }
            final_hashes "$file.log" > "$file.hash"
        fi
        cat "$file.hash"
    )
    if [ "$recovered" != "$straight" ]; then
        echo "MISMATCH: recovered $recovered, without a failure $straight ($file.log)" >&2
        exit 1
    fi
    echo "every rank ends bit-identical to the run without a failure: $recovered"
}

# memory_every <options…>: the K of --memory-every K among the options (empty without it).
memory_every() {
    echo "$@" | sed -n 's/.*--memory-every \([0-9]*\).*/\1/p'
}

# memory_if_asked <job log> <options…>: with --memory-every among the options, the rollback
# must have come from the memory level.
memory_if_asked() {
    local log=$1
    shift
    case " $* " in
        *" --memory-every "*)
            grep -q "every rank resumes at global step [0-9]* (.*) from memory" "$log" ||
                { echo "--memory-every was given, yet the rollback did not come from memory" >&2; exit 1; }
            echo "the rollback came from the memory level" ;;
    esac
}
