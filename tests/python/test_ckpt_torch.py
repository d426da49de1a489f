"""ckpt.torch: PyTorch state_dicts saved and loaded as ckpt checkpoints."""

import os
import warnings
import subprocess
import sys

import numpy as np
import pytest

import ckpt

torch = pytest.importorskip("torch")
import ckpt.torch as ct  # noqa: E402


def small_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 6 * 6, 3))


def trained(net):
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        net(torch.randn(5, 1, 8, 8)).square().mean().backward()
        opt.step()
    return opt


def test_a_model_round_trips_bit_exact_and_loads_strictly(tmp_path):
    net = small_net()
    trained(net)
    ct.save_state_dict(tmp_path / "m.ckpt", net.state_dict(), prefix="model.", epoch=2, step=7)
    assert ckpt.header(tmp_path / "m.ckpt").step == 7
    names = list(ckpt.load(tmp_path / "m.ckpt"))
    assert names == ["model." + k for k in net.state_dict()]
    other = small_net()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1)
    result = other.load_state_dict(ct.load_state_dict(tmp_path / "m.ckpt", prefix="model."), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    for (k, a), b in zip(net.state_dict().items(), other.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b), k
    assert other.state_dict()["1.num_batches_tracked"].dtype == torch.int64


def test_loaded_tensors_are_the_read_body_not_copies(tmp_path):
    w1, w2 = torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.ones(4, dtype=torch.float64)
    ct.save_state_dict(tmp_path / "t.ckpt", {"w1": w1, "w2": w2})
    sd = ct.load_state_dict(tmp_path / "t.ckpt")
    # payloads are 64-byte aligned in the body: two tensors of one read body lie 64 bytes
    # apart, as they would not if either had been copied
    assert sd["w2"].data_ptr() - sd["w1"].data_ptr() == 64
    assert torch.equal(sd["w1"], w1) and torch.equal(sd["w2"], w2)
    sd["w1"][0, 0] = 42  # memory of its own: writable, and the file is unchanged
    assert ct.load_state_dict(tmp_path / "t.ckpt")["w1"][0, 0] == 0
    mapped = ct.load_state_dict(tmp_path / "t.ckpt", mmap=True)
    assert mapped["w2"].data_ptr() - mapped["w1"].data_ptr() == 64
    assert torch.equal(mapped["w1"], w1)


def test_every_dtype_a_checkpoint_holds(tmp_path):
    values = {str(d): torch.tensor([0, 1, 1, 0]).to(d) for d in
              (torch.float32, torch.float64, torch.float16, torch.int32, torch.int64, torch.uint8, torch.bool)}
    values["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    ct.save_state_dict(tmp_path / "d.ckpt", values, archive="xml")
    back = ct.load_state_dict(tmp_path / "d.ckpt")
    for k, v in values.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k


def test_an_optimizer_state_dict_is_flattened_as_ckpt_import_flattens_a_pt_file(tmp_path):
    net = small_net()
    opt = trained(net)
    ct.save_state_dict(tmp_path / "opt.ckpt", opt.state_dict())
    flat = ckpt.load(tmp_path / "opt.ckpt")
    assert flat["param_groups.0.lr"] == 0.01 and flat["param_groups.0.betas.1"] == 0.999
    assert "param_groups.0.foreach" not in flat  # None gives no entry, as in `ckpt import`
    assert np.array_equal(flat["state.0.exp_avg"], opt.state_dict()["state"][0]["exp_avg"].numpy())
    tool = os.environ.get("CKPT_TOOL")
    if not tool:
        pytest.skip("CKPT_TOOL (the ckpt tool) is not set")
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    diff = subprocess.run([tool, "diff", str(tmp_path / "opt.pt"), str(tmp_path / "opt.ckpt")], capture_output=True,
                          text=True, timeout=60)
    assert diff.returncode == 0, diff.stdout + diff.stderr


def test_what_a_checkpoint_cannot_hold_is_refused_by_name_and_nothing_is_written(tmp_path):
    quantized = torch.quantize_per_tensor(torch.zeros(2), 0.1, 0, torch.quint8)
    with pytest.raises(ckpt.ConfigError, match="'model.w' is torch.quint8"):
        ct.save_state_dict(tmp_path / "b.ckpt", {"w": quantized}, prefix="model.")
    assert os.listdir(tmp_path) == []


def test_import_ckpt_does_not_import_torch():
    code = "import sys, ckpt; ckpt.load; assert 'torch' not in sys.modules, 'torch imported'"
    env = dict(os.environ)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def dropout_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.3),
                               torch.nn.Linear(8, 2))


def train(model, opt, sched, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 6, generator=g)).square().mean().backward()
        opt.step()
        sched.step()


OPTIMIZERS = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    "Adam": lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=0.01),
    "RMSprop": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
}


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_a_training_state_resumes_bit_exact(tmp_path, kind):
    model = dropout_net()
    opt = OPTIMIZERS[kind](model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    train(model, opt, sched, 3, seed=0)
    ct.save_training_state(tmp_path / "s.ckpt", model, opt, sched, extra={"epoch": 3})
    train(model, opt, sched, 3, seed=1)  # dropout draws from the generator saved with the state
    expected = [t.clone() for t in model.state_dict().values()]

    fresh = dropout_net()
    fresh_opt = OPTIMIZERS[kind](fresh.parameters())
    fresh_sched = torch.optim.lr_scheduler.StepLR(fresh_opt, 2, 0.5)
    assert ct.load_training_state(tmp_path / "s.ckpt", fresh, fresh_opt, fresh_sched) == {"epoch": 3}
    train(fresh, fresh_opt, fresh_sched, 3, seed=1)
    for a, b in zip(expected, fresh.state_dict().values()):
        assert torch.equal(a, b)
    assert fresh_sched.last_epoch == 6 and fresh_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_a_training_state_is_named_as_the_cpp_torch_state_names_it(tmp_path):
    model = dropout_net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train(model, opt, torch.optim.lr_scheduler.StepLR(opt, 5), 1, seed=0)
    entries = ct.training_state(model, opt)
    assert entries["optimizer.kind"] == "Adam"
    assert entries["optimizer.group.0.params"] == "0.weight\n0.bias\n1.weight\n1.bias\n3.weight\n3.bias"
    assert entries["optimizer.group.0.betas.1"] == 0.999 and entries["optimizer.group.0.amsgrad"].dtype == bool
    assert entries["optimizer.state.3.weight.step"] == 1 and entries["optimizer.state.3.weight.step"].dtype == np.int64
    assert np.array_equal(entries["optimizer.state.0.bias.exp_avg"], opt.state[model[0].bias]["exp_avg"].numpy())
    assert "optimizer.state.0.bias.max_exp_avg_sq" not in entries  # amsgrad off: no such tensor
    assert entries["model.1.num_batches_tracked"].dtype == np.int64
    assert entries["torch.cpu_generator"].dtype == np.uint8


def test_a_training_state_of_another_optimizer_or_network_is_refused_and_nothing_changes(tmp_path):
    model = dropout_net()
    opt = torch.optim.Adam(model.parameters())
    train(model, opt, torch.optim.lr_scheduler.StepLR(opt, 5), 1, seed=0)
    ct.save_training_state(tmp_path / "s.ckpt", model, opt)
    other = dropout_net()
    before = [t.clone() for t in other.state_dict().values()]
    with pytest.raises(ckpt.LoadMismatch, match="holds the state of optimizer Adam; this one is SGD"):
        ct.load_training_state(tmp_path / "s.ckpt", other, torch.optim.SGD(other.parameters(), lr=0.1))
    with pytest.raises(ckpt.LoadMismatch, match="param group 0 .* holds other parameters"):
        ct.load_training_state(tmp_path / "s.ckpt", other, torch.optim.Adam(list(other.parameters())[:2]))
    wider = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.BatchNorm1d(9), torch.nn.Dropout(0.3),
                                torch.nn.Linear(9, 2))
    with pytest.raises(ckpt.LoadMismatch, match=r"'model.0.weight' as float32\[8, 6\], the target is torch.float32\[9, 6\]"):
        ct.load_training_state(tmp_path / "s.ckpt", wider)
    for a, b in zip(before, other.state_dict().values()):
        assert torch.equal(a, b)


def test_column_major_tensors_load_with_their_logical_shapes(tmp_path):
    """A column-major tensor (FORMAT.md 3.1; an Eigen matrix, a Fortran-ordered array) is a
    torch tensor of its logical shape over the same bytes, and loads into a module as the
    matrix it is."""
    w = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    path = ckpt.save(str(tmp_path / "f.ckpt"), {"weight": w, "bias": np.zeros(3, np.float32)})
    sd = ct.load_state_dict(path)
    assert sd["weight"].shape == (3, 4) and torch.equal(sd["weight"], torch.from_numpy(np.ascontiguousarray(w)))
    assert sd["weight"].stride() == (1, 3)  # column-major: no copy was made
    linear = torch.nn.Linear(4, 3)
    linear.load_state_dict(sd)
    assert linear.weight[0, 1].item() == 1.0 and linear.weight[1, 0].item() == 4.0


# ------------------------------------------------------------------------------ schedulers

L = torch.optim.lr_scheduler


class Decay:
    """An lr_lambda that is a callable object with state of its own, which changes as it is called."""

    def __init__(self):
        self.calls = 0

    def __call__(self, epoch):
        self.calls += 1
        return 0.97 ** self.calls


# Every scheduler of PyTorch's, set up so that 12 steps go through its phases; SGD with two
# param groups (0.1 and 0.05) and momentum, which CyclicLR and OneCycleLR cycle.
SCHEDULERS = {
    "LambdaLR": lambda o: L.LambdaLR(o, lambda e: 0.9 ** e),
    "LambdaLR of a callable object": lambda o: L.LambdaLR(o, Decay()),
    "MultiplicativeLR": lambda o: L.MultiplicativeLR(o, lambda e: 0.95),
    "StepLR": lambda o: L.StepLR(o, 3, 0.5),
    "MultiStepLR": lambda o: L.MultiStepLR(o, [2, 5, 5, 9], 0.5),
    "ConstantLR": lambda o: L.ConstantLR(o, 0.5, total_iters=7),
    "LinearLR": lambda o: L.LinearLR(o, 0.25, 1.0, total_iters=9),
    "ExponentialLR": lambda o: L.ExponentialLR(o, 0.9),
    "SequentialLR": lambda o: L.SequentialLR(o, [L.LinearLR(o, 0.5, total_iters=3), L.CosineAnnealingLR(o, 8)], [4]),
    "CosineAnnealingLR": lambda o: L.CosineAnnealingLR(o, 5, eta_min=0.001),
    "ChainedScheduler": lambda o: L.ChainedScheduler([L.ConstantLR(o, 0.5, total_iters=4), L.ExponentialLR(o, 0.9)]),
    "ReduceLROnPlateau": lambda o: L.ReduceLROnPlateau(o, factor=0.5, patience=0, cooldown=3),
    "CyclicLR": lambda o: L.CyclicLR(o, 0.01, 0.1, step_size_up=3, mode="triangular2"),
    "CosineAnnealingWarmRestarts": lambda o: L.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2, eta_min=0.001),
    "OneCycleLR": lambda o: L.OneCycleLR(o, 0.1, total_steps=30, anneal_strategy="linear", three_phase=True),
    "PolynomialLR": lambda o: L.PolynomialLR(o, total_iters=10, power=2.0),
}
PLATEAU = [1.0, 0.5, 1 / 3] + [0.3] * 9  # ReduceLROnPlateau's metric at each step


def scheduled(kind):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr": 0.05}], lr=0.1, momentum=0.9)
    return model, opt, SCHEDULERS[kind](opt)


def schedule(opt, sched, steps, start=0):
    """Steps the scheduler; the learning rate and momentum of each param group after each step."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SequentialLR's step(0) of its second scheduler warns
        for i in range(start, start + steps):
            opt.step()
            sched.step(PLATEAU[i]) if isinstance(sched, L.ReduceLROnPlateau) else sched.step()
            out.append([(g["lr"], g["momentum"]) for g in opt.param_groups])
    return out


@pytest.mark.parametrize("kind", list(SCHEDULERS))
def test_every_scheduler_resumes_bit_exact(tmp_path, kind):
    """12 steps in two runs of 6, the state saved and loaded into fresh objects between them,
    give the learning rates (and momenta) of 12 steps in one run, bit for bit."""
    _, opt, sched = scheduled(kind)
    unbroken = schedule(opt, sched, 12)
    model, opt, sched = scheduled(kind)
    first = schedule(opt, sched, 6)
    ct.save_training_state(tmp_path / "s.ckpt", model, opt, sched, generator=False)
    model, opt, sched = scheduled(kind)
    ct.load_training_state(tmp_path / "s.ckpt", model, opt, sched, generator=False)
    assert first + schedule(opt, sched, 6, start=6) == unbroken


def test_a_plateau_resumed_at_step_6_has_the_learning_rate_of_an_unbroken_run_at_step_12(tmp_path):
    """Its best value, bad-epoch count and cooldown are its state: with its position alone, the
    resumed run lowers the learning rate during the cooldown, to 0.0125 at step 12."""
    _, opt, sched = scheduled("ReduceLROnPlateau")
    assert schedule(opt, sched, 12)[-1][0][0] == 0.025
    model, opt, sched = scheduled("ReduceLROnPlateau")
    schedule(opt, sched, 6)
    assert sched.cooldown_counter > 0
    ct.save_training_state(tmp_path / "s.ckpt", model, opt, sched, generator=False)
    model, opt, sched = scheduled("ReduceLROnPlateau")
    ct.load_training_state(tmp_path / "s.ckpt", model, opt, sched, generator=False)
    assert schedule(opt, sched, 6, start=6)[-1][0][0] == 0.025


def test_a_scheduler_is_stored_as_entries_under_scheduler(tmp_path):
    model, opt, sched = scheduled("CosineAnnealingWarmRestarts")
    schedule(opt, sched, 7)
    entries = ct.training_state(model, opt, sched)
    assert entries["scheduler.kind"] == "CosineAnnealingWarmRestarts" and entries["scheduler.convention"] == "pytorch"
    assert entries["scheduler.T_cur"] == 2 and entries["scheduler.T_i"] == 10 and entries["scheduler.last_epoch"] == 7
    assert entries["scheduler.base_lrs"].dtype == np.float64 and entries["scheduler.base_lrs"].tolist() == [0.1, 0.05]
    assert entries["scheduler.eta_min"] == 0.001 and entries["scheduler.verbose"] is False
    model, opt, sched = scheduled("MultiStepLR")
    entries = ct.training_state(model, opt, sched)
    assert entries["scheduler.milestones"].tolist() == [2, 5, 5, 9] and entries["scheduler.milestones"].dtype == np.int64
    model, opt, sched = scheduled("SequentialLR")
    entries = ct.training_state(model, opt, sched)
    assert entries["scheduler._schedulers.1.kind"] == "CosineAnnealingLR" and entries["scheduler._milestones"].tolist() == [4]
    model, opt, sched = scheduled("OneCycleLR")
    entries = ct.training_state(model, opt, sched)
    assert entries["scheduler.anneal_func"] == "linear" and entries["scheduler._schedule_phases.2.end_lr"] == "min_lr"
    assert entries["scheduler._schedule_phases.2.end_step"] == 29  # an int stays an int
    model, opt, sched = scheduled("LambdaLR")
    assert not any(n.startswith("scheduler.lr_lambdas") for n in ct.training_state(model, opt, sched))  # code
    model, opt, sched = scheduled("LambdaLR of a callable object")
    entries = ct.training_state(model, opt, sched)  # one object for both param groups, called once for each
    assert entries["scheduler.lr_lambdas.0.calls"] == 2 and entries["scheduler.lr_lambdas.1.calls"] == 2


class Halving(L.StepLR):
    pass


def test_a_scheduler_ckpt_does_not_know_is_refused_by_name_and_nothing_is_written(tmp_path):
    model, opt, _ = scheduled("StepLR")
    with pytest.raises(ckpt.ConfigError, match=r"the scheduler is a test_ckpt_torch\.Halving, not one of PyTorch's"):
        ct.save_training_state(tmp_path / "s.ckpt", model, opt, Halving(opt, 3))
    inner = L.ChainedScheduler([L.ExponentialLR(opt, 0.9), Halving(opt, 3)])
    with pytest.raises(ckpt.ConfigError, match=r"the scheduler's scheduler 1 is a test_ckpt_torch\.Halving"):
        ct.save_training_state(tmp_path / "s.ckpt", model, opt, inner)
    assert os.listdir(tmp_path) == []


def test_a_scheduler_state_of_another_kind_or_shape_is_refused_and_nothing_changes(tmp_path):
    model, opt, sched = scheduled("SequentialLR")
    schedule(opt, sched, 5)
    ct.save_training_state(tmp_path / "s.ckpt", model, opt, sched, generator=False)
    for other, message in ((L.CosineAnnealingLR, "holds the state of a SequentialLR scheduler as 'scheduler'; this one "
                                                 "is CosineAnnealingLR"),
                           (lambda o: L.SequentialLR(o, [L.LinearLR(o, 0.5, total_iters=3), L.ExponentialLR(o, 0.9)], [4]),
                            "holds the state of a CosineAnnealingLR scheduler as 'scheduler._schedulers.1'; this one is "
                            "ExponentialLR")):
        model, opt, _ = scheduled("StepLR")
        sched = other(opt) if other is not L.CosineAnnealingLR else other(opt, 8)
        before = [t.clone() for t in model.state_dict().values()], [dict(g) for g in opt.param_groups], dict(sched.__dict__)
        with pytest.raises(ckpt.LoadMismatch, match=message):
            ct.load_training_state(tmp_path / "s.ckpt", model, opt, sched, generator=False)
        assert all(torch.equal(a, b) for a, b in zip(before[0], model.state_dict().values()))
        assert [dict(g) for g in opt.param_groups] == before[1] and sched.__dict__ == before[2]
