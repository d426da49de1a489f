#!/usr/bin/env bash
# How soon every survivor hears of a death: examples/cluster_recover/kill_each.sh (four
# workers under ckpt-run over GlooComm, each killed with SIGKILL in turn and started again),
# run N times at a 60 s communication timeout, its job log time-stamped line by line as it is
# written. For each kill:
#   report   from ckpt-run's line saying the worker was killed to the last of the three
#            survivors' lines saying their call failed
#   resume   from the same line to the one saying every rank resumes
# A survivor that waited its call's timeout out (the stall GlooComm's watch removed, see
# docs/ROBUSTNESS.md) shows as a report of about 60 s. With --beside-hosts each run has
# examples/cluster_recover/hosts.sh (three network namespaces, root only) running beside it,
# as ctest runs the two. Last line:
#   failure_reports runs=N kills=K slowest_report_s=X slowest_resume_s=Y reports_over_2s=Z
#
#   bench/failure_reports.sh <cluster_recover> <ckpt-run> [runs] [--beside-hosts]
# Exit status 1 if a run did not time what it planned: four kills, each with three survivors'
# failure lines and a resume line after it, and the job passing its own checks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
program=$1
launcher=$2
runs=${3:-20}
beside=${4:-}
[ "$runs" -ge 1 ] || { echo "failure_reports: runs must be at least 1" >&2; exit 2; }
case "$beside" in "" | --beside-hosts) ;; *) echo "failure_reports: unknown option '$beside'" >&2; exit 2 ;; esac
work=$(mktemp -d /var/tmp/ckpt-failure-reports-XXXXXX)
stamper=
trap '[ -z "$stamper" ] || kill "$stamper" 2> /dev/null || true; rm -rf "$work"' EXIT
echo "failure_reports: $runs run(s) of kill_each.sh at a 60 s timeout${beside:+, hosts.sh beside}; $(nproc) cores, $(date -u +%F)"

slowest_report=0 slowest_resume=0 over=0 kills=0
for ((run = 1; run <= runs; run++)); do
    rm -rf "$work/each" "$work/hosts"  # kill_each.sh makes its directory anew
    hosts=
    if [ -n "$beside" ]; then
        bash "$root/examples/cluster_recover/hosts.sh" "$program" "$launcher" "$work/hosts" --epochs 3 --cooldown-ms 2000 \
            --memory-every 2 --timeout-ms 60000 > "$work/hosts.out" 2>&1 &
        hosts=$!
    fi
    # every line of the job log with the time it was read (tail follows the file as it grows)
    : > "$work/stamped.log"
    (tail -F -n +1 "$work/each/job.log" 2> /dev/null |
        while IFS= read -r line; do echo "$(date +%s.%N) $line"; done > "$work/stamped.log") 2> /dev/null &
    stamper=$!
    status=0
    bash "$root/examples/cluster_recover/kill_each.sh" "$program" "$launcher" "$work/each" --memory-every 2 \
        --cooldown-ms 0 --timeout-ms 60000 > "$work/each.out" 2>&1 || status=$?
    sleep 0.2  # the last lines through tail
    pkill -P "$stamper" 2> /dev/null || true
    kill "$stamper" 2> /dev/null || true
    wait "$stamper" 2> /dev/null || true
    stamper=
    [ "$status" -eq 0 ] || { echo "failure_reports: run $run: kill_each.sh failed:" >&2; cat "$work/each.out" >&2; exit 1; }
    if [ -n "$hosts" ]; then
        hosts_status=0
        wait "$hosts" || hosts_status=$?
        [ "$hosts_status" -eq 0 ] || [ "$hosts_status" -eq 77 ] ||
            { echo "failure_reports: run $run: hosts.sh failed:" >&2; cat "$work/hosts.out" >&2; exit 1; }
    fi
    # per kill: "report resume" seconds, or "missing ..." when a line is not there. The lines of
    # one kill run from the previous resume to the next: ckpt-run may log the death after a
    # survivor logged its failure.
    mapfile -t measured < <(awk '
        / was killed by signal / { killed = $1; next }
        / failed \(dead| failed earlier/ { reports++; last = $1; next }
        /every rank resumes/ {
            if (!killed) next  # the first generation
            if (reports != 3) print "missing " reports " failure lines"
            else printf "%.3f %.3f\n", last - killed, $1 - killed
            killed = 0; reports = 0
        }' "$work/stamped.log")
    [ ${#measured[@]} -eq 4 ] ||
        { echo "failure_reports: run $run: timed ${#measured[@]} kills, planned 4" >&2; cat "$work/stamped.log" >&2; exit 1; }
    run_report=0 run_resume=0
    for m in "${measured[@]}"; do
        read -r report resume <<< "$m"
        [ "$report" != missing ] ||
            { echo "failure_reports: run $run: a kill without three survivors' failure lines and a resume ($m)" >&2
              cat "$work/stamped.log" >&2; exit 1; }
        kills=$((kills + 1))
        run_report=$(awk -v a="$run_report" -v b="$report" 'BEGIN { print (b > a) ? b : a }')
        run_resume=$(awk -v a="$run_resume" -v b="$resume" 'BEGIN { print (b > a) ? b : a }')
        if awk -v r="$report" 'BEGIN { exit !(r > 2) }'; then over=$((over + 1)); fi
    done
    slowest_report=$(awk -v a="$slowest_report" -v b="$run_report" 'BEGIN { print (b > a) ? b : a }')
    slowest_resume=$(awk -v a="$slowest_resume" -v b="$run_resume" 'BEGIN { print (b > a) ? b : a }')
    echo "run $run: slowest survivor's report ${run_report} s, every rank resumed after ${run_resume} s (4 kills)"
done
echo "failure_reports runs=$runs kills=$kills slowest_report_s=$slowest_report slowest_resume_s=$slowest_resume reports_over_2s=$over"
