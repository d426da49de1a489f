#!/usr/bin/env python3
"""Fails when a link of the built site points at an anchor its page does not have.

    check_anchors.py SITE_DIR

MkDocs 1.4's --strict checks that a linked page exists, not the part of it a link names
(`page.md#heading`): a heading renamed leaves such links pointing at the top of the page.
"""
import html
import os
import re
import sys


def main():
    root = sys.argv[1]
    ids = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".html"):
                path = os.path.join(d, f)
                with open(path, encoding="utf-8") as page:
                    ids[path] = set(re.findall(r'id="([^"]+)"', page.read()))
    broken = []
    for path in sorted(ids):
        with open(path, encoding="utf-8") as page:
            text = page.read()
        for href in re.findall(r'href="([^"]+)"', text):
            if re.match(r"[a-z]+:", href) or "#" not in href or href.endswith("#"):
                continue
            target, fragment = href.split("#", 1)
            file = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
            if os.path.isdir(file):
                file = os.path.join(file, "index.html")
            if file in ids and html.unescape(fragment) not in ids[file]:
                broken.append(f"{os.path.relpath(path, root)}: '{href}' names no heading of its page")
    for b in broken:
        print(b, file=sys.stderr)
    if broken:
        sys.exit(f"check_anchors.py: {len(broken)} link(s) to a missing anchor")
    print(f"check_anchors.py: every anchor linked in {len(ids)} pages is there")


if __name__ == "__main__":
    main()
