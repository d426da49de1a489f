#!/usr/bin/python3
"""Writes the API Reference pages of the documentation site from Doxygen's XML.

    reference.py XML_DIR REFERENCE_JSON OUT_DIR [--nav-file FILE] [--print-nav]
                 [--names-file FILE] [--docs-dir DIR]

XML_DIR is Doxygen's XML output for tools/docs/Doxyfile; REFERENCE_JSON the curated list
of public names (tools/docs/reference.json); OUT_DIR the directory of the generated pages
(build/reference, copied into the site's docs directory as reference/). Writes one markdown
page per group of the list, OUT_DIR/index.md listing every page and name, and OUT_DIR/nav.json
(or --nav-file; --print-nav prints it too): the nav entries of the "Reference" section of
mkdocs.yml, a JSON list of {title: path}, each path under OUT_DIR's name ("reference/saving.md").
--names-file writes a map from each qualified name to its page and anchor
("reference/saving.md#ckptsave_checkpoint"), for links from the guides.

An entry may name guide sections as examples ("example": "guides/long-jobs.md#anchor", or a
list; "example_title" overrides the heading's text): each must exist in the docs directory
(--docs-dir, by default the repository's docs/), its anchor a heading of the page, and is linked
as "Example: [heading](../guides/long-jobs.md#anchor)". The site must then have the guides at
the same place relative to the reference pages (docs_dir/guides, docs_dir/reference).

Every name of the list must be one Doxygen found, declared in the header the list names:
any that is not fails the run, naming each, so that the reference cannot drift from the
headers. Signatures are written in ```text fences (they are not programs: the site's cpp
blocks are compiled by the tests). Python's standard library only.
"""

import argparse
import json
import os
import re
import sys
import unicodedata
import xml.etree.ElementTree as ET

# ---------------------------------------------------------------------------------------------
# Reading Doxygen's XML


class Registry:
    """Every compound and member of the XML, by qualified name and by id."""

    def __init__(self, xml_dir):
        index_file = os.path.join(xml_dir, "index.xml")
        if not os.path.isfile(index_file):
            raise SystemExit(f"reference.py: no Doxygen XML in '{xml_dir}' (index.xml is missing)")
        self.compounds = {}  # qualified name -> compounddef
        self.members = {}  # qualified name -> [memberdef] (overloads), from namespaces and classes
        self.member_owner = {}  # memberdef id -> compounddef that holds it
        self.by_id = {}  # id -> element (compounddef or memberdef)
        index = ET.parse(index_file).getroot()
        for c in index.findall("compound"):
            if c.get("kind") in ("file", "dir", "page", "example"):
                continue
            path = os.path.join(xml_dir, c.get("refid") + ".xml")
            if not os.path.isfile(path):
                continue
            for cd in ET.parse(path).getroot().findall("compounddef"):
                self._add_compound(cd)

    def _add_compound(self, cd):
        name = cd.findtext("compoundname")
        kind = cd.get("kind")
        self.by_id[cd.get("id")] = cd
        if kind != "namespace":
            self.compounds[name] = cd
        for sd in cd.findall("sectiondef"):
            for md in sd.findall("memberdef"):
                qname = name + "::" + md.findtext("name")
                lst = self.members.setdefault(qname, [])
                if all(m.get("id") != md.get("id") for m in lst):
                    lst.append(md)
                self.member_owner[md.get("id")] = cd
                self.by_id[md.get("id")] = md
                for ev in md.findall("enumvalue"):
                    self.by_id[ev.get("id")] = md


def location(el):
    loc = el.find("location")
    if loc is None:
        return "", 0
    return loc.get("file", ""), int(loc.get("line", "0") or 0)


def text_of(el):
    """The text of an element (refs and all), whitespace collapsed."""
    if el is None:
        return ""
    return " ".join("".join(el.itertext()).split())


# ---------------------------------------------------------------------------------------------
# Signatures


def tidy_type(t):
    """Doxygen's spelling of a type, in the headers' style: `const T& x`, `std::vector<int>`."""
    t = " ".join(t.split())
    t = re.sub(r"<\s+", "<", t)
    t = re.sub(r"\s+>", ">", t)
    t = re.sub(r"\s+([&*]+)", r"\1", t)
    t = re.sub(r"\(\s+", "(", t)
    t = re.sub(r"\s+\)", ")", t)
    return t


def tidy_value(v):
    v = " ".join(v.split())
    v = re.sub(r"(\S)<< ", r"\1 << ", v)  # Doxygen writes `1u << 20` as `1u<< 20`
    return v


def template_line(el):
    tpl = el.find("templateparamlist")
    if tpl is None:
        return None
    params = []
    for p in tpl.findall("param"):
        s = tidy_type(text_of(p.find("type")))
        declname = p.findtext("declname")
        if declname:
            s += " " + declname
        defval = p.find("defval")
        if defval is not None:
            s += " = " + tidy_value(text_of(defval))
        params.append(s)
    one = "template <" + ", ".join(params) + ">"
    if len(one) <= 100:
        return one
    return "template <" + (",\n" + " " * len("template <")).join(params) + ">"


def requires_line(el):
    rc = el.find("requiresclause")
    if rc is None:
        tpl = el.find("templateparamlist")
        rc = tpl.find("requiresclause") if tpl is not None else None
    if rc is None or not text_of(rc):
        return None
    return "    requires " + tidy_value(text_of(rc))


def split_args(argsstring):
    """The part of an argsstring after its parameter list: ` const noexcept`, ` = default`."""
    depth = 0
    for i, ch in enumerate(argsstring):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return argsstring[i + 1:]
    return ""


def function_signature(md, owner_name=None, qualified=None, width=100):
    """The declaration of a function member, in lines."""
    lines = []
    t = template_line(md)
    if t:
        lines.append(t)
    r = requires_line(md)
    if r:
        lines.append(r)
    prefix = []
    if md.get("kind") == "friend":
        prefix.append("friend")
    if md.get("static") == "yes":
        prefix.append("static")
    if md.get("explicit") == "yes":
        prefix.append("explicit")
    if md.get("virt") in ("virtual", "pure-virtual"):
        prefix.append("virtual")
    rtype = tidy_type(text_of(md.find("type")))
    if md.get("constexpr") == "yes" and "constexpr" not in rtype.split():
        prefix.append("constexpr")
    if rtype:
        prefix.append(rtype)
    name = qualified or md.findtext("name")
    params = []
    for p in md.findall("param"):
        s = tidy_type(text_of(p.find("type")))
        declname = p.findtext("declname")
        if declname:
            s += " " + declname
        array = p.findtext("array")
        if array:
            s += array
        defval = p.find("defval")
        if defval is not None:
            s += " = " + tidy_value(text_of(defval))
        params.append(s)
    tail = split_args(md.findtext("argsstring") or "")
    tail = re.sub(r"\s*=\s*(default|delete|0)\s*$", r" = \1", tail)
    tail = " ".join(tail.split())
    tail = " " + tail if tail else ""
    head = (" ".join(prefix) + " " if prefix else "") + name
    one = head + "(" + ", ".join(params) + ")" + tail + ";"
    if len(one) <= width or not params:
        lines.append(one)
    else:
        lines.append(head + "(")
        for i, p in enumerate(params):
            lines.append("    " + p + ("," if i + 1 < len(params) else ")" + tail + ";"))
    return lines


def variable_signature(md, qualified=None):
    parts = []
    if md.get("static") == "yes":
        parts.append("static")
    t = tidy_type(text_of(md.find("type")))
    if md.get("constexpr") == "yes" and "constexpr" not in t.split():
        parts.append("constexpr")
    if t:
        parts.append(t)
    s = " ".join(parts) + " " + (qualified or md.findtext("name")) + (md.findtext("argsstring") or "")
    init = md.find("initializer")
    if init is not None and text_of(init):
        v = tidy_value(text_of(init))
        s += v if v.startswith("{") else " " + v
    lines = []
    t = template_line(md)
    if t:
        lines.append(t)
    lines.append(s + ";")
    return lines


def typedef_signature(md, qualified=None):
    lines = []
    t = template_line(md)
    if t:
        lines.append(t)
    definition = md.findtext("definition") or ""
    target = tidy_type(text_of(md.find("type")))
    if definition.startswith("using") or md.find("templateparamlist") is not None:
        lines.append("using " + (qualified or md.findtext("name")) + " = " + target + ";")
    else:
        lines.append("typedef " + target + " " + (qualified or md.findtext("name")) + ";")
    return lines


def enum_signature(md, qualified=None, indent=""):
    head = "enum class " if md.get("strong") == "yes" else "enum "
    head += qualified or md.findtext("name")
    base = md.find("type")
    if base is not None and text_of(base):
        head += " : " + tidy_type(text_of(base))
    values = []
    for ev in md.findall("enumvalue"):
        v = ev.findtext("name")
        init = ev.find("initializer")
        if init is not None and text_of(init):
            v += " " + tidy_value(text_of(init))
        values.append(v)
    one = indent + head + " { " + ", ".join(values) + " };"
    if len(one) <= 100:
        return [one]
    return [indent + head + " {"] + [indent + "    " + v + "," for v in values] + [indent + "};"]


def member_signature(md, indent="", bases=()):
    kind = md.get("kind")
    name = md.findtext("name")
    if kind == "function" and name in bases and not text_of(md.find("type")):
        # `using Base::Base;`: Doxygen lists the base's constructor under the derived class
        return [indent + f"using {name}::{name};"]
    if kind in ("function", "friend") and md.findtext("argsstring", "").startswith("("):
        lines = function_signature(md, width=100 - len(indent))
    elif kind == "friend":
        lines = ["friend " + tidy_type(text_of(md.find("type"))) + " " + md.findtext("name") + ";"]
    elif kind == "variable":
        lines = variable_signature(md)
    elif kind == "typedef":
        lines = typedef_signature(md)
    elif kind == "enum":
        return enum_signature(md, indent=indent)
    else:
        lines = [tidy_type(text_of(md.find("type"))) + " " + md.findtext("name") + ";"]
    return [indent + line if line else line for line in lines]


def short_name(qualified):
    """A compound's name without its namespace: `ParamDict`, `ParamDict::Entry`."""
    parts = qualified.split("::")
    return "::".join(parts[1:]) if len(parts) > 1 else qualified


# ---------------------------------------------------------------------------------------------
# Doc comments to markdown

MD_ESCAPE = re.compile(r"([\\`*_{}\[\]>])")


def escape(text):
    """Plain text safe in markdown: its emphasis, link, attribute-list and HTML characters
    escaped (`<` as an entity: Python-Markdown takes `<std::string>` for a tag)."""
    return MD_ESCAPE.sub(r"\\\1", text).replace("<", "&lt;")


def code_span(text):
    text = " ".join(text.split())
    if "`" not in text:
        return "`" + text + "`"
    return "`` " + text + " ``"


class Converter:
    """Doxygen's description markup to markdown, refs linked to the pages that document them."""

    def __init__(self, link_of):
        self.link_of = link_of  # id -> "page.md#anchor" or None

    def inline(self, el, in_code=False):
        out = []
        if el.text:
            out.append(el.text if in_code else escape(el.text))
        for child in el:
            out.append(self.inline_child(child, in_code))
            if child.tail:
                out.append(child.tail if in_code else escape(child.tail))
        return "".join(out)

    def inline_child(self, c, in_code):
        tag = c.tag
        if in_code:
            return "".join(c.itertext())
        if tag == "computeroutput":
            code = "".join(c.itertext())
            return code_span(code)
        if tag == "ref":
            label = self.inline(c)
            target = self.link_of(c.get("refid"))
            return f"[{label}]({target})" if target else label
        if tag == "bold":
            return "**" + self.inline(c) + "**"
        if tag in ("emphasis", "italic"):
            return "*" + self.inline(c) + "*"
        if tag == "ulink":
            return f"[{self.inline(c)}]({c.get('url')})"
        if tag == "linebreak":
            return "  \n"
        if tag == "sp":
            return " "
        if tag == "ndash":
            return "–"
        if tag == "mdash":
            return "—"
        if tag == "nonbreakablespace":
            return "\u00a0"
        if tag == "anchor":
            return ""
        # parameterlist, simplesect, lists and code inside a para are blocks: para() takes them
        return self.inline(c)

    def blocks(self, desc):
        """A description as markdown blocks (paragraphs, lists, fences), and its @throws."""
        blocks, throws = [], []
        if desc is None:
            return blocks, throws
        for para in desc.findall("para"):
            self.para(para, blocks, throws)
        for sect in desc.findall("sect1") + desc.findall("sect2") + desc.findall("sect3"):
            title = text_of(sect.find("title"))
            if title:
                blocks.append("**" + escape(title) + "**")
            sub, sub_throws = self.blocks(sect)
            blocks += sub
            throws += sub_throws
        return blocks, throws

    BLOCK_TAGS = {"parameterlist", "simplesect", "itemizedlist", "orderedlist", "programlisting", "verbatim",
                  "preformatted", "table", "xrefsect", "heading"}

    def para(self, para, blocks, throws):
        """A <para>: its text, split where a block element (a list, a code block) sits in it."""
        current = [escape(para.text) if para.text else ""]

        def flush():
            text = "".join(current).strip()
            text = re.sub(r"[ \t]*\n[ \t]*", "\n", text)
            if text:
                text = re.sub(r"^(\s*)([#>+\-=]|\d+\.)", r"\1\\\2", text)
                blocks.append(text)
            current.clear()

        for child in para:
            if child.tag in self.BLOCK_TAGS:
                flush()
                self.block(child, blocks, throws)
                current.append(escape(child.tail.lstrip()) if child.tail else "")
            else:
                current.append(self.inline_child(child, False))
                if child.tail:
                    current.append(escape(child.tail))
        flush()

    def block(self, el, blocks, throws):
        tag = el.tag
        if tag == "parameterlist":
            kind = el.get("kind")
            items = []
            for item in el.findall("parameteritem"):
                names = [text_of(n) for n in item.iter("parametername")]
                desc_blocks, _ = self.blocks(item.find("parameterdescription"))
                items.append((names, " ".join(desc_blocks)))
            if kind == "exception":
                throws.extend(items)
            else:
                label = {"param": "Parameters", "templateparam": "Template parameters", "retval": "Returns"}.get(kind, kind)
                lines = [f"**{label}**", ""]
                for names, desc in items:
                    lines.append("- " + ", ".join(code_span(n.replace("\\", "")) for n in names) + (": " + desc if desc else ""))
                blocks.append("\n".join(lines))
        elif tag == "simplesect":
            kind = el.get("kind")
            sub, sub_throws = self.blocks(el)
            throws += sub_throws
            label = {"return": "Returns", "see": "See", "note": "Note", "warning": "Warning", "pre": "Requires",
                     "post": "Ensures", "since": "Since", "remark": "Remark", "attention": "Attention",
                     "par": text_of(el.find("title"))}.get(kind, kind.capitalize() if kind else "")
            if sub:
                sub[0] = f"**{label}:** " + sub[0] if label else sub[0]
                blocks += sub
        elif tag in ("itemizedlist", "orderedlist"):
            lines = []
            for i, item in enumerate(el.findall("listitem")):
                sub, sub_throws = self.blocks(item)
                throws += sub_throws
                bullet = f"{i + 1}. " if tag == "orderedlist" else "- "
                body = "\n\n".join(sub)
                lines.append(bullet + indent_continuation(body))
            blocks.append("\n".join(lines))
        elif tag == "programlisting":
            code = []
            for line in el.findall("codeline"):
                code.append(self.code_line(line))
            blocks.append("```text\n" + "\n".join(code).rstrip() + "\n```")
        elif tag in ("verbatim", "preformatted"):
            blocks.append("```text\n" + "".join(el.itertext()).strip("\n") + "\n```")
        elif tag == "heading":
            blocks.append("**" + self.inline(el) + "**")
        else:  # tables, xrefsects: their text
            blocks.append(escape(text_of(el)))

    def code_line(self, line):
        out = []

        def walk(e):
            if e.tag == "sp":
                out.append(" ")
            elif e.text:
                out.append(e.text)
            for c in e:
                walk(c)
                if c.tail:
                    out.append(c.tail)

        walk(line)
        return "".join(out)

    def description(self, el):
        """Brief and detailed description of a compound or member: markdown blocks, throws."""
        blocks, throws = self.blocks(el.find("briefdescription"))
        more, more_throws = self.blocks(el.find("detaileddescription"))
        return blocks + more, throws + more_throws


def first_sentence(blocks):
    """A one-line summary: the first sentence of the first paragraph."""
    for b in blocks:
        if b.startswith(("```", "**", "- ", "1. ")):
            continue
        text = " ".join(b.split())
        m = re.search(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)(?<!\bvs)\.(\s|$)", text)
        if m and m.start() < 240:
            return text[:m.start() + 1]
        return text if len(text) <= 240 else text[:240].rsplit(" ", 1)[0] + " …"
    return ""


def slugify(value):
    """Python-Markdown's toc slugify (MkDocs' default): the anchor of a heading."""
    value = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def unique_slug(slug, used):
    while slug in used or not slug:
        m = re.match(r"^(.*)_([0-9]+)$", slug)
        slug = f"{m.group(1)}_{int(m.group(2)) + 1}" if m else slug + "_1"
    used.add(slug)
    return slug


# ---------------------------------------------------------------------------------------------
# The curated list


class ListError(Exception):
    pass


def load_list(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    pages = data.get("pages")
    if not isinstance(pages, list) or not pages:
        raise ListError(f"{path}: no \"pages\"")
    files = set()
    for p in pages:
        for key in ("file", "title"):
            if not isinstance(p.get(key), str) or not p[key]:
                raise ListError(f"{path}: a page without \"{key}\"")
        if p["file"] in files or p["file"] == "index.md" or not p["file"].endswith(".md") or "/" in p["file"]:
            raise ListError(f"{path}: page file '{p['file']}' repeated, reserved or not a plain .md name")
        files.add(p["file"])
        if "sections" in p:
            p["_sections"] = [(s.get("title"), s.get("intro"), s.get("entries", [])) for s in p["sections"]]
        else:
            p["_sections"] = [(None, None, p.get("entries", []))]
        for _, _, entries in p["_sections"]:
            for e in entries:
                if not isinstance(e.get("name"), str) or not e.get("header"):
                    raise ListError(f"{path}: page '{p['file']}': an entry needs \"name\" and \"header\": {e}")
    return data


def target_of(header, data):
    """The CMake target a header needs: the most specific rule of "targets" (a header, or a
    directory ending in '/'), else the core's."""
    targets = data.get("targets", {})
    if header in targets:
        return targets[header]
    best = None
    for prefix, target in targets.items():
        if prefix.endswith("/") and header.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, target)
    return best[1] if best else data.get("core_target", "ckpt::ckpt")


# ---------------------------------------------------------------------------------------------
# Resolving the names


class Item:
    """One name of the list, resolved: a compound, or the members (overloads) of one name."""

    def __init__(self, entry, page, headers):
        self.entry = entry
        self.page = page
        self.name = entry["name"]
        self.title = entry.get("title", self.name)
        self.headers = headers
        self.compound = None
        self.members = []
        self.owner = None  # for a class member: its class
        self.anchor = None


def resolve(reg, entry, page, errors):
    headers = entry["header"] if isinstance(entry["header"], list) else [entry["header"]]
    item = Item(entry, page, headers)
    name = item.name
    cd = reg.compounds.get(name)
    members = reg.members.get(name, [])
    if cd is not None and cd.get("kind") not in ("namespace", "file"):
        file, _ = location(cd)
        if file not in headers:
            errors.append(f"{name}: declared in '{file}', not in {' or '.join(repr(h) for h in headers)} as the list says")
            return None
        item.compound = cd
        return item
    if not members:
        errors.append(f"{name}: not found by Doxygen (in {', '.join(headers)})")
        return None
    chosen = [m for m in members if location(m)[0] in headers]
    if not chosen:
        found = sorted({location(m)[0] for m in members})
        errors.append(f"{name}: declared in {', '.join(found)}, not in {' or '.join(headers)} as the list says")
        return None
    missing = [h for h in headers if all(location(m)[0] != h for m in chosen)]
    if missing:
        errors.append(f"{name}: nothing of that name in {', '.join(missing)}")
        return None
    order = {h: i for i, h in enumerate(headers)}
    chosen.sort(key=lambda m: (order[location(m)[0]], location(m)[1]))
    item.members = chosen
    owner = reg.member_owner.get(chosen[0].get("id"))
    if owner is not None and owner.get("kind") != "namespace":
        item.owner = owner
        if any(m.get("prot") != "public" for m in chosen):
            errors.append(f"{name}: not public")
            return None
    return item


# ---------------------------------------------------------------------------------------------
# Rendering


def fence(lines):
    return "```text\n" + "\n".join(lines).rstrip() + "\n```"


def join_items(rows):
    """List items: tight when each is one line, else loose (a blank line between items, or
    Python-Markdown nests the item after a sub-list into it)."""
    return ("\n\n" if any("\n" in r for r in rows) else "\n").join(rows)


def indent_continuation(text, n=4):
    """`text` as the body of a list item: every line after the first indented by `n`."""
    lines = text.split("\n")
    return "\n".join([lines[0]] + [(" " * n + line) if line.strip() else "" for line in lines[1:]])


class Renderer:
    def __init__(self, reg, data, items, docs_dir, prefix):
        self.reg = reg
        self.data = data
        self.items = items
        self.docs_dir = docs_dir  # where the guides named as examples are
        self.prefix = prefix  # the reference pages' directory under the site's docs directory
        self.links = {}  # element id -> "page.md#anchor"
        for it in items:
            target = f"{it.page['file']}#{it.anchor}"
            if it.compound is not None:
                self.links.setdefault(it.compound.get("id"), target)
                for sd in it.compound.findall("sectiondef"):
                    for md in sd.findall("memberdef"):
                        self.links.setdefault(md.get("id"), target)
            for md in it.members:
                self.links.setdefault(md.get("id"), target)
        self.page_file = None
        self.conv = Converter(self.link_of)
        self.undocumented = []
        self.example_errors = []

    def link_of(self, refid):
        target = self.links.get(refid)
        if not target:
            return None
        page, anchor = target.split("#", 1)
        return ("#" + anchor) if page == self.page_file else target

    def link_name(self, name):
        """A link to the entry of a name written in a doc comment (`IoError`, `ckpt::IoError`)."""
        candidates = [name] + [ns + "::" + name for ns in ("ckpt", "fault", "nn")]
        for c in candidates:
            cd = self.reg.compounds.get(c)
            if cd is not None and cd.get("id") in self.links:
                return self.link_of(cd.get("id"))
            for md in self.reg.members.get(c, []):
                if md.get("id") in self.links:
                    return self.link_of(md.get("id"))
        return None

    # -- pieces

    def include_line(self, item):
        headers = item.headers
        target = None
        parts = []
        for h in headers:
            parts.append(code_span(f"#include <{h}>"))
        targets = sorted({target_of(h, self.data) for h in headers})
        core = self.data.get("core_target", "ckpt::ckpt")
        targets = [t for t in targets if t != core]
        line = "**Header:** " + " · ".join(parts)
        if targets:
            line += " — **CMake target:** " + ", ".join(code_span(t) for t in targets)
        return line

    def throws_block(self, throws):
        if not throws:
            return None
        lines = ["**Throws:**", ""]
        for names, desc in throws:
            rendered = []
            for n in names:
                plain = n.replace("\\", "")
                link = self.link_name(plain)
                rendered.append(f"[{code_span(plain)}]({link})" if link else code_span(plain))
            lines.append("- " + ", ".join(rendered) + (": " + desc if desc else ""))
        return "\n".join(lines)

    def describe(self, el, out, what):
        blocks, throws = self.conv.description(el)
        out += blocks
        t = self.throws_block(throws)
        if t:
            out.append(t)
        return blocks or throws

    def examples(self, item):
        ex = item.entry.get("example")
        if not ex:
            return None
        exs = ex if isinstance(ex, list) else [ex]
        titles = item.entry.get("example_title")
        titles = titles if isinstance(titles, list) else [titles] * len(exs)
        links = []
        docs_dir = self.docs_dir
        for ref, title in zip(exs, titles):
            page, _, anchor = ref.partition("#")
            path = os.path.join(docs_dir, page)
            if not os.path.isfile(path):
                self.example_errors.append(f"{item.name}: example page '{page}' does not exist in '{docs_dir}'")
                continue
            heading = guide_heading(path, anchor)
            if anchor and heading is None:
                self.example_errors.append(f"{item.name}: example '{ref}': no heading of '{page}' has anchor '{anchor}'")
                continue
            label = title or heading or os.path.splitext(os.path.basename(page))[0]
            rel = os.path.relpath(page, self.prefix)  # from the reference pages to the guide
            links.append(f"[{escape(label)}]({rel}{'#' + anchor if anchor else ''})")
        return ("**Example:** " if len(links) == 1 else "**Examples:** ") + ", ".join(links) if links else None

    # -- one name

    def render_item(self, item, level):
        out = [("#" * level) + " " + item.title, ""]
        body = [self.include_line(item)]
        documented = False
        if item.compound is not None:
            documented = self.render_compound(item.compound, body)
        else:
            documented = self.render_members(item, body)
        ex = self.examples(item)
        if ex:
            body.append(ex)
        if not documented:
            self.undocumented.append(item.name)
        return "\n".join(out) + "\n" + "\n\n".join(body) + "\n"

    def render_members(self, item, body):
        """A free function's overloads (or a variable, typedef, enum; or a class's member)."""
        documented = False
        qualify = None
        if item.owner is not None:
            qualify = short_name(item.owner.findtext("compoundname")) + "::" + item.members[0].findtext("name")
        groups = []  # (signature lines, the member whose doc comment starts the group)
        for md in item.members:
            kind = md.get("kind")
            if kind == "function" or kind == "friend":
                sig = function_signature(md, qualified=qualify)
            elif kind == "variable":
                sig = variable_signature(md, qualified=qualify)
            elif kind == "typedef":
                sig = typedef_signature(md, qualified=qualify)
            elif kind == "enum":
                sig = enum_signature(md, qualified=qualify)
            else:
                sig = [tidy_type(text_of(md.find("definition")))]
            has_doc = bool(self.conv.description(md)[0] or self.conv.description(md)[1])
            if has_doc or not groups:
                groups.append(([sig], md))
            else:
                groups[-1][0].append(sig)
        for sigs, md in groups:
            lines = []
            for s in sigs:
                if lines:
                    lines.append("")
                lines += s
            body.append(fence(lines))
            if self.describe(md, body, item.name):
                documented = True
            if md.get("kind") == "enum":
                self.enum_values(md, body)
        return documented

    def enum_values(self, md, body):
        rows = []
        for ev in md.findall("enumvalue"):
            blocks, _ = self.conv.description(ev)
            if blocks:
                rows.append("- " + code_span(ev.findtext("name")) + ": " + indent_continuation("\n\n".join(blocks)))
        if rows:
            body.append(join_items(rows))

    def public_members(self, cd):
        members = []
        for sd in cd.findall("sectiondef"):
            kind = sd.get("kind")
            if not (kind.startswith("public") or kind == "friend"):
                continue
            for md in sd.findall("memberdef"):
                if md.get("prot") != "public":
                    continue
                members.append(md)
        members.sort(key=lambda m: location(m)[1])
        return members

    def render_compound(self, cd, body, nested=False):
        kind = cd.get("kind")
        qname = cd.findtext("compoundname")
        if kind == "concept":
            init = cd.find("initializer")
            text = "".join(init.itertext()).strip() if init is not None else "concept " + qname
            text = re.sub(r"concept\s+" + re.escape(qname) + r"\s*=\s*", "concept " + short_name(qname) + " = ", text)
            lines = [re.sub(r"^template<", "template <", line) for line in text.split("\n")]
            body.append(fence(lines))
            return self.describe(cd, body, qname)
        head = []
        t = template_line(cd)
        if t:
            head.append(t)
        decl = kind + " " + short_name(qname)
        if cd.get("final") == "yes":
            decl += " final"
        namespace = qname.split("::")[0] + "::"
        bases = [(b.get("prot"), b.get("virt"), text_of(b).removeprefix(namespace))
                 for b in cd.findall("basecompoundref")]
        base_names = {n.split("::")[-1].split("<")[0] for _, _, n in bases}
        if bases:
            decl += " : " + ", ".join(
                ((p + " ") if p and not (kind == "struct" and p == "public") else "") +
                ("virtual " if v == "virtual" else "") + tidy_type(n) for p, v, n in bases)
        members = self.public_members(cd)
        nested_classes = [ic for ic in cd.findall("innerclass") if ic.get("prot") == "public"]
        lines = list(head)
        if not members and not nested_classes:
            lines.append(decl + (" { … };" if bases else ";"))
        else:
            lines.append(decl + " {")
            if kind == "class":
                lines.append("public:")
            last_line = None
            for ic in nested_classes:
                inner = self.reg.by_id.get(ic.get("refid"))
                ikind = inner.get("kind") if inner is not None else "struct"
                lines.append(f"    {ikind} {ic.text.split('::')[-1]};  // below")
            if nested_classes and members:
                lines.append("")
            for md in members:
                sig = member_signature(md, indent="    ", bases=base_names)
                multi = len(sig) > 1
                if multi and last_line is not None and last_line != "":
                    lines.append("")
                lines += sig
                if multi:
                    lines.append("")
                last_line = lines[-1]
            while lines and lines[-1] == "":
                lines.pop()
            lines.append("};")
        body.append(fence(lines))
        documented = self.describe(cd, body, qname)
        # the members' doc comments, in declaration order
        rows = []
        seen_names = {}
        for md in members:
            blocks, throws = self.conv.description(md)
            if md.get("kind") == "enum":
                sub = []
                self.enum_values(md, sub)
                if sub:
                    blocks = blocks + sub
            if not blocks and not throws:
                continue
            name = md.findtext("name")
            label = name
            if md.get("kind") in ("function", "friend") and len(self.reg.members.get(qname + "::" + name, [])) > 1:
                seen_names[name] = seen_names.get(name, 0) + 1
                label = name + tidy_type(re.sub(r"\s*=[^,()]*", "", "(" + ", ".join(
                    tidy_type(text_of(p.find("type"))) for p in md.findall("param")) + ")"))
            text = code_span(label) + ": " + ("\n\n".join(blocks) if blocks else "")
            t = self.throws_block(throws)
            if t:
                text += "\n\n" + t
            rows.append("- " + indent_continuation(text))
            documented = True
        if rows:
            body.append("**Members:**")
            body.append(join_items(rows))
        for ic in nested_classes:
            inner = self.reg.by_id.get(ic.get("refid"))
            if inner is None:
                continue
            body.append("**" + escape(short_name(inner.findtext("compoundname"))) + "**")
            self.render_compound(inner, body, nested=True)
        return documented

    # -- pages

    def render_page(self, page):
        self.page_file = page["file"]
        out = ["# " + page["title"], ""]
        if page.get("intro"):
            out += [page["intro"], ""]
        for title, intro, entries in page["_sections"]:
            level = 2
            if title:
                out += ["## " + title, ""]
                if intro:
                    out += [intro, ""]
                level = 3
            for it in entries:
                out.append(self.render_item(it, level))
        return "\n".join(out).rstrip() + "\n"


def guide_heading(path, anchor):
    """The text of the heading of a markdown page whose anchor is `anchor`, or None."""
    used = set()
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith(("```", "~~~")):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            text = m.group(2)
            if not anchor:  # the page itself: its first heading
                return re.sub(r"[`*]", "", text)
            explicit = re.search(r"\{\s*#([\w-]+)[^}]*\}\s*$", text)
            if explicit:
                text = text[:explicit.start()].rstrip()
                slug = explicit.group(1)
            else:
                plain = re.sub(r"[`*]", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text))
                slug = unique_slug(slugify(plain), used)
            if slug == anchor:
                return re.sub(r"[`*]", "", text)
    return None


# ---------------------------------------------------------------------------------------------


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("xml_dir")
    ap.add_argument("reference_json")
    ap.add_argument("out_dir")
    ap.add_argument("--nav-file", help="write the nav entries (JSON) here rather than to OUT_DIR/nav.json")
    ap.add_argument("--docs-dir", help="where the guides that entries name as examples are (default: the "
                                       "repository's docs/, two levels above REFERENCE_JSON's directory)")
    ap.add_argument("--print-nav", action="store_true", help="also print the nav entries")
    ap.add_argument("--names-file", help="write {qualified name: page#anchor} (JSON) to this file")
    args = ap.parse_args(argv)

    try:
        data = load_list(args.reference_json)
    except (ListError, json.JSONDecodeError) as e:
        print(f"reference.py: {e}", file=sys.stderr)
        return 2
    reg = Registry(args.xml_dir)

    errors = []
    items = []
    for page in data["pages"]:
        used = set()
        resolved_sections = []
        for title, intro, entries in page["_sections"]:
            if title:
                unique_slug(slugify(title), used)
            resolved = []
            for entry in entries:
                it = resolve(reg, entry, page, errors)
                if it is None:
                    continue
                slug = slugify(it.title)
                if slug in used:
                    errors.append(f"{it.name}: its heading '{it.title}' repeats an anchor of page "
                                  f"'{page['file']}' (give the entry a \"title\" of its own)")
                    continue
                it.anchor = unique_slug(slug, used)
                resolved.append(it)
                items.append(it)
            resolved_sections.append((title, intro, resolved))
        page["_sections"] = resolved_sections
    if errors:
        print("reference.py: the reference list does not match the headers:", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        return 1

    os.makedirs(args.out_dir, exist_ok=True)
    prefix = os.path.basename(os.path.normpath(args.out_dir))
    docs_dir = args.docs_dir or os.path.join(os.path.dirname(os.path.abspath(args.reference_json)), "..", "..", "docs")
    r = Renderer(reg, data, items, os.path.normpath(docs_dir), prefix)
    nav = [{data.get("index_title", "Overview"): f"{prefix}/index.md"}]
    index = ["# " + data.get("title", "API reference"), ""]
    if data.get("intro"):
        index += [data["intro"], ""]
    names = {}
    pages_out = {}
    for page in data["pages"]:
        pages_out[page["file"]] = r.render_page(page)
        nav.append({page["title"]: f"{prefix}/{page['file']}"})
        r.page_file = "index.md"
        index += [f"## [{escape(page['title'])}]({page['file']})", ""]
        if page.get("summary"):
            index += [page["summary"], ""]
        for title, _, entries in page["_sections"]:
            if title:
                index += [f"**{escape(title)}**", ""]
            rows = []
            for it in entries:
                if it.compound is not None:
                    blocks, _ = r.conv.description(it.compound)
                else:
                    blocks = []
                    for md in it.members:
                        blocks, _ = r.conv.description(md)
                        if blocks:
                            break
                summary = first_sentence(blocks)
                rows.append(f"- [{escape(it.title)}]({page['file']}#{it.anchor})" + (f": {summary}" if summary else ""))
                names.setdefault(it.name, f"{prefix}/{page['file']}#{it.anchor}")
            index += rows + [""]
    if r.example_errors:
        print("reference.py: examples named in the list are not there:", file=sys.stderr)
        for e in r.example_errors:
            print("  " + e, file=sys.stderr)
        return 1
    for file, text in pages_out.items():
        with open(os.path.join(args.out_dir, file), "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(args.out_dir, "index.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(index).rstrip() + "\n")

    nav_text = json.dumps(nav, indent=2, ensure_ascii=False)
    if args.print_nav:
        print(nav_text)
    with open(args.nav_file or os.path.join(args.out_dir, "nav.json"), "w", encoding="utf-8") as f:
        f.write(nav_text + "\n")
    if args.names_file:
        with open(args.names_file, "w", encoding="utf-8") as f:
            json.dump(names, f, indent=2, ensure_ascii=False)
            f.write("\n")
    print(f"reference.py: {len(items)} names on {len(data['pages'])} pages in '{args.out_dir}'", file=sys.stderr)
    if r.undocumented:
        print(f"reference.py: {len(r.undocumented)} names without a doc comment (signatures only): "
              + ", ".join(r.undocumented), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
