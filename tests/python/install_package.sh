#!/usr/bin/env bash
# The README's Python lines, as a newcomer follows them: a virtual environment that sees
# Debian's packages, the package installed from the checkout offline, the README's example
# run (twice, as a job started again would be) from another directory with the installed
# package, and `python -m ckpt` on what it wrote. Then every Python block of the
# documentation pages marked <!-- test: python -->, run twice in a directory of its own; one
# marked <!-- test: python; output: TEXT --> must print TEXT each time.
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
# the console script pip installs, as Getting started names it
"$work/venv/bin/ckpt-py" ls . | grep -q 'exp-2.ckpt .* ok  <- latest'
echo "installed and used: ok"

/usr/bin/python3 - "$source_dir" "$work/pages" "$py" <<'PY'
import glob, os, re, subprocess, sys
source, work, py = sys.argv[1:4]
found = 0
for page in sorted(glob.glob(os.path.join(source, "docs", "**", "*.md"), recursive=True)):
    text = open(page, encoding="utf-8").read()
    name = os.path.relpath(page, source)
    for i, m in enumerate(re.finditer(r"```python\n(.*?)```", text, re.S)):
        line = text.count("\n", 0, m.start()) + 1
        head = text[:m.start()].rstrip()
        mark = re.search(r"<!--\s*test:\s*python\s*(?:;\s*output:\s*(.*?))?\s*-->$", head, re.S)
        if not mark:
            sys.exit(f"{name}:{line}: a Python block without a '<!-- test: python -->' comment before it")
        where = os.path.join(work, f"{os.path.basename(page)}-{line}")
        os.makedirs(where)
        for run in (1, 2):
            r = subprocess.run([py, "-c", m.group(1)], cwd=where, capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                sys.exit(f"{name}:{line}: run {run} failed:\n{r.stderr}")
            if mark.group(1) is not None and r.stdout.strip() != mark.group(1).strip():
                sys.exit(f"{name}:{line}: run {run} printed '{r.stdout.strip()}', the page says '{mark.group(1).strip()}'")
        found += 1
if found == 0:
    sys.exit("no Python block found in docs/")
print(f"documentation's Python blocks: {found} run twice each: ok")
PY
