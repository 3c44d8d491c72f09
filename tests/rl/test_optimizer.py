"""gapo.rl.optimizer: AdamW with linear warm-up, the clipped step, changed keys on resume."""

from types import SimpleNamespace

import pytest
import torch

from gapo.rl import optimizer


def _optim(**kw):
    return SimpleNamespace(**{"lr": 1e-2, "betas": (0.9, 0.99), "weight_decay": 0.0, "warmup_steps": 4, **kw})


def test_warm_up_is_linear_then_constant():
    model = torch.nn.Linear(2, 1)
    opt, sched = optimizer.build(model, _optim(), torch.device("cpu"))
    lrs = []
    for _ in range(6):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    # lr · min(1, (s + 1) / 4) for s = 0..5
    assert lrs == pytest.approx([2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2, 1e-2])
    _, sched = optimizer.build(model, _optim(warmup_steps=0), torch.device("cpu"))
    assert sched.get_last_lr()[0] == 1e-2


def test_the_step_clips_the_norm_and_returns_it_before_clipping():
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    opt, _ = optimizer.build(model, _optim(lr=1.0, warmup_steps=0, betas=(0.0, 0.0)), torch.device("cpu"))
    optimizer.backward((model(torch.tensor([[3.0]])) * 4).sum(), None)  # d/dw = 12
    assert optimizer.step(model, opt, None, 1.0, step=1) == pytest.approx(12.0)
    assert model.weight.grad.item() == pytest.approx(1.0)  # clipped to norm 1


def test_a_non_finite_norm_names_the_step():
    model = torch.nn.Linear(1, 1)
    opt, _ = optimizer.build(model, _optim(), torch.device("cpu"))
    optimizer.backward(model(torch.tensor([[float("inf")]])).sum(), None)
    with pytest.raises(FloatingPointError, match="at step 5; lower optim.lr"):
        optimizer.step(model, opt, None, 1.0, step=5)


def test_changed_keys_on_resume_keep_the_schedules_factor():
    model = torch.nn.Linear(2, 1)
    opt, sched = optimizer.build(model, _optim(), torch.device("cpu"))
    opt.step()
    sched.step()  # factor 2/4
    optimizer.apply_changes(opt, sched, _optim(lr=4e-2, betas=(0.5, 0.5), weight_decay=0.1))
    g = opt.param_groups[0]
    assert (g["lr"], g["initial_lr"], g["betas"], g["weight_decay"]) == (2e-2, 4e-2, (0.5, 0.5), 0.1)
    assert sched.get_last_lr() == [2e-2]
