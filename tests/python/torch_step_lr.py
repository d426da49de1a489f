"""A StepLR schedule between libtorch and PyTorch, for tests/test_torch.cpp, with Debian's
python3-torch and the ckpt package of this tree. StepLR(step_size 3, gamma 0.5) over SGD
(lr 0.1) on a Linear(2, 2), as the C++ test sets it up:
  - DIR/cpp.ckpt, written by a libtorch run after 6 calls of step() (a boundary: libtorch's
    StepLR lowers the rate at calls 4, 7, 10, PyTorch's at 3, 6, 9), is loaded and the
    schedule goes on for 6 calls: its learning rates must be those of an unbroken PyTorch run
    of 12 calls;
  - DIR/py.ckpt is written after 6 calls, for the C++ test to go on from.
   torch_step_lr.py DIR"""
import os
import sys

try:
    import torch
except ImportError:
    sys.exit("python3-torch is missing (bash scripts/deps.sh installs it)")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import ckpt.torch  # noqa: E402


def objects():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)


def schedule(opt, sched, calls):
    out = []
    for _ in range(calls):
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def main():
    work = sys.argv[1]
    _, opt, sched = objects()
    unbroken = schedule(opt, sched, 12)
    model, opt, sched = objects()
    ckpt.torch.load_training_state(os.path.join(work, "cpp.ckpt"), model, opt, sched, generator=False)
    at = opt.param_groups[0]["lr"]
    continued = schedule(opt, sched, 6)
    print("unbroken PyTorch run, calls 1-12:", unbroken)
    print("from libtorch's state after 6 calls: lr %r, then %r" % (at, continued))
    if [at] + continued != unbroken[5:]:
        sys.exit("the schedule continued from libtorch's state differs from PyTorch's own")

    model, opt, sched = objects()
    schedule(opt, sched, 6)
    ckpt.torch.save_training_state(os.path.join(work, "py.ckpt"), model, opt, sched, generator=False)


if __name__ == "__main__":
    main()
