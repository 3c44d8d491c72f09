"""gapo.rl.optimizer: AdamW with warm-up and optim.schedule (parity with transformers), the clipped
step, changed keys on resume."""

from types import SimpleNamespace

import pytest
import torch

from gapo.rl import optimizer


def _optim(**kw):
    return SimpleNamespace(
        **{"lr": 1e-2, "betas": (0.9, 0.99), "weight_decay": 0.0, "warmup_steps": 4, "schedule": "constant", **kw}
    )


def test_warm_up_is_linear_then_constant():
    model = torch.nn.Linear(2, 1)
    opt, sched = optimizer.build(model, _optim(), torch.device("cpu"), total_steps=10)
    lrs = []
    for _ in range(6):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    # lr · min(1, (s + 1) / 4) for s = 0..5
    assert lrs == pytest.approx([2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2, 1e-2])
    _, sched = optimizer.build(model, _optim(warmup_steps=0), torch.device("cpu"), total_steps=10)
    assert sched.get_last_lr()[0] == 1e-2


def test_the_step_clips_the_norm_and_returns_it_before_clipping():
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    opt, _ = optimizer.build(
        model, _optim(lr=1.0, warmup_steps=0, betas=(0.0, 0.0)), torch.device("cpu"), total_steps=10
    )
    optimizer.backward((model(torch.tensor([[3.0]])) * 4).sum(), None)  # d/dw = 12
    assert optimizer.step(model, opt, None, 1.0, step=1) == pytest.approx(12.0)
    assert model.weight.grad.item() == pytest.approx(1.0)  # clipped to norm 1


def test_a_non_finite_norm_names_the_step():
    model = torch.nn.Linear(1, 1)
    opt, _ = optimizer.build(model, _optim(), torch.device("cpu"), total_steps=10)
    optimizer.backward(model(torch.tensor([[float("inf")]])).sum(), None)
    with pytest.raises(FloatingPointError, match="at step 5; lower optim.lr"):
        optimizer.step(model, opt, None, 1.0, step=5)


def test_changed_keys_on_resume_keep_the_schedules_factor():
    model = torch.nn.Linear(2, 1)
    opt, sched = optimizer.build(model, _optim(), torch.device("cpu"), total_steps=10)
    opt.step()
    sched.step()  # factor 2/4
    optimizer.apply_changes(opt, sched, _optim(lr=4e-2, betas=(0.5, 0.5), weight_decay=0.1))
    g = opt.param_groups[0]
    assert (g["lr"], g["initial_lr"], g["betas"], g["weight_decay"]) == (2e-2, 4e-2, (0.5, 0.5), 0.1)
    assert sched.get_last_lr() == [2e-2]


# ------------------------------------------------------------------ optim.schedule
def _lrs(o, total_steps: int, n: int) -> list[float]:
    """The learning rate each of ``n`` RL steps trains with (the scheduler steps once per RL step)."""
    model = torch.nn.Linear(2, 1)
    opt, sched = optimizer.build(model, o, torch.device("cpu"), total_steps=total_steps)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup, total", [(0, 10), (3, 10), (4, 7), (0, 1), (5, 5)])
def test_schedules_are_transformers_bit_for_bit_after_the_warm_up(schedule, warmup, total):
    """transformers' get_{constant,linear,cosine}_schedule_with_warmup on the same step counts:
    equal (==) from step W on; in the warm-up gapo is one step ahead, (s + 1) / W, never 0."""
    transformers = pytest.importorskip("transformers")
    make = {
        "constant": lambda opt: transformers.get_constant_schedule_with_warmup(opt, warmup),
        "linear": lambda opt: transformers.get_linear_schedule_with_warmup(opt, warmup, total),
        "cosine": lambda opt: transformers.get_cosine_schedule_with_warmup(opt, warmup, total),
    }[schedule]
    opt = torch.optim.AdamW(torch.nn.Linear(2, 1).parameters(), lr=1e-2)
    ref_sched = make(opt)
    ref = []
    for _ in range(total + 1):
        ref.append(opt.param_groups[0]["lr"])
        opt.step()
        ref_sched.step()
    ours = _lrs(_optim(warmup_steps=warmup, schedule=schedule), total, total)
    assert ours[warmup:] == ref[warmup:total]
    # the warm-up, (s + 1) / W: transformers' one step ahead, reaching the full rate at s = W - 1
    assert ours[:warmup] == [1e-2 * ((s + 1) / warmup) for s in range(warmup)]
    assert ours[: max(warmup - 1, 0)] == ref[1:warmup]
    assert all(lr > 0 for lr in ours)  # no RL step (and its rollouts) spent at learning rate 0


def test_linear_and_cosine_by_hand():
    # W = 2, N = 6, lr 1e-2: warm-up 1/2, 2/2; then linear (6 - s) / 4 for s = 2..5; cosine
    # ½(1 + cos(π (s - 2) / 4)) = 1, 0.854, 0.5, 0.146
    lin = _lrs(_optim(warmup_steps=2, schedule="linear"), 6, 6)
    assert lin == pytest.approx([5e-3, 1e-2, 1e-2, 7.5e-3, 5e-3, 2.5e-3], rel=1e-12)
    cos = _lrs(_optim(warmup_steps=2, schedule="cosine"), 6, 6)
    assert cos == pytest.approx([5e-3, 1e-2, 1e-2, 8.5355339e-3, 5e-3, 1.4644661e-3], rel=1e-7)
    # the constant schedule is today's warm-up then constant, unchanged
    assert _lrs(_optim(schedule="constant"), 6, 6) == pytest.approx([2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2, 1e-2])


def test_every_schedule_is_called_the_same_way():
    for name, fn in optimizer.LR_SCHEDULES.items():
        assert 0.0 <= fn(3, warmup_steps=1, total_steps=5) <= 1.0, name
        assert optimizer.lr_factor(name, 0, warmup_steps=4, total_steps=5) == 0.25, name


def test_a_resume_keeps_the_schedule_and_a_changed_one_applies_from_that_step():
    """The scheduler's state is its step; the schedule itself comes from the config, so a saved
    state restored into a scheduler of another schedule or length follows the new one."""
    o = _optim(warmup_steps=1, schedule="linear")
    model = torch.nn.Linear(2, 1)
    opt, sched = optimizer.build(model, o, torch.device("cpu"), total_steps=8)
    for _ in range(3):
        opt.step()
        sched.step()
    saved_opt, saved = opt.state_dict(), sched.state_dict()
    # the same config: the next steps are those of the straight run
    opt2, sched2 = optimizer.build(model, o, torch.device("cpu"), total_steps=8)
    opt2.load_state_dict(saved_opt)
    sched2.load_state_dict(saved)
    assert [sched2.get_last_lr()[0]] + _after(opt2, sched2, 2) == _lrs(o, 8, 6)[3:]
    # --allow-change optim.schedule=cosine train.steps=12: apply_changes writes step 3's new factor
    o3 = _optim(warmup_steps=1, schedule="cosine")
    opt3, sched3 = optimizer.build(model, o3, torch.device("cpu"), total_steps=12)
    opt3.load_state_dict(saved_opt)
    sched3.load_state_dict(saved)
    optimizer.apply_changes(opt3, sched3, o3)
    assert opt3.param_groups[0]["lr"] == 1e-2 * optimizer.lr_factor("cosine", 3, warmup_steps=1, total_steps=12)
    assert _after(opt3, sched3, 1) == [1e-2 * optimizer.lr_factor("cosine", 4, warmup_steps=1, total_steps=12)]


def _after(opt, sched, n: int) -> list[float]:
    out = []
    for _ in range(n):
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def test_the_trainer_follows_the_schedule_over_train_steps_and_a_changed_length(tmp_path):
    """Through a run: optim/lr (the rate after each step, as TRL's learning_rate) is lr · f(s) over
    train.steps; a resume with --allow-change train.steps=6 follows the longer schedule at once."""
    import json

    from checkpoints import build_instruct_checkpoint, small_instruct_config  # tests/ is on sys.path
    from gapo.rl.trainer import Trainer

    model = build_instruct_checkpoint(tmp_path / "model")
    base = ["sampling.max_new_tokens=4", "optim.lr=1e-3", "optim.warmup_steps=1", "optim.schedule=linear"]
    run = tmp_path / "run"
    Trainer(small_instruct_config(model, *base, "train.steps=4"), run).fit(stop_after=2)
    tr = Trainer(small_instruct_config(model, *base, "train.steps=6"), run, resume=True, allow_change=True)
    # step 3 trains at the new schedule's rate, not the one the checkpoint's optimiser state holds
    assert tr.opt.param_groups[0]["lr"] == 1e-3 * optimizer.lr_factor("linear", 2, warmup_steps=1, total_steps=6)
    tr.fit()
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["optim/lr"] for r in recs if r["kind"] == "train"]
    f = optimizer.lr_factor
    want = [1e-3 * f("linear", s, warmup_steps=1, total_steps=4) for s in (1, 2)]
    want += [1e-3 * f("linear", s, warmup_steps=1, total_steps=6) for s in (3, 4, 5, 6)]
    assert lrs == want  # (4 - s) / 3 for steps 1-2, then (6 - s) / 5
