"""The names ckpt gives checkpoints (MindSporeNaming, StepNaming, runs, exception saves), read
back: which prefix, run and position a file name says. Nothing here touches a file."""

from dataclasses import dataclass

TEMP_MARKER = ".tmp-"


@dataclass
class Name:
    run_prefix: str
    run: int
    epoch: int
    step: int
    global_step: int      # -1 unless the name carries it (StepNaming)
    breakpoint: bool
    epoch_in_name: bool


def count(s):
    if not s or len(s) > 18 or not s.isascii() or not s.isdigit():
        return None
    return int(s)


def parse(base, name):
    """MindSporeNaming's "{base}[_{run}]-{epoch}_{step}.ckpt", else StepNaming's
    "{base}[_{run}]-{global_step}.ckpt" ("_breakpoint.ckpt" for exception saves)."""
    if not name.startswith(base):
        return None
    rest = name[len(base):]
    if rest.startswith("-"):
        run, rest = 0, rest[1:]
    elif rest.startswith("_"):
        dash = rest.find("-")
        run = count(rest[1:dash]) if dash > 0 else None
        if not run:
            return None
        rest = rest[dash + 1:]
    else:
        return None
    breakpoint = rest.endswith("_breakpoint.ckpt")
    if breakpoint:
        rest = rest[:-len("_breakpoint.ckpt")]
    elif rest.endswith(".ckpt"):
        rest = rest[:-len(".ckpt")]
    else:
        return None
    run_prefix = base if run == 0 else "%s_%d" % (base, run)
    epoch, _, step = rest.partition("_")
    if _ and count(epoch) is not None and count(step) is not None:
        return Name(run_prefix, run, count(epoch), count(step), -1, breakpoint, True)
    if count(rest) is not None:
        return Name(run_prefix, run, 1, count(rest), count(rest), breakpoint, False)
    return None


def guess(name):
    """(prefix, Name) of a file name read without knowing its prefix, as `ckpt ls` reads a
    directory: the prefix is what comes before the last '-', less a run suffix "_{N}"; None
    when the name is no checkpoint's."""
    if name.startswith(".") and TEMP_MARKER in name:
        return None
    dash = name.rfind("-")
    if dash <= 0:
        return None
    base = name[:dash]
    head, _, run = base.rpartition("_")
    if head and count(run):
        base = head
    parsed = parse(base, name)
    return None if parsed is None else (base, parsed)


def series_of(name):
    """The prefix of the series (docs/FORMAT.md section 12) whose checkpoint file `name` is,
    or None: every run and exception save of a prefix belongs to the prefix's series."""
    found = guess(name)
    return None if found is None else found[0]
