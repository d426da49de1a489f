#!/usr/bin/env bash
# Builds the documentation site into build/site: docs/ with the README as its home page, and
# the API reference generated from the headers (Doxygen's XML, turned into pages by
# tools/docs/reference.py), by `mkdocs build --strict`: a broken link, a page missing from the
# navigation or a name of the reference that the headers no longer declare fails the build.
#   docs.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh mkdocs mkdocs-material doxygen
out=$(realpath -m "${1:-build}")
mkdir -p "$out"
rm -rf "$out/doxygen" "$out/site"
CKPT_SOURCE_DIR=$PWD CKPT_DOXYGEN_OUT="$out/doxygen" doxygen tools/docs/Doxyfile
/usr/bin/python3 tools/docs/reference.py "$out/doxygen/xml" tools/docs/reference.json "$out/reference"
/usr/bin/python3 tools/docs/stage.py . "$out/docs-src" "$out/reference/nav.json" "$out/mkdocs.yml"
cp -r "$out/reference" "$out/docs-src/reference"
rm "$out/docs-src/reference/nav.json"
/usr/bin/python3 -m mkdocs build --strict --quiet -f "$out/mkdocs.yml"
/usr/bin/python3 tools/docs/check_anchors.py "$out/site"  # what --strict does not check in MkDocs 1.4
echo "site: $out/site/index.html"
