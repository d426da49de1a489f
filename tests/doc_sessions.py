#!/usr/bin/python3
"""Runs the console sessions of markdown pages and checks that their output is what the page shows.

    doc_sessions.py [--path DIR]... [--env NAME=VALUE]... [--timeout S] [--keep] PAGE.md...

A session block is a fenced block of language `console` preceded by the HTML comment
`<!-- test: session -->` (blank lines may stand between them; anything else between them is an
error, so that a marker never silently guards nothing):

    <!-- test: session -->
    ```console
    $ ckpt verify lenet
    ok     lenet/lenet-1_100.ckpt (epoch 1, step 100, 484.2 KiB)
    1 verified, 0 failed
    $ ckpt verify nothing.ckpt  # exit 1
    FAILED nothing.ckpt: cannot open checkpoint 'nothing.ckpt': No such file or directory
    0 verified, 1 failed
    ```

- A line starting with `$ ` is a command, run with `bash -o pipefail -c`. Lines right after it
  that start with `> ` (a shell's continuation prompt) continue it, joined with line breaks: a
  here-document or a long command spread over lines.
- The lines after a command, up to the next command or the end of the block, are its expected
  output: stdout and stderr merged, as a terminal shows them.
- Matching is line by line, trailing spaces and trailing blank lines ignored. A line that is just
  `...` matches any number of lines, none included; `[...]` inside a line matches any text within
  that line (times, pids, host names, sizes that vary).
- A command must exit 0, unless its (last) line ends with the comment `# exit N`: then it must
  exit N. A command killed by signal S counts as 128 + S, as a shell reports it.

All the session blocks of one page run in order in one scratch directory (under $TMPDIR, removed
at the end unless --keep), so a page can make files in its first block and look at them later.
Each command starts there (a `cd` does not carry over) with stdin from /dev/null, HOME and TMPDIR
in the scratch directory too, a PATH of the --path directories and then the system's alone
(/usr/sbin:/usr/bin:/sbin:/bin: `python3` is the system's), and a fixed locale, time zone and
terminal (no colours); the variables a launcher sets (RANK, WORLD_SIZE, CKPT_*, SLURM_*, ...) are
dropped, and --env sets more. OpenBLAS is pinned to one thread and one kernel, so that numbers a
page shows do not depend on the CPU the test runs on. Each command runs in a process group of
its own, which is killed when the command ends: nothing it started outlives it. A command that
takes longer than --timeout seconds (120 by default) is killed and fails the page.

Every page given must hold at least one session block. A page stops at its first failure (the
commands after it usually depend on it); the other pages still run. On a failure the page, the
line of the command, the command and a unified diff of the expected and actual output are
printed. Exit status: 0 when every command of every page matched, 1 otherwise, 2 for a usage
error.
"""

import argparse
import difflib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MARKER = re.compile(r"^\s*<!--\s*test:\s*session\s*-->\s*$")
FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*?)\s*$")
EXIT_COMMENT = re.compile(r"\s#\s*exit\s+(?P<status>\d+)\s*$")
WILDCARD_LINE = "..."
WILDCARD_TEXT = "[...]"

# Variables a launcher or a CI may have set that would change what the tools and examples do.
DROPPED_PREFIXES = ("CKPT_", "MS_", "SLURM_", "OMPI_", "PMI_", "PMIX_")
DROPPED_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CDPATH",
                 "BASH_ENV", "ENV", "GREP_OPTIONS", "GREP_COLORS", "LS_COLORS", "CLICOLOR_FORCE", "FORCE_COLOR"}
# The commands find the --path directories' programs and the system's, never a user's (a pyenv
# shim's python3 without NumPy, a ~/.local/bin tool of another version).
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
FIXED_ENV = {
    "LC_ALL": "C.UTF-8",
    "LANG": "C.UTF-8",
    "TZ": "UTC",
    "TERM": "dumb",
    "NO_COLOR": "1",
    "COLUMNS": "100",
    # the same numbers on every CPU: OpenBLAS picks its kernels by CPU, and each rounds its own way
    "OPENBLAS_CORETYPE": "Haswell",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


class PageError(Exception):
    """A page that cannot be run as written (no session block, a marker guarding nothing, ...)."""


class Command:
    def __init__(self, page, line):
        self.page = page
        self.line = line  # 1-based line of the `$ ` line in the page
        self.text = ""
        self.expected = []
        self.status = 0

    def shown(self):
        return "\n> ".join(self.text.split("\n"))


def parse_page(path):
    """The commands of the page's session blocks, in order."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    commands = []
    blocks = 0
    pending = None  # line of a marker waiting for its block
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE_OPEN.match(line)
        if m:
            fence, info, indent = m.group("fence"), m.group("info"), len(m.group("indent"))
            language = info.split()[0] if info else ""
            body = []
            j = i + 1
            close = re.compile(r"^[ \t]*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
            while j < len(lines) and not close.match(lines[j]):
                body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j].lstrip())
                j += 1
            if j == len(lines):
                raise PageError(f"{path}:{i + 1}: a code block that is never closed")
            if pending is not None:
                if language != "console":
                    raise PageError(f"{path}:{pending}: '<!-- test: session -->' must be followed by a ```console "
                                    f"block, not a block of language '{language}' (line {i + 1})")
                found = parse_block(path, i + 2, body)
                if not found:
                    raise PageError(f"{path}:{i + 1}: a session block without a command ('$ ...')")
                commands += found
                blocks += 1
                pending = None
            i = j + 1
            continue
        if MARKER.match(line):
            if pending is not None:
                raise PageError(f"{path}:{pending}: '<!-- test: session -->' is not followed by a ```console block")
            pending = i + 1
        elif line.strip() and pending is not None:
            raise PageError(f"{path}:{pending}: '<!-- test: session -->' must be followed by a ```console block "
                            f"(line {i + 1} stands between them)")
        i += 1
    if pending is not None:
        raise PageError(f"{path}:{pending}: '<!-- test: session -->' is not followed by a ```console block")
    if blocks == 0:
        raise PageError(f"{path}: no session block ('<!-- test: session -->' before a ```console block): "
                        "nothing to check")
    return commands


def parse_block(path, first_line, body):
    commands = []
    continuing = False
    for offset, line in enumerate(body):
        number = first_line + offset
        if line.startswith("$ ") or line.rstrip() == "$":
            commands.append(Command(path, number))
            commands[-1].text = line[2:]
            continuing = True
        elif continuing and (line.startswith("> ") or line.rstrip() == ">"):
            commands[-1].text += "\n" + line[2:]
        elif not commands:
            raise PageError(f"{path}:{number}: output before the first command of a session block")
        else:
            continuing = False
            if "\x1b" in line:
                raise PageError(f"{path}:{number}: an escape character (ANSI code) in the expected output")
            commands[-1].expected.append(line)
    for c in commands:
        if not c.text.strip():
            raise PageError(f"{path}:{c.line}: an empty command")
        m = EXIT_COMMENT.search(c.text.split("\n")[-1])
        if m:
            c.status = int(m.group("status"))
    return commands


def trimmed(lines):
    out = [line.rstrip() for line in lines]
    while out and not out[-1]:
        out.pop()
    return out


def line_matches(expected, actual):
    if WILDCARD_TEXT not in expected:
        return expected == actual
    pattern = ".*".join(re.escape(part) for part in expected.split(WILDCARD_TEXT))
    return re.fullmatch(pattern, actual, re.DOTALL) is not None


def output_matches(expected, actual):
    """Whether the actual lines match the expected ones, `...` lines matching any run of lines."""
    n, m = len(expected), len(actual)
    # can[i][j]: expected[i:] matches actual[j:]
    can = [[False] * (m + 1) for _ in range(n + 1)]
    can[n][m] = True
    for i in range(n - 1, -1, -1):
        wildcard = expected[i].strip() == WILDCARD_LINE
        for j in range(m, -1, -1):
            if wildcard:
                can[i][j] = can[i + 1][j] or (j < m and can[i][j + 1])
            else:
                can[i][j] = j < m and can[i + 1][j + 1] and line_matches(expected[i], actual[j])
    return can[0][0]


def shown_expected(expected, actual):
    """The expected lines as the diff shows them: a line with `[...]` that matches its actual line,
    and a run of `...` lines that matches the lines where it stands, replaced by those actual
    lines, so that the diff shows only what really differs. Lines are paired by a longest common
    subsequence under line_matches()."""
    n, m = len(expected), len(actual)
    wildcard = [e.strip() == WILDCARD_LINE for e in expected]
    lcs = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            if not wildcard[i] and line_matches(expected[i], actual[j]):
                lcs[i][j] = lcs[i + 1][j + 1] + 1
            else:
                lcs[i][j] = max(lcs[i + 1][j], lcs[i][j + 1])
    pairs = []
    i = j = 0
    while i < n and j < m:
        if not wildcard[i] and line_matches(expected[i], actual[j]) and lcs[i][j] == lcs[i + 1][j + 1] + 1:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif lcs[i + 1][j] >= lcs[i][j + 1]:
            i += 1
        else:
            j += 1
    out = []
    i0 = j0 = 0
    for i1, j1 in pairs + [(n, m)]:
        gap = expected[i0:i1]
        out += actual[j0:j1] if gap and all(wildcard[i0:i1]) else gap
        if i1 < n:
            out.append(actual[j1])
        i0, j0 = i1 + 1, j1 + 1
    return out


def printable(text):
    return "".join(c if c == "\n" or c == "\t" or c.isprintable() else repr(c)[1:-1] for c in text)


def environment(scratch, paths, extra):
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_NAMES and not k.startswith(DROPPED_PREFIXES)}
    env.update(FIXED_ENV)
    env["HOME"] = os.path.join(scratch, "home")
    env["TMPDIR"] = os.path.join(scratch, "tmp")
    env["PATH"] = os.pathsep.join(paths + [SYSTEM_PATH])
    env.update(extra)
    return env


def kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(command, cwd, env, timeout):
    """(status, output, seconds); status None when the command timed out."""
    started = time.monotonic()
    proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", command.text], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        status = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, _ = proc.communicate()
        status = None
    finally:
        kill_group(proc.pid)  # what it left running in the background
    return status, out.decode("utf-8", errors="backslashreplace"), time.monotonic() - started


def check_page(page, paths, extra_env, timeout, keep):
    """Runs one page's commands; returns (commands checked, failed)."""
    commands = parse_page(page)
    scratch = tempfile.mkdtemp(prefix="doc-sessions-")
    work = os.path.join(scratch, "work")
    for d in (work, os.path.join(scratch, "home"), os.path.join(scratch, "tmp")):
        os.mkdir(d)
    env = environment(scratch, paths, extra_env)
    checked = 0
    try:
        for c in commands:
            status, out, seconds = run(c, work, env, timeout)
            checked += 1
            expected, actual = trimmed(c.expected), trimmed(out.split("\n"))
            problems = []
            if status is None:
                problems.append(f"timed out after {timeout:g} s (--timeout); killed it")
            elif status != c.status:
                problems.append(f"exit status {status}, expected {c.status}"
                                + ("" if c.status else " (a command expected to fail ends with '# exit N')"))
            same = output_matches(expected, actual)
            if not same:
                problems.append("the output differs from the page (in the diff, what '...' lines and '[...]' "
                                "match is shown as the actual text)")
            if problems:
                print(f"FAILED {page}:{c.line}: $ {c.shown()}", file=sys.stderr)
                for p in problems:
                    print(f"  {p}", file=sys.stderr)
                if not same:
                    diff = difflib.unified_diff(shown_expected(expected, actual), actual,
                                                f"expected ({page}:{c.line + 1})", "actual", lineterm="", n=3)
                    print(printable("\n".join(diff)), file=sys.stderr)
                elif status is not None and status != c.status and actual:
                    print("  its output (as expected):", file=sys.stderr)
                    print(printable("\n".join("    " + line for line in actual)), file=sys.stderr)
                if len(commands) > checked:
                    print(f"  {len(commands) - checked} later command(s) of {page} not run", file=sys.stderr)
                return checked, 1
    finally:
        if keep:
            print(f"{page}: scratch directory kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return checked, 0


def main():
    parser = argparse.ArgumentParser(description="Run the console sessions of markdown pages and check their output.",
                                     epilog="The module's docstring (head of this file) has the format.")
    parser.add_argument("pages", nargs="+", metavar="PAGE.md")
    parser.add_argument("--path", action="append", default=[], metavar="DIR",
                        help="a directory put before PATH for the commands (repeatable)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable set for the commands (repeatable)")
    parser.add_argument("--timeout", type=float, default=120, metavar="S", help="seconds a command may take (120)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directories and print where they are")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # in order with the failures on stderr

    paths = []
    for d in args.path:
        d = os.path.abspath(d)
        if not os.path.isdir(d):
            parser.error(f"--path {d}: not a directory")
        if d not in paths:
            paths.append(d)
    extra = {}
    for e in args.env:
        name, eq, value = e.partition("=")
        if not eq or not name:
            parser.error(f"--env '{e}' is not NAME=VALUE")
        extra[name] = value
    if args.timeout <= 0:
        parser.error("--timeout must be positive")

    total = failed = errors = 0
    started = time.monotonic()
    for page in args.pages:
        page_started = time.monotonic()
        try:
            checked, bad = check_page(page, paths, extra, args.timeout, args.keep)
        except (PageError, OSError, UnicodeDecodeError) as e:
            print(f"FAILED {e}", file=sys.stderr)
            errors += 1
            continue
        total += checked
        failed += bad
        print(f"{page}: {checked} command{'s' if checked != 1 else ''} checked in "
              f"{time.monotonic() - page_started:.1f} s{', FAILED' if bad else ''}")
    print(f"doc_sessions: {total} command{'s' if total != 1 else ''} in {len(args.pages)} page{'s' if len(args.pages) != 1 else ''} checked "
          f"in {time.monotonic() - started:.1f} s: {total - failed} passed, {failed + errors} failed")
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
