"""ckpt.torch: PyTorch state_dicts saved and loaded as ckpt checkpoints."""

import os
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
    with pytest.raises(ckpt.ConfigError, match="'model.w' is torch.bfloat16"):
        ct.save_state_dict(tmp_path / "b.ckpt", {"w": torch.zeros(2, dtype=torch.bfloat16)}, prefix="model.")
    assert os.listdir(tmp_path) == []


def test_import_ckpt_does_not_import_torch():
    code = "import sys, ckpt; ckpt.load; assert 'torch' not in sys.modules, 'torch imported'"
    env = dict(os.environ)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
