#!/usr/bin/env bash
# torch_resume's checkpoints and Python's PyTorch, both ways:
#  1. the final checkpoint's model.* entries, exported to safetensors, load into the same
#     network written in Python with load_state_dict(strict=True), which then scores exactly
#     the test accuracy the C++ run printed;
#  2. a state_dict saved in Python with torch.save, imported with `ckpt import`, starts a C++
#     run that scores what Python scored for it, and training goes on from it;
#  3. the whole training state: a run stopped after its first epoch is loaded into the Python
#     network, Adam and generator (ckpt.torch.load_training_state) and written again from them
#     (save_training_state); with the C++ files set aside, the C++ run resumed from the Python
#     file ends with the parameters of the run that never stopped (1.), bit for bit.
#   python_round_trip.sh <torch_resume> <ckpt tool> <work dir>   (PYTHONPATH must reach python/)
set -euo pipefail
program=$1
tool=$2
work=$3
here=$(cd "$(dirname "$0")" && pwd)
data=/usr/share/datasets/fashion-mnist
python=/usr/bin/python3  # Debian's, with python3-torch and python3-numpy
rm -rf "$work"
mkdir -p "$work"
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
options=(--data "$data" --epochs 2 --limit 640 --test-limit 320 --quiet)

trained=$("$program" --dir "$work/ckpt" "${options[@]}") || fail "torch_resume failed"
score=$(grep -o 'final test accuracy: [0-9.]* ([0-9]*/[0-9]*)' <<< "$trained") || fail "no final accuracy: $trained"
counts=${score##*(}
counts=${counts%)}
last=$(grep '^saved at epoch' <<< "$trained" | tail -n 1)
last=${last##*: }
"$tool" export "$work/ckpt/$last" "$work/weights.safetensors" --select '^model\.' --rename model.= > /dev/null
python_score=$("$python" "$here/torch_net.py" evaluate "$work/weights.safetensors" "$data" 320)
echo "C++ after training: $counts correct; Python with its exported weights: $python_score"
[ "$python_score" = "correct=${counts%/*} total=${counts#*/}" ] || fail "Python scores otherwise than C++"

python_init=$("$python" "$here/torch_net.py" init "$work/init.pt" "$data" 320 5)
"$tool" import "$work/init.pt" "$work/init.ckpt" --rename =model. > /dev/null
resumed=$("$program" --dir "$work/from_python" --init "$work/init.ckpt" "${options[@]}") || fail "torch_resume --init failed"
init=$(grep -o '^initialized from .*: test accuracy [0-9.]* ([0-9]*/[0-9]*)' <<< "$resumed") ||
    fail "torch_resume did not start from the imported weights: $resumed"
init_counts=${init##*(}
init_counts=${init_counts%)}
echo "Python's torch.save state_dict: $python_init; imported into C++: $init_counts correct"
[ "$python_init" = "correct=${init_counts%/*} total=${init_counts#*/}" ] || fail "C++ scores the imported weights otherwise than Python"
after=$(grep -o 'final test accuracy: [0-9.]* ([0-9]*/[0-9]*)' <<< "$resumed") || fail "no final accuracy: $resumed"
after=${after##*(}
echo "after 2 epochs from them: ${after%)} correct"
[ "${after%%/*}" -gt "${init_counts%/*}" ] || fail "training from the imported weights did not improve them"

hash=$(grep -o 'final_params_xxh64=[0-9a-f]*' <<< "$trained") || fail "no final hash: $trained"
"$program" --dir "$work/stopped" --data "$data" --epochs 1 --limit 640 --test-limit 320 --quiet > /dev/null || fail "torch_resume --epochs 1 failed"
newest=$("$python" -c 'import ckpt, sys; print(ckpt.latest(sys.argv[1], "torch"))' "$work/stopped")
[ "$newest" != None ] || fail "no checkpoint after the first epoch"
mv "$work/stopped" "$work/stopped.cpp"
mkdir "$work/stopped"
"$python" "$here/torch_net.py" resave "$work/stopped.cpp/${newest##*/}" "$newest"
cmp -s "$work/stopped.cpp/${newest##*/}" "$newest" && fail "the Python file is the C++ file's copy"
resumed=$("$program" --dir "$work/stopped" "${options[@]}") || fail "torch_resume from the Python file failed"
grep -q "^resuming from $newest" <<< "$resumed" || fail "torch_resume did not resume from the Python file: $resumed"
resumed_hash=$(grep -o 'final_params_xxh64=[0-9a-f]*' <<< "$resumed")
echo "resumed from the Python-written training state: $resumed_hash; never stopped: $hash"
[ "$resumed_hash" = "$hash" ] || fail "the run resumed from the Python file ends otherwise than the one that never stopped"
echo "OK"
