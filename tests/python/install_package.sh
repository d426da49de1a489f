#!/usr/bin/env bash
# The README's Python section, as a newcomer follows it: a virtual environment that sees
# Debian's packages, the package installed from the checkout offline, the README's example
# run (twice, as a job started again would be) from another directory with the installed
# package, and `python -m ckpt` on what it wrote.
#   install_package.sh SOURCE_DIR WORK_DIR
set -euo pipefail
source_dir=$1
work=$2
rm -rf "$work"
mkdir -p "$work/run"
# pip builds in the directory it is given: a copy keeps build files out of the checkout
cp -r "$source_dir/python" "$work/src"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --quiet --no-build-isolation --no-index "$work/src"
py="$work/venv/bin/python"
cd "$work/run"
"$py" -c 'import ckpt, sys; assert ckpt.__file__.startswith(sys.prefix), ckpt.__file__'
/usr/bin/python3 - "$source_dir/README.md" > example.py <<'PY'
import re, sys
text = open(sys.argv[1]).read()
blocks = re.findall(r"<!-- test: python -->\s*```python\n(.*?)```", text, re.S)
if len(blocks) != 1:
    sys.exit("README.md: expected one ```python block marked <!-- test: python -->, found %d" % len(blocks))
print(blocks[0])
PY
expected=("None [1. 1. 1.]" "./exp-1.ckpt [2. 2. 2.]")
for run in 0 1; do
    out=$("$py" example.py)
    echo "run $((run + 1)): $out"
    [ "$out" = "${expected[$run]}" ] || { echo "expected '${expected[$run]}' from the README's example" >&2; exit 1; }
done
"$py" -m ckpt verify exp-1.ckpt exp-2.ckpt
"$py" -m ckpt ls . | grep -q 'exp-2.ckpt .* ok  <- latest'
# the console script pip installs, as the README names it
"$work/venv/bin/ckpt-py" ls . | grep -q 'exp-2.ckpt .* ok  <- latest'
echo "installed and used: ok"
