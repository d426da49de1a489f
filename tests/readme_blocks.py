#!/usr/bin/env python3
"""Makes one C++ program of the README's C++ blocks, so that the README and the API cannot
drift apart: a block that no longer compiles, or that fails when run, fails the test suite.

    readme_blocks.py README.md OUT.cpp

Every ```cpp block follows a comment that says how it is tested (a blank line may come
between them; the comment does not show where the README is read as a page):

    <!-- test: run -->              compiled, then run twice in a fresh directory, as a job
                                    that is started again would be
    <!-- test: compile -->          compiled only: it needs ranks, hosts or hours of training
    ... ; before: STATEMENTS        C++ placed before the block: what it uses from outside
    ... ; given: T name; U other;   objects the block uses and never makes (compile blocks):
                                    references to objects of those types

The block goes, but for its #include lines, into a function of its own; nothing else is
added, so what a block leaves out shows up as an error at its line of README.md.
"""
import re
import sys

ANNOTATION = re.compile(r"<!--\s*test:\s*(.*?)\s*-->", re.S)


def blocks(text):
    """(line of the first code line, mode, before, given, code lines) for each C++ block."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```cpp":
            i += 1
            continue
        start = i + 1
        # the annotation: the comment that ends on the last non-blank line before the fence
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        head = "\n".join(lines[max(0, j - 20):j + 1])
        found = list(ANNOTATION.finditer(head))
        if j < 0 or not lines[j].rstrip().endswith("-->") or not found:
            sys.exit(f"README.md:{start}: a C++ block without a '<!-- test: run|compile -->' comment before it")
        fields = [f.strip() for f in found[-1].group(1).split(";", 1)]
        mode = fields[0].split()[0] if fields[0] else ""
        if mode not in ("run", "compile"):
            sys.exit(f"README.md:{start}: the test comment must start with 'run' or 'compile', not '{fields[0]}'")
        before, given = "", []
        rest = fields[1] if len(fields) > 1 else ""
        m_before = re.search(r"before:(.*?)(?:\bgiven:|$)", rest, re.S)
        m_given = re.search(r"given:(.*?)(?:\bbefore:|$)", rest, re.S)
        if m_before:
            before = m_before.group(1).strip()
        if m_given:
            for decl in m_given.group(1).split(";"):
                decl = " ".join(decl.split())
                if decl:
                    typ, name = decl.rsplit(" ", 1)
                    given.append((typ, name))
        end = start
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        out.append((start + 1, mode, before, given, lines[start:end]))
        i = end + 1
    return out


def main():
    readme, target = sys.argv[1], sys.argv[2]
    with open(readme, encoding="utf-8") as f:
        found = blocks(f.read())
    includes = []
    bodies = []
    runs = []
    for n, (line, mode, before, given, code) in enumerate(found, 1):
        body = []
        for text in code:
            if text.startswith("#include"):
                if text not in includes:
                    includes.append(text.split("//")[0].rstrip())
                body.append("")  # keep the line numbers
            else:
                body.append(text)
        name = f"block_{n}"
        head = "inline " if mode == "compile" else ""
        src = [f"// README.md line {line}: {mode}", f"{head}void {name}() {{"]
        for typ, var in given:
            src.append(f"    {typ}& {var} = readme::given<{typ}>();")
        if before:
            src.append(f"    {before}")
        src.append(f'#line {line} "{readme}"')
        src.extend(body)
        src.append("}")
        bodies.append("\n".join(src))
        if mode == "run":
            runs.append((name, line))
    with open(target, "w", encoding="utf-8") as f:
        f.write("// Generated from README.md by tests/readme_blocks.py: every C++ block of the README.\n")
        for inc in includes:
            f.write(inc + "\n")
        f.write(READ_ME_MAIN_HEAD)
        f.write("\n\n".join(bodies) + "\n\n")
        f.write("int main() {\n    int failed = 0, passed = 0;\n")
        for name, line in runs:
            f.write(f'    (readme::run("{name}", {line}, {name}) ? passed : failed) += 1;\n')
        f.write(f'    std::printf("README blocks: {len(found)} compiled, %d run\\n", passed + failed);\n')
        f.write('    std::printf("%d passed, %d failed\\n", passed, failed);\n')
        f.write("    return failed ? 1 : 0;\n}\n")


READ_ME_MAIN_HEAD = r"""
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace readme {

/// The objects a compile-only block is given: declared, never defined, never called.
template <class T>
T& given();

/// Runs a block twice in a fresh scratch directory (a job started again), removed after.
inline bool run(const char* name, int line, void (*block)()) {
    std::string dir = (std::filesystem::temp_directory_path() / "ckpt-readme-XXXXXX").string();
    if (!::mkdtemp(dir.data())) return false;
    const auto home = std::filesystem::current_path();
    std::filesystem::current_path(dir);
    bool ok = true;
    for (int attempt = 1; attempt <= 2 && ok; ++attempt) {
        try {
            block();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "README.md line %d (%s), run %d, threw: %s\n", line, name, attempt, e.what());
            ok = false;
        }
    }
    std::filesystem::current_path(home);
    std::filesystem::remove_all(dir);
    return ok;
}

}  // namespace readme

"""

if __name__ == "__main__":
    main()
