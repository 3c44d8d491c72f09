"""The adaptive clips (docs/design.md §2.13) through the trainer and ``gapo train``: each runs, learns
something (its parameters move), and logs the per-c diagnostics with the meaning its loss gives
"clipped" and the gate; combinations that do not compose are refused before any work."""

import json
import math

import pytest
import torch

from gapo.cli import main
from gapo.rl.config import load_config
from gapo.rl.trainer import Trainer

METHODS = {
    "sapo": ["algo.loss=sapo"],
    "cegppo": ["algo.loss=cegppo", "algo.loss_params={beta_low: 0.5}"],
    "clip_cov": ["algo.loss=clip_cov", "algo.loss_params={ratio: 0.05, lb: -1.0e9, ub: 1.0e9}"],
    "kl_cov": ["algo.loss=kl_cov", "algo.loss_params={ratio: 0.05}"],
    "bapo": ["algo.eps_schedule=bapo", "algo.eps_low=0.4", "algo.eps_high_max=0.2"],
    "dcpo": ["algo.eps_schedule=dcpo", "algo.eps_low=0.16", "algo.eps_high_max=0.2"],
    "ppo": [],
}


def _cfg(policy, *extra):
    return load_config(
        None,
        [
            f"model.path={policy}",
            "task.params.n_numbers=2",
            "task.params.num_range=[1,10]",
            "task.train_size=300",
            "train.prompts=8",
            "train.group_size=4",
            "train.mini_batches=4",
            "train.epochs=2",  # 8 updates a step: ratios leave 1, so the rules have something to act on
            "train.steps=2",
            "train.progress=false",
            "optim.lr=1e-3",
            "eval.problems=0",
            *extra,
        ],
    )


def _by_c(rec, name):
    pre = f"clip/{name}_by_c/"
    return {int(k[len(pre) :]): v for k, v in rec.items() if k.startswith(pre)}


@pytest.mark.parametrize("method", list(METHODS))
def test_each_rule_trains_and_logs_per_c_diagnostics(easy_policy, tmp_path, method):
    tr = Trainer(_cfg(easy_policy, *METHODS[method]), tmp_path / "r")
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.fit()
    recs = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    assert len(train) == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters())), "nothing was trained"
    for rec in train:
        assert all(math.isfinite(v) for v in rec.values() if isinstance(v, float)), method
    rec = train[0]  # the base policy's rollouts: mixed groups, so positive advantages to clip
    frac, gate, dev = _by_c(rec, "frac_high"), _by_c(rec, "gate"), _by_c(rec, "ratio_dev_pos")
    assert frac and set(frac) == set(gate) == set(dev), {k: v for k, v in rec.items() if "clip/" in k}
    assert all(0.0 <= g <= 1.0 + 1e-6 for g in gate.values()), gate
    assert any(d > 0 for d in dev.values()), "the ratios never left 1: the test has nothing to measure"
    if method == "sapo":  # a soft gate clips nothing; its weight falls below 1 as the ratio moves
        assert all(f == 0.0 for f in frac.values()) and any(g < 1.0 for g in gate.values())
    elif method in ("ppo", "bapo", "dcpo", "clip_cov"):  # a hard clip: the gate is 1 − the clipped share
        for c in frac:
            assert gate[c] == pytest.approx(1.0 - frac[c], abs=1e-9), (method, c)
    if method == "clip_cov":
        assert rec["loss/clipfrac_cov"] > 0
    if method in ("bapo", "dcpo"):  # the widths in force are the schedule's, not the configured ones
        eps = _by_c(rec, "eps_high")
        assert eps and any(abs(v - 0.2) > 1e-6 for v in eps.values()), eps
        assert "clip/eps_high_pos_mean" in rec


def test_the_rules_change_the_update(easy_policy, tmp_path):
    """Same seed, same first rollouts: each rule's first step ends at other parameters than PPO's."""
    finals = {}
    for method in ("ppo", "sapo", "dcpo"):
        tr = Trainer(_cfg(easy_policy, "train.steps=1", *METHODS[method]), tmp_path / method)
        tr.fit()
        finals[method] = torch.cat([p.detach().flatten() for p in tr.model.parameters()])
    assert not torch.equal(finals["ppo"], finals["sapo"])
    assert not torch.equal(finals["ppo"], finals["dcpo"])


@pytest.mark.parametrize(
    "extra, key, words",
    [
        (["algo.loss=sapo", "algo.eps_schedule=linear"], "algo.eps_schedule", "soft sigmoid gate"),
        (["algo.loss=kl_cov", "algo.eps_schedule=bapo"], "algo.eps_schedule", "has none"),
        (["algo.loss=gspo", "algo.eps_schedule=dcpo"], "algo.eps_schedule", "token-ratio loss"),
        (["algo.loss=cegppo", "algo.clip_ratio_c=3.0"], "algo.clip_ratio_c", "dual clip"),
        (["algo.loss=sapo", "algo.loss_params={tau: 1}"], "algo.loss_params", "tau_pos, tau_neg"),
        (["algo.loss=sapo", "algo.loss_params={tau_pos: 0}"], "algo.loss_params", "> 0"),
        (["algo.eps_schedule_params={r_max: 5}"], "algo.eps_schedule_params", "takes no parameters"),
        (["algo.eps_schedule=dcpo", "algo.eps_schedule_params={r_max: 0.5}"], "algo.eps_schedule_params", ">= 1"),
        (["algo.eps_schedule=clip_higher"], "algo.eps_schedule", "bapo"),
    ],
)
def test_combinations_that_do_not_compose_are_refused_naming_the_key(easy_policy, extra, key, words):
    with pytest.raises(ValueError) as e:
        _cfg(easy_policy, *extra)
    assert str(e.value).startswith(key) and words in str(e.value), str(e.value)


def test_gapo_train_runs_a_rival_from_the_command_line(easy_policy, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--out", str(out), "--model", easy_policy, "task.params.n_numbers=2"]
    args += ["task.params.num_range=[1,10]", "train.prompts=4", "train.group_size=4", "train.mini_batches=2"]
    args += ["train.steps=1", "eval.problems=0", "train.progress=false", "algo.loss=sapo"]
    args += ["algo.loss_params.tau_neg=2.0"]
    assert main(args) == 0
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert _by_c(rec, "gate") and "loss/gate_mean" in rec
    saved = (out / "config.yaml").read_text()
    assert "tau_neg: 2.0" in saved and "loss: sapo" in saved


@pytest.mark.parametrize(
    "extra",
    [
        ["algo.loss=cegppo", "algo.eps_schedule=linear", "algo.eps_high_max=0.28"],  # GAPO's widths, CE-GPPO's gradient
        ["algo.loss=clip_cov", "algo.eps_schedule=log", "algo.eps_high_max=0.28"],
        ["algo.loss=cispo", "algo.eps_schedule=dcpo", "algo.eps_low=0.16"],
        ["algo.loss=cegppo", "algo.eps_schedule=bapo", "algo.eps_low=0.4"],
        ["algo.eps_schedule=dcpo", "algo.clip_ratio_c=3.0", "algo.eps_low=0.16"],
    ],
)
def test_the_combinations_that_compose_run(easy_policy, tmp_path, extra):
    """A loss that reads clip widths takes any schedule's (per rollout, per batch, per token)."""
    tr = Trainer(_cfg(easy_policy, "train.steps=1", *extra), tmp_path / "r")
    tr.fit()
    rec = json.loads((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["step"] == 1 and all(math.isfinite(v) for v in rec.values() if isinstance(v, float)), extra
    assert _by_c(rec, "frac_high") and _by_c(rec, "eps_high"), extra
