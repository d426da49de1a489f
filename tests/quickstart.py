#!/usr/bin/env python3
"""The README's quick start, as a newcomer follows it: the program saved as quickstart.cpp beside
a copy of ckpt, compiled with the README's g++ line against the single header, and with its
CMakeLists.txt against the installed package; each build then run as the README's output shows
(interrupted with Ctrl-C after a second, run again, run once more), its output checked against
the README's.

    quickstart.py SOURCE_DIR INSTALL_PREFIX WORK_DIR

Lines of ckpt's own notices ('[ckpt] ...') may differ from the README's in their numbers (the
step an interrupted run reached, a pid, a time) and the host; the program's lines must match
exactly.
"""
import os
import re
import shutil
import signal
import subprocess
import sys


def block(text, marker, lang):
    found = re.findall(r"<!-- test: " + re.escape(marker) + r" -->\s*```" + lang + r"\n(.*?)```", text, re.S)
    if len(found) != 1:
        sys.exit(f"README.md: expected one ```{lang} block marked <!-- test: {marker} -->, found {len(found)}")
    return found[0]


def runs(output):
    """The README's output block as [(command, [expected lines], interrupted)]."""
    out = []
    for line in output.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            out.append([line[2:].strip(), [], False])
        elif line == "^C":
            out[-1][2] = True
        else:
            out[-1][1].append(line)
    return out


def pattern(expected):
    if not expected.startswith("[ckpt] "):
        return re.escape(expected)
    text = re.sub(r"\d+", r"\\d+", re.escape(expected))
    return re.sub(r"on\\ host\\ \S+?\\ ", r"on\\ host\\ \\S+\\ ", text)


def session(where, program, output, label):
    os.makedirs(where)
    for command, expected, interrupted in runs(output):
        if command != "./quickstart":
            sys.exit(f"README.md quick start: unexpected command '{command}'")
        proc = subprocess.Popen([program], cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            got, _ = proc.communicate(timeout=1.5 if interrupted else 60)
            if interrupted:
                sys.exit(f"{label}: the run the README interrupts after a second ended by itself:\n{got}")
        except subprocess.TimeoutExpired:
            if not interrupted:
                proc.kill()
                sys.exit(f"{label}: '{command}' did not end within 60 s")
            proc.send_signal(signal.SIGINT)
            got, _ = proc.communicate(timeout=10)
        lines = got.rstrip("\n").split("\n") if got.strip() else []
        ok = len(lines) == len(expected) and all(re.fullmatch(pattern(e), g) for e, g in zip(expected, lines))
        if not ok:
            sys.exit(f"{label}: '{command}' printed\n  " + "\n  ".join(lines) +
                     "\nwhere the README shows\n  " + "\n  ".join(expected))
        print(f"{label}: {command}{' (Ctrl-C)' if interrupted else ''}: as the README shows", flush=True)


def main():
    source, prefix, work = sys.argv[1:4]
    with open(os.path.join(source, "README.md"), encoding="utf-8") as f:
        text = f.read()
    program = block(text, "quickstart program", "cpp")
    gxx = block(text, "quickstart g++", "sh").strip()
    cmake = block(text, "quickstart cmake", "cmake")
    output = block(text, "quickstart output", "console")
    shutil.rmtree(work, ignore_errors=True)

    # the single header: the README's g++ line, word for word, beside a copy of ckpt named ckpt/
    single = os.path.join(work, "single")
    os.makedirs(single)
    os.symlink(os.path.abspath(source), os.path.join(single, "ckpt"))
    with open(os.path.join(single, "quickstart.cpp"), "w", encoding="utf-8") as f:
        f.write(program)
    subprocess.run(["bash", "-euc", gxx], cwd=single, check=True)
    session(os.path.join(single, "run"), os.path.join(single, "quickstart"), output, "g++ and the single header")

    # the installed package: the README's CMakeLists.txt
    package = os.path.join(work, "cmake")
    os.makedirs(package)
    with open(os.path.join(package, "quickstart.cpp"), "w", encoding="utf-8") as f:
        f.write(program)
    with open(os.path.join(package, "CMakeLists.txt"), "w", encoding="utf-8") as f:
        f.write(cmake)
    env = dict(os.environ, CMAKE_PREFIX_PATH=os.path.abspath(prefix))
    subprocess.run(["cmake", "-S", ".", "-B", "build"], cwd=package, env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", "build"], cwd=package, env=env, check=True, stdout=subprocess.DEVNULL)
    session(os.path.join(package, "run"), os.path.join(package, "build", "quickstart"), output, "CMake and find_package")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
