#!/usr/bin/env python3
"""Stages the documentation site's sources for MkDocs.

    stage.py SOURCE_DIR STAGE_DIR REFERENCE_NAV OUT_MKDOCS_YML

Copies docs/ into STAGE_DIR with the README as the home page (index.md) and CHANGES.md as
changes.md, and rewrites links between them: the pages link to ../README.md and the README to
docs/..., so that they read on their own too. Writes a copy of mkdocs.yml whose docs_dir is
STAGE_DIR and whose Reference entry lists the generated reference pages (REFERENCE_NAV, a JSON
list of {title: path} under reference/).
"""
import json
import os
import re
import shutil
import sys

import yaml

LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def rewrite(text, page_dir, staged_dir, source, moves):
    """Rewrites each relative link of a page read from page_dir and staged as if in staged_dir
    (both under source), so that it reaches its target's staged place (moves, or itself)."""
    def one(m):
        target = m.group(2)
        if re.match(r"[a-z]+:", target):
            return m.group(0)
        rel = os.path.relpath(os.path.normpath(os.path.join(page_dir, target)), source)
        staged = moves.get(rel, rel)
        return m.group(1) + os.path.relpath(os.path.join(source, staged), staged_dir) + (m.group(3) or "") + m.group(4)
    return LINK.sub(one, text)


def main():
    source, stage, nav_file, out_yml = (os.path.abspath(a) for a in sys.argv[1:5])
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(os.path.join(source, "docs"), stage)
    # what the pages call ../README.md and ../CHANGES.md, in the staged tree
    moves = {"README.md": "docs/index.md", "CHANGES.md": "docs/changes.md"}
    for root, _, files in os.walk(stage):
        for name in files:
            if name.endswith(".md"):
                path = os.path.join(root, name)
                page_dir = os.path.normpath(os.path.join(source, "docs", os.path.relpath(root, stage)))
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                with open(path, "w", encoding="utf-8") as f:
                    f.write(rewrite(text, page_dir, page_dir, source, moves))
    for src, dst in (("README.md", "index.md"), ("CHANGES.md", "changes.md")):
        with open(os.path.join(source, src), encoding="utf-8") as f:
            text = f.read()
        with open(os.path.join(stage, dst), "w", encoding="utf-8") as f:
            f.write(rewrite(text, source, os.path.join(source, os.path.dirname(moves[src])), source, moves))

    with open(os.path.join(source, "mkdocs.yml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    with open(nav_file, encoding="utf-8") as f:
        reference = json.load(f)
    config["docs_dir"] = stage
    config["site_dir"] = os.path.join(os.path.dirname(out_yml), "site")
    for i, entry in enumerate(config["nav"]):
        if "Reference" in entry:
            config["nav"][i] = {"Reference": reference}
    with open(out_yml, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, sort_keys=False, allow_unicode=True)


if __name__ == "__main__":
    main()
