#!/usr/bin/env bash
# Seed 004 across three hosts: network namespaces joined by veth pairs through a bridge,
# each with its own hostname. The store (a redis-server) is on the first; two workers run
# on each of the others under their own ckpt-run. Rank 3 is killed with SIGKILL mid-run
# and its host's ckpt-run starts it again; the workers of the other host learn of the death
# from its heartbeat in the store. Every rank must end bit-identical to a one-host run in
# which nothing failed. Needs root and `ip netns`; otherwise it says why and exits 77 (skipped).
#   hosts.sh <cluster_recover> <ckpt-run> <work dir> [options]
set -euo pipefail
program=$1
launcher=$2
work=$3
shift 3
export OPENBLAS_NUM_THREADS=1
source "$(dirname "$0")/common.sh"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: network namespaces need root"; exit 77; fi
for tool in ip unshare; do
    command -v "$tool" > /dev/null || { echo "SKIP: no $tool"; exit 77; }
done
store_ns=ckpt-store-$$ a_ns=ckpt-host-a-$$ b_ns=ckpt-host-b-$$
if ! ip netns add "$store_ns" 2> /dev/null; then echo "SKIP: this machine does not allow ip netns"; exit 77; fi
cleanup() {
    for ns in "$store_ns" "$a_ns" "$b_ns"; do
        for pid in $(ip netns pids "$ns" 2> /dev/null); do kill -9 "$pid" 2> /dev/null || true; done
        ip netns del "$ns" 2> /dev/null || true
    done
}
trap cleanup EXIT
rm -rf "$work"
mkdir -p "$work"

# the network: a bridge in the store's namespace, a veth pair to each worker host
ip netns add "$a_ns"
ip netns add "$b_ns"
in_ns() { ip netns exec "$@"; }
in_ns "$store_ns" ip link add br0 type bridge
in_ns "$store_ns" ip addr add 10.77.0.1/24 dev br0
in_ns "$store_ns" ip link set br0 up
in_ns "$store_ns" ip link set lo up
n=2
for ns in "$a_ns" "$b_ns"; do
    ip link add "veth$n-$$" type veth peer name "vbr$n-$$"
    ip link set "veth$n-$$" netns "$ns"
    ip link set "vbr$n-$$" netns "$store_ns"
    in_ns "$store_ns" ip link set "vbr$n-$$" master br0 up
    in_ns "$ns" ip addr add "10.77.0.$n/24" dev "veth$n-$$"
    in_ns "$ns" ip link set "veth$n-$$" up
    in_ns "$ns" ip link set lo up
    n=$((n + 1))
done

in_ns "$store_ns" /usr/bin/redis-server --port 6379 --bind 10.77.0.1 --save "" --appendonly no --dir "$work" \
    --protected-mode no > "$work/redis.log" 2>&1 &
wait_for_line "$work/redis.log" "Ready to accept connections" 20

# host A: ranks 0 and 1; host B: ranks 2 and 3
host() {  # host <ns> <hostname> <first rank> <address> <log> <options…>
    in_ns "$1" unshare --uts sh -c "hostname $2 && exec \"\$@\"" sh \
        "$launcher" --nproc 2 --first-rank "$3" --world-size 4 --store redis://10.77.0.1:6379 --max-restarts 1 -- \
        "$program" --dir "$work/checkpoints" --address "$4" "${@:6}" > "$5" 2>&1
}
host "$a_ns" ckpt-host-a 0 10.77.0.2 "$work/a.log" "$@" &
a_job=$!
host "$b_ns" ckpt-host-b 2 10.77.0.3 "$work/b.log" "$@" &
b_job=$!
wait_for_line "$work/a.log" "^step 30:" 120
pid=$(sed -n 's/^rank 3: pid \([0-9]*\), start 1$/\1/p' "$work/b.log")
echo "killing rank 3 (pid $pid, on host B) after global step 30"
kill -9 "$pid"
a_status=0 b_status=0
wait "$a_job" || a_status=$?
wait "$b_job" || b_status=$?
cat "$work/a.log" "$work/b.log"
[ "$a_status" -eq 0 ] && [ "$b_status" -eq 0 ] || { echo "host A ended with $a_status, host B with $b_status" >&2; exit 1; }
grep -q "^rank 3: pid [0-9]*, start 2$" "$work/b.log" || { echo "rank 3 was not started again" >&2; exit 1; }
grep -q "every rank resumes at global step" "$work/a.log" || { echo "no rollback happened" >&2; exit 1; }
memory_if_asked "$work/a.log" "$@"
cat "$work/a.log" "$work/b.log" > "$work/job.log"
same_as_straight "$work/job.log" "$launcher" "$program" "$work" "$@"
