"""GAPO inside TRL's GRPOTrainer (gapo.integrations.trl), on CPU with a tiny local model.

No model hub: a 2-layer Qwen2 with random weights and a character-level tokenizer are written to
a temporary folder. The tokenizer is loaded with ``PreTrainedTokenizerFast(tokenizer_file=...)``
because transformers 5.x ``AutoTokenizer`` would swap in qwen2's byte-level tokenizer.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from datasets import Dataset  # noqa: E402  (trl depends on datasets)
from trl import GRPOTrainer  # noqa: E402

from gapo.integrations.trl import GAPOConfig, GAPOTrainer, GAPOWarning  # noqa: E402

pytestmark = pytest.mark.trl

ALPHABET = "abcde+="
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def _char_tokenizer(path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + list(ALPHABET))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.save(str(path / "tokenizer.json"))
    return PreTrainedTokenizerFast(
        tokenizer_file=str(path / "tokenizer.json"),
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """(model folder, tokenizer): a random 2-layer Qwen2 (≈20k parameters) saved locally."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = tmp_path_factory.mktemp("tiny_qwen2")
    tok = _char_tokenizer(path)
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(SPECIALS) + len(ALPHABET),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return str(path), tok


def frac_a(completions, **kwargs):
    """Reward in [0, 1]: share of 'a' characters in the completion (mixed groups almost surely)."""
    return [c.count("a") / max(len(c), 1) for c in completions]


def _config(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=6,
        logging_steps=1,
        learning_rate=3e-2,
        max_steps=2,
        num_iterations=2,
        steps_per_generation=2,
        seed=0,
        loss_type="dapo",
        beta=0.0,
        epsilon=0.2,
        eps_high_max=0.28,
        disable_tqdm=True,
    )
    base.update(kw)
    return GAPOConfig(**base)


def _dataset(n=8):
    return Dataset.from_list([{"prompt": ALPHABET[i % 5] + ALPHABET[(i + 1) % 5] + "="} for i in range(n)])


def _trainer(policy, tmp_path, **kw):
    path, tok = policy
    return GAPOTrainer(
        model=path, reward_funcs=frac_a, args=_config(tmp_path, **kw), train_dataset=_dataset(), processing_class=tok
    )


# ---------------------------------------------------------------------------------------------
def test_end_to_end_learns_and_logs_gapo_metrics(policy, tmp_path):
    # One generation batch of 4 prompts × 4 completions, split into 2 micro-batches, each used for
    # 2 iterations: 4 optimiser steps, the last 3 on data the policy has already moved away from.
    trainer = _trainer(policy, tmp_path, max_steps=4)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "no parameter changed"

    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 4
    for h in logs:
        for key in (
            "gapo/eps_high_mean",
            "gapo/clipfrac_pos",
            "gapo/clipfrac_pos_at_eps_low",
            "clip_ratio/high_mean",
            "clip_ratio/low_mean",
        ):
            assert key in h and math.isfinite(h[key]), (key, h)
        assert 0.2 - 1e-6 <= h["gapo/eps_high_mean"] <= 0.28 + 1e-6
        # GAPO's bound is never tighter than fixed clipping at epsilon
        assert h["gapo/clipfrac_pos"] <= h["gapo/clipfrac_pos_at_eps_low"] + 1e-9
    # with lr 3e-2 and reused batches, clipping is active on at least one step
    assert any(h["clip_ratio/region_mean"] > 0 for h in logs[1:]), logs


def test_fixed_eps_training_matches_trl(policy, tmp_path):
    # Whole-loop parity: with eps_high_max == epsilon, 4 optimiser steps of GAPOTrainer (same seed,
    # same sampling, reused batches) end at the same parameters as TRL's GRPOTrainer.
    from trl import GRPOConfig

    path, tok = policy
    gapo = _trainer(policy, tmp_path / "gapo", max_steps=4, eps_high_max=0.2)
    gapo.train()
    cfg = {
        k: v
        for k, v in _config(tmp_path, max_steps=4).to_dict().items()
        if k
        in (
            "per_device_train_batch_size",
            "num_generations",
            "max_completion_length",
            "learning_rate",
            "max_steps",
            "num_iterations",
            "steps_per_generation",
            "seed",
            "loss_type",
            "beta",
            "epsilon",
        )
    }
    grpo = GRPOTrainer(
        model=path,
        reward_funcs=frac_a,
        train_dataset=_dataset(),
        processing_class=tok,
        args=GRPOConfig(
            output_dir=str(tmp_path / "grpo"),
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            logging_steps=1,
            **cfg,
        ),
    )
    grpo.train()
    for (n, a), b in zip(gapo.model.named_parameters(), grpo.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=n)
    assert [h["loss"] for h in gapo.state.log_history if "loss" in h] == [
        h["loss"] for h in grpo.state.log_history if "loss" in h
    ]


def test_hand_computed_eps_for_binary_groups(policy, tmp_path):
    trainer = _trainer(policy, tmp_path)
    # G = 4, ε_low 0.2, ε_high_max 0.28, w = (G − c)/(G − 1) for a correct rollout:
    #   [1,0,0,0]: c=1, w=1 → 0.28 for the correct one, 0.2 (ε_low) for the rest
    #   [1,1,1,0]: c=3, w=1/3 → 0.2 + 0.08/3 = 0.226667 for the correct ones
    #   [1,1,1,1] and [0,0,0,0]: no signal → 0.2
    rewards = torch.tensor([1, 0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0], dtype=torch.float32)
    eps = trainer.compute_eps_high(rewards, 4)
    third = 0.2 + 0.08 / 3
    expected = [0.28, 0.2, 0.2, 0.2, third, third, third, 0.2] + [0.2] * 8
    torch.testing.assert_close(eps, torch.tensor(expected), rtol=0, atol=1e-6)

    # an unscorable completion (NaN) gets ε_low and does not move its group's mean:
    # [1, NaN, 0, 0] → mean of the others 1/3 → correct rollout w = (1 − 1/3)/(3/4) = 8/9
    eps = trainer.compute_eps_high(torch.tensor([1.0, float("nan"), 0.0, 0.0]), 4)
    torch.testing.assert_close(eps, torch.tensor([0.2 + 0.08 * 8 / 9, 0.2, 0.2, 0.2]), rtol=0, atol=1e-6)

    # "log" schedule: log(1+ε) interpolated, (1.2)·(1.28/1.2)^w − 1; same endpoints, w=1/3 → 0.226095 (linear: 0.226667)
    trainer.args.eps_schedule = "log"
    eps = trainer.compute_eps_high(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]), 4)
    mid = 1.2 * (1.28 / 1.2) ** (1 / 3) - 1
    torch.testing.assert_close(eps, torch.tensor([0.28, 0.2, 0.2, 0.2, mid, mid, mid, 0.2]), rtol=0, atol=1e-6)
    trainer.args.eps_schedule = "linear"

    # the same widths under a fixed [0, 1] range (0/1 rewards: a mixed group spans [0, 1] anyway) ...
    trainer.args.reward_range = [0.0, 1.0]
    eps = trainer.compute_eps_high(rewards, 4)
    torch.testing.assert_close(eps, torch.tensor(expected), rtol=0, atol=1e-6)
    # ... where rewards outside reward_range are an error, not a silently wrong ε
    with pytest.raises(ValueError, match="reward_range"):
        trainer.compute_eps_high(torch.tensor([2.0, 0.0, 0.0, 0.0]), 4)


def test_eps_travels_with_its_completion(policy, tmp_path):
    # the per-completion ε_high in the inputs dict is the one of that completion's group rewards
    trainer = _trainer(policy, tmp_path, eps_high_max=0.5)
    trainer.model.train()
    rows = [r for r in _dataset() for _ in range(4)][:16]  # 4 prompts × G=4, as TRL's sampler makes them
    out = trainer._generate_and_score_completions(rows)
    texts = trainer.processing_class.batch_decode(out["completion_ids"], skip_special_tokens=True)
    expected = trainer.compute_eps_high(torch.tensor(frac_a(texts)), 4)
    torch.testing.assert_close(out["gapo_eps_high"], expected)
    assert ((out["gapo_eps_high"] > 0.2 + 1e-6) == (out["advantages"] > 0)).all()


def test_eps_uses_whole_groups_across_processes(policy, tmp_path, monkeypatch):
    # Simulate rank 1 of 2: TRL gathers both ranks' rewards (rank 0's rows first) before grouping;
    # GAPO must compute ε on the gathered rows and keep rows 8..15, the slice TRL takes for advantages.
    import trl.trainer.grpo_trainer as grpo_mod

    trainer = _trainer(policy, tmp_path)
    trainer.model.train()
    rank0 = torch.tensor([[1.0], [0.0], [0.0], [0.0], [1.0], [1.0], [0.0], [0.0]])
    monkeypatch.setattr(grpo_mod, "gather", lambda t: torch.cat([rank0, t]))
    monkeypatch.setattr(type(trainer.accelerator), "process_index", property(lambda self: 1))
    completions = ["aaaa", "bbbb", "abab", "bbbb", "aaab", "aaab", "aaab", "aaab"]  # frac_a: 1, 0, .5, 0, .75 ×4
    rows = [{"prompt": "ab="}] * 4 + [{"prompt": "bc="}] * 4
    trainer._calculate_rewards(rows, [r["prompt"] for r in rows], completions, [[5]] * 8)
    local, success = trainer._gapo_pending
    # group (1, 0, .5, 0): mean .375, w = (R − .375)/(.75) → 5/6 and 1/6; group of equal rewards → ε_low
    expected = torch.tensor([0.2 + 0.08 * 5 / 6, 0.2, 0.2 + 0.08 / 6, 0.2] + [0.2] * 4)
    torch.testing.assert_close(local, expected, rtol=0, atol=1e-6)
    # c = round(sum of the group's rewards): 1 + 0 + .5 + 0 = 1.5 → 2; .75 × 4 = 3
    assert success.tolist() == [2] * 4 + [3] * 4


def _inputs_with_stale_policy(trainer, seed=0):
    """A generated batch whose old/ref log-probs are perturbed, so ratios spread over both clip bounds."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [r for r in _dataset() for _ in range(4)][:16]
    inputs = trainer._generate_and_score_completions(rows)
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        logps, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, trainer.model, ids, am, inputs["completion_ids"].size(1)
        )
    g = torch.Generator().manual_seed(seed)
    inputs["old_per_token_logps"] = logps + 0.3 * torch.randn(logps.shape, generator=g)
    inputs["ref_per_token_logps"] = logps + 0.1 * torch.randn(logps.shape, generator=g)
    # a spread of advantages of both signs (TRL's own may be all ~0 for a random policy)
    inputs["advantages"] = torch.randn(logps.shape[0], generator=g)
    return inputs


def _loss_and_grads(fn, trainer, inputs):
    trainer.model.zero_grad(set_to_none=True)
    loss = fn(trainer.model, inputs)
    loss.backward()
    grads = [p.grad.detach().clone() for p in trainer.model.parameters() if p.grad is not None]
    return loss.detach(), grads


def test_fixed_eps_equals_trl_loss(policy, tmp_path):
    # eps_high_max == epsilon: every row's ε_high is epsilon, and TRL's own GRPOTrainer._compute_loss
    # on the same inputs dict must give the same loss and gradients, for every clipped loss_type,
    # both importance-sampling levels, with and without the KL term.
    trainer = _trainer(policy, tmp_path, eps_high_max=0.2)
    inputs = _inputs_with_stale_policy(trainer)
    assert torch.equal(inputs["gapo_eps_high"], torch.full_like(inputs["gapo_eps_high"], 0.2))
    max_diff = 0.0
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        for level in ("token", "sequence"):
            for beta in (0.0, 0.04):
                trainer.loss_type, trainer.importance_sampling_level, trainer.beta = loss_type, level, beta
                ours, g_ours = _loss_and_grads(trainer._compute_loss, trainer, inputs)
                ref, g_ref = _loss_and_grads(lambda m, x: GRPOTrainer._compute_loss(trainer, m, x), trainer, inputs)
                torch.testing.assert_close(ours, ref, rtol=0, atol=1e-7)
                for a, b in zip(g_ours, g_ref):
                    torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
                max_diff = max(
                    max_diff, (ours - ref).abs().item(), *((a - b).abs().max().item() for a, b in zip(g_ours, g_ref))
                )
    print(f"max |GAPO(fixed) − TRL| over loss and grads: {max_diff:.3g}")
    # TRL's clip metrics were logged by both calls and agree
    m = trainer._metrics["train"]
    assert m["clip_ratio/high_mean"][-1] == m["clip_ratio/high_mean"][-2]


def _rows(inputs, idx):
    return {k: (v[idx] if isinstance(v, torch.Tensor) and v.ndim > 0 else v) for k, v in inputs.items()}


@pytest.mark.filterwarnings("ignore::gapo.integrations.trl.GAPOWarning")  # token widths at sequence level
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_per_row_eps_equals_trl_per_row(policy, tmp_path, level):
    # ε_high differs per row: rows with A > 0 get 0.5, the rest 0.2. Under loss_type="dapo" the
    # normaliser is num_items_in_batch, fixed for the batch, so the loss is a sum over rows and must
    # equal TRL's own loss on the A > 0 rows at epsilon_high=0.5 plus TRL's on the others at 0.2.
    trainer = _trainer(policy, tmp_path, eps_high_max=0.5, importance_sampling_level=level)
    inputs = _inputs_with_stale_policy(trainer, seed=1)
    pos = inputs["advantages"] > 0
    inputs["gapo_eps_high"] = torch.where(pos, 0.5, 0.2)
    ours = trainer._compute_loss(trainer.model, inputs)
    assert trainer._metrics["train"]["gapo/clipfrac_pos_at_eps_low"][-1] > 0  # headroom matters here

    def trl_loss(idx, eps_high):
        trainer.epsilon_high = eps_high
        try:
            return GRPOTrainer._compute_loss(trainer, trainer.model, _rows(inputs, idx))
        finally:
            trainer.epsilon_high = 0.2

    ref = trl_loss(pos, 0.5) + trl_loss(~pos, 0.2)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7)
    fixed = GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
    assert ours < fixed  # the released positive tokens lower the loss (−A·ρ with ρ above 1.2)


def test_clip_stats_by_c_hand_computed(policy, tmp_path):
    # Two groups of G = 4, two response tokens each (row 3 has one), old log-probs 0 so ρ = exp(logp).
    trainer = _trainer(policy, tmp_path)
    trainer.model.train()
    third = 0.2 + 0.08 / 3  # ε_high of a correct rollout when c = 3: w = (4 − 3)/3
    ratio = torch.tensor(
        [
            [1.25, 1.30],
            [0.70, 1.00],
            [1.00, 1.00],
            [0.90, 5.00],  # c = 1, rewards [1, 0, 0, 0]
            [1.25, 1.10],
            [1.00, 1.00],
            [1.21, 1.23],
            [0.50, 1.50],  # c = 3, rewards [1, 1, 1, 0]
        ]
    )
    inputs = {
        "completion_mask": torch.tensor([[1, 1]] * 3 + [[1, 0]] + [[1, 1]] * 4),
        "old_per_token_logps": torch.zeros(8, 2),
        "advantages": torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75]),  # Dr.GRPO
        "gapo_eps_high": torch.tensor([0.28, 0.2, 0.2, 0.2, third, third, third, 0.2]),
        "gapo_success_count": torch.tensor([1, 1, 1, 1, 3, 3, 3, 3]),
    }
    trainer._log_gapo_metrics(inputs, ratio.log())
    stats = trainer.gapo_clip_stats()
    expected = {
        # c = 1: A > 0 tokens 1.25, 1.30 vs 1.28 → 1 of 2 clipped; A < 0 tokens 0.70, 1.00, 1.00, 1.00,
        # 0.90 (the masked 5.00 is ignored) vs 0.8 → 1 of 5; |ρ−1| (.25+.30+.30+0+0+0+.10)/7 = .95/7
        "clip/frac_high_by_c/1": 1 / 2,
        "clip/frac_low_by_c/1": 1 / 5,
        "clip/ratio_dev_by_c/1": 0.95 / 7,
        "clip/eps_high_by_c/1": (0.28 + 3 * 0.2) / 4,
        "clip/eps_high_pos_by_c/1": 0.28,
        "clip/adv_by_c/1": (0.75 + 3 * 0.25) / 4,
        "clip/tokens_pos_by_c/1": 2.0,
        # c = 3: A > 0 tokens 1.25, 1.10, 1.00, 1.00, 1.21, 1.23 vs 1.226667 → 1.25, 1.23 clipped (2 of 6);
        # A < 0 tokens 0.50, 1.50 vs 0.8 → 1 of 2; |ρ−1| (.25+.10+0+0+.21+.23+.50+.50)/8 = 1.79/8
        "clip/frac_high_by_c/3": 2 / 6,
        "clip/frac_low_by_c/3": 1 / 2,
        "clip/ratio_dev_by_c/3": 1.79 / 8,
        "clip/eps_high_by_c/3": (3 * third + 0.2) / 4,
        "clip/eps_high_pos_by_c/3": third,
        "clip/adv_by_c/3": (3 * 0.25 + 0.75) / 4,
        "clip/tokens_pos_by_c/3": 6.0,
        # positive-advantage tokens alone: c = 1 (.25+.30)/2, A = 0.75; c = 3 (.25+.10+0+0+.21+.23)/6, A = 0.25
        "clip/ratio_dev_pos_by_c/1": 0.55 / 2,
        "clip/adv_pos_by_c/1": 0.75,
        "clip/ratio_dev_pos_by_c/3": 0.79 / 6,
        "clip/adv_pos_by_c/3": 0.25,
        # the gate of a hard clip: 1 − the clipped share of positive-advantage tokens
        "clip/gate_by_c/1": 1 / 2,
        "clip/gate_by_c/3": 4 / 6,
    }
    assert stats.keys() == expected.keys()
    for k, v in expected.items():
        assert stats[k] == pytest.approx(v, abs=1e-6), k
    # the paper's ratio-advantage pairs read TRL's logged keys as they read gapo's own
    from gapo.core.metrics import ratio_adv_pairs

    pairs = sorted(ratio_adv_pairs(stats), key=lambda p: p[1])
    assert pairs == [(pytest.approx(0.79 / 6), 0.25), (pytest.approx(0.55 / 2), 0.75)]
    # the whole-batch metrics come from the same sums: 3 of 8 A > 0 tokens above their ε_high, 5 above 1.2
    m = trainer._metrics["train"]
    assert m["gapo/clipfrac_pos"][-1] == pytest.approx(3 / 8)
    assert m["gapo/clipfrac_pos_at_eps_low"][-1] == pytest.approx(5 / 8)
    assert m["gapo/eps_high_pos_mean"][-1] == pytest.approx((0.28 + 3 * third) / 4)

    # log() hands the pooled values to TRL's logging and starts a new window
    trainer.log({})
    logged = trainer.state.log_history[-1]
    for k, v in expected.items():
        assert logged[k] == pytest.approx(v, abs=1e-6), k
    assert trainer.gapo_clip_stats() == {}


def test_clip_stats_by_c_pooled_over_micro_batches_match_gapo_trainer(policy, tmp_path):
    # Two micro-batches through GAPO's _compute_loss pool to what gapo's own trainer computes on the
    # whole batch (token-level log_ratio + clip_stats_by_c, as in gapo.rl.trainer.Trainer.train_step).
    from gapo.core.metrics import clip_stats_by_c
    from gapo.core.surrogate import log_ratio

    trainer = _trainer(policy, tmp_path, eps_high_max=0.5)
    inputs = _inputs_with_stale_policy(trainer, seed=2)
    for idx in (slice(0, 7), slice(7, 16)):  # uneven halves: groups are split across micro-batches
        trainer._compute_loss(trainer.model, _rows(inputs, idx))
    pooled = trainer.gapo_clip_stats()
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        logp = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, trainer.model, ids, am, inputs["completion_ids"].size(1)
        )[0]
    mask = inputs["completion_mask"].float()
    ratio = torch.exp(log_ratio(logp, inputs["old_per_token_logps"], mask, "token"))
    ref = clip_stats_by_c(
        ratio, inputs["advantages"], mask, inputs["gapo_success_count"], eps_low=0.2, eps_high=inputs["gapo_eps_high"]
    )
    assert pooled.keys() == ref.keys() and any(k.startswith("clip/frac_high_by_c/") for k in ref)
    for k in ref:
        assert pooled[k] == pytest.approx(ref[k], rel=1e-5, abs=1e-6), k
    # the success counts are those of the completions' group rewards, under the default reward_range="group"
    from gapo.core.advantages import success_count

    texts = trainer.processing_class.batch_decode(inputs["completion_ids"], skip_special_tokens=True)
    c = success_count(torch.tensor(frac_a(texts)), 4, reward_range="group")
    assert torch.equal(inputs["gapo_success_count"], c)


def has_a(completions, **kwargs):
    """Binary reward: 1 if the completion contains an 'a'."""
    return [float("a" in c) for c in completions]


def test_training_logs_clip_stats_by_c(policy, tmp_path):
    # Binary rewards: every positive-advantage completion of a group with c successes has
    # ε_high = 0.2 + 0.08·(G − c)/(G − 1), so the logged clip/eps_high_pos_by_c/{c} is exactly that.
    path, tok = policy
    trainer = GAPOTrainer(
        model=path,
        reward_funcs=has_a,
        args=_config(tmp_path, max_steps=2),
        train_dataset=_dataset(),
        processing_class=tok,
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    seen = set()
    for h in logs:
        for key, v in h.items():
            if key.startswith("clip/eps_high_pos_by_c/"):
                c = int(key.rsplit("/", 1)[1])
                seen.add(c)
                assert 1 <= c <= 3 and v == pytest.approx(0.2 + 0.08 * (4 - c) / 3, abs=1e-6)
                assert 0.0 <= h[f"clip/frac_high_by_c/{c}"] <= 1.0
            if key.startswith("clip/ratio_dev_by_c/"):
                assert math.isfinite(v) and v >= 0.0
    assert seen, "no mixed group: no positive-advantage completion"


def test_rejects_bad_config(tmp_path):
    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    for loss_type, why in (("sapo", "soft sigmoid gate"), ("vespo", "gamma function")):
        with pytest.raises(ValueError, match=f"loss_type must be one of .*{why}"):
            GAPOConfig(loss_type=loss_type, **common)
    with pytest.raises(ValueError, match="eps_high_max"):
        GAPOConfig(epsilon=0.2, eps_high_max=0.1, **common)
    with pytest.raises(ValueError, match="epsilon_high"):
        GAPOConfig(epsilon_high=0.28, **common)
    with pytest.raises(ValueError, match=r"epsilon=4, eps_high_max=4 \(every cap 5\)"):  # TRL's cispo cap 5.0
        GAPOConfig(loss_type="cispo", epsilon_high=5.0, **common)
    with pytest.raises(ValueError, match=r"\[0, 1\), got 4.0 \(only loss_type='cispo'"):
        GAPOConfig(loss_type="dapo", epsilon=4.0, eps_high_max=4.0, **common)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="epsilon must be finite and >= 0"):
            GAPOConfig(loss_type="cispo", epsilon=bad, eps_high_max=6.0, **common)
    with pytest.raises(ValueError, match="eps_schedule"):
        GAPOConfig(eps_schedule="cosine", **common)
    with pytest.raises(TypeError, match="GAPOConfig.gapo_schedule is now eps_schedule"):  # 0.2's name
        GAPOConfig(gapo_schedule="log", **common)
    with pytest.raises(ValueError, match="Did you mean 'group'"):
        GAPOConfig(reward_range="grup", **common)
    with pytest.raises(ValueError, match="R_max > R_min"):
        GAPOConfig(reward_range=[1.0, 1.0], **common)
    cfg = GAPOConfig(**common)
    cfg.loss_type = "sapo"  # changed after construction: the trainer checks again
    with pytest.raises(ValueError, match="loss_type"):
        GAPOTrainer(model="unused", reward_funcs=frac_a, args=cfg)


def test_unsupported_trl_version_is_an_import_error(monkeypatch):
    import importlib
    import sys

    import trl

    monkeypatch.delitem(sys.modules, "gapo.integrations.trl")
    # "unknown" (no distribution metadata) and a non-string are unsupported too, not a ValueError/TypeError
    for version in ("1.17.0", "unknown", None):
        monkeypatch.setattr(trl, "__version__", version)
        with pytest.raises(ImportError, match=rf"trl>=1.16,<1.17.*found trl {version}"):
            importlib.import_module("gapo.integrations.trl")
    monkeypatch.undo()
    importlib.import_module("gapo.integrations.trl")


# --- issue 12: eval groups of one, on-policy warning, widths vs ratio level ------------------------
def test_eval_with_one_generation_per_prompt_runs(policy, tmp_path):
    # num_generations_eval=1: no group, so ε_high = ε_low for every completion, c = 0, and no per-c
    # metrics; the eval loop (generation, rewards, _compute_loss) must run as it does in GRPOTrainer.
    path, tok = policy
    args = _config(
        tmp_path, max_steps=1, num_generations_eval=1, per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=1
    )
    trainer = GAPOTrainer(
        model=path,
        reward_funcs=frac_a,
        args=args,
        train_dataset=_dataset(),
        eval_dataset=_dataset(4),
        processing_class=tok,
    )
    assert trainer.compute_eps_high(torch.tensor([1.0, 0.0, 0.5]), 1).tolist() == pytest.approx([0.2] * 3)
    assert trainer.success_count(torch.tensor([1.0, 0.0, 0.5]), 1).tolist() == [0, 0, 0]
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert evals, trainer.state.log_history
    assert evals[-1]["eval_gapo/eps_high_mean"] == pytest.approx(0.2)
    assert not [k for k in evals[-1] if "_by_c/" in k]
    # training (groups of 4) still logs them
    assert any(k.startswith("clip/eps_high_by_c/") for h in trainer.state.log_history for k in h)


def _gapo_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, GAPOWarning)]


def test_warns_once_when_every_ratio_is_one(policy, tmp_path):
    path, tok = policy
    # TRL's defaults: num_iterations=1, steps_per_generation = gradient_accumulation_steps → ratio ≡ 1
    with pytest.warns(GAPOWarning) as record:
        GAPOTrainer(
            model=path,
            reward_funcs=frac_a,
            train_dataset=_dataset(),
            processing_class=tok,
            args=_config(tmp_path, num_iterations=1, steps_per_generation=None, gradient_accumulation_steps=2),
        )
    msgs = _gapo_warnings(record)
    assert len(msgs) == 1
    assert (
        "exactly 1" in msgs[0]
        and "num_iterations > 1" in msgs[0]
        and "steps_per_generation > gradient_accumulation_steps" in msgs[0]
    )
    # reuse of the generation batch (either way), or eps_high_max == epsilon (GRPO on purpose): no warning
    for kw in (
        dict(num_iterations=2, steps_per_generation=1),
        dict(num_iterations=1, steps_per_generation=4),
        dict(num_iterations=1, steps_per_generation=1, eps_high_max=0.2),
    ):
        import warnings

        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            GAPOTrainer(
                model=path,
                reward_funcs=frac_a,
                train_dataset=_dataset(),
                processing_class=tok,
                args=_config(tmp_path, **kw),
            )
        assert not _gapo_warnings(rec), (kw, _gapo_warnings(rec))


def test_widths_are_checked_against_the_ratio_level(policy, tmp_path):
    path, tok = policy
    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    # a GSPO run that left eps_high_max at its token-level default 0.28: an error with the paper's widths
    with pytest.raises(ValueError, match=r"sequence-level width.*0\.003.*0\.005") as err:
        GAPOConfig(importance_sampling_level="sequence", epsilon=3e-4, **common)
    assert "epsilon=0.2, eps_high_max=0.28" in str(err.value)
    with pytest.raises(ValueError, match="sequence-level width"):  # the same mix at token level
        GAPOConfig(epsilon=3e-3, eps_high_max=0.28, **common)
    # consistent widths of the other level: a loud warning naming the paper's values
    for kw, match in (
        (dict(importance_sampling_level="sequence"), "rarely leaves"),
        (dict(importance_sampling_level="token", epsilon=3e-3, eps_high_max=5e-3), "almost every token"),
    ):
        with pytest.warns(GAPOWarning, match=match) as record:
            GAPOTrainer(
                model=path,
                reward_funcs=frac_a,
                train_dataset=_dataset(),
                processing_class=tok,
                args=_config(tmp_path, **kw),
            )
        assert "epsilon=0.003, eps_high_max=0.005" in _gapo_warnings(record)[0]
    # the paper's GSPO widths at sequence level: no warning
    import warnings

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        GAPOTrainer(
            model=path,
            reward_funcs=frac_a,
            train_dataset=_dataset(),
            processing_class=tok,
            args=_config(
                tmp_path, importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-3, eps_high_max=5e-3
            ),
        )
    assert not _gapo_warnings(rec)


# --- issue 12: reward ranges ------------------------------------------------------------------------
def reward_model_score(completions, **kwargs):
    """A reward-model-like score on an arbitrary scale: 10 · frac_a − 3, in [−3, 7]."""
    return [10 * r - 3 for r in frac_a(completions)]


def test_default_group_range_takes_rewards_of_any_scale(policy, tmp_path):
    # The default reward_range="group" is invariant to an affine map of the rewards, so a reward model's
    # scores give the widths of their [0, 1] version, and training runs where [0, 1] would raise.
    path, tok = policy
    trainer = GAPOTrainer(
        model=path,
        reward_funcs=reward_model_score,
        args=_config(tmp_path, max_steps=2),
        train_dataset=_dataset(),
        processing_class=tok,
    )
    assert trainer.args.reward_range == "group"
    g = torch.Generator().manual_seed(0)
    r = torch.rand(16, generator=g)
    torch.testing.assert_close(
        trainer.compute_eps_high(10 * r - 3, 4), trainer.compute_eps_high(r, 4), rtol=0, atol=1e-6
    )
    # [5, NaN, 3, 3]: the NaN becomes the mean of the others, 11/3; span 2 → w(5) = (4/3)·(4/3)/2 = 8/9;
    # it counts as a failure (its group's lowest reward, 3): c = 1
    eps = trainer.compute_eps_high(torch.tensor([5.0, float("nan"), 3.0, 3.0]), 4)
    torch.testing.assert_close(eps, torch.tensor([0.2 + 0.08 * 8 / 9, 0.2, 0.2, 0.2]), rtol=0, atol=1e-6)
    assert trainer.success_count(torch.tensor([5.0, float("nan"), 3.0, 3.0]), 4).tolist() == [1] * 4
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(0.2 - 1e-6 <= h["gapo/eps_high_mean"] <= 0.28 + 1e-6 for h in logs)

    trainer.args.reward_range = [0.0, 1.0]  # the same scores against a fixed [0, 1]: a clear error
    with pytest.raises(ValueError, match="outside reward_range.*'group'"):
        trainer.compute_eps_high(10 * r - 3, 4)


def test_batch_range_hand_computed(policy, tmp_path):
    trainer = _trainer(policy, tmp_path, reward_range="batch")
    # batch min −1, max 3 (span 4). Group [3, −1, −1, −1]: mean 0, w(3) = 3·(4/3)/4 = 1 → 0.28.
    # Group [1, 1, 0, 0]: mean .5, w(1) = .5·(4/3)/4 = 1/6 → 0.2 + 0.08/6. An all-unscorable group: ε_low, c = 0.
    rewards = torch.tensor([3.0, -1, -1, -1, 1, 1, 0, 0] + [float("nan")] * 4)
    eps = trainer.compute_eps_high(rewards, 4)
    torch.testing.assert_close(
        eps, torch.tensor([0.28, 0.2, 0.2, 0.2] + [0.2 + 0.08 / 6] * 2 + [0.2] * 6), rtol=0, atol=1e-6
    )
    # c = round(Σ (R − min_B)/(max_B − min_B)): 1 + 0 + 0 + 0 = 1; .5 + .5 + .25 + .25 = 1.5 → 2;
    # the unscorable group counts as failures at the batch's lowest reward: 0
    assert trainer.success_count(rewards, 4).tolist() == [1] * 4 + [2] * 4 + [0] * 4


def test_reward_range_from_the_command_line(tmp_path):
    from transformers import HfArgumentParser

    parser = HfArgumentParser(GAPOConfig)
    for argv, expected in (
        (["--reward_range", "batch"], "batch"),
        (["--reward_range", "-1", "1"], [-1.0, 1.0]),
        ([], "group"),
    ):
        (cfg,) = parser.parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--use_cpu", "true", "--report_to", "none", *argv]
        )
        assert cfg.reward_range == expected


# --- issue 12: CISPO and Liger ----------------------------------------------------------------------
def test_cispo_caps_the_is_weight_per_rollout_like_gapo_cispo_loss(policy, tmp_path):
    # TRL's cispo: L = −sg(min(ρ, cap))·A·logp; GAPO's cap of completion i is 1 + ε_high(i). gapo's own
    # cispo_loss clips at 1 − ε_low below too; with ε_low → 1 that bound is out of reach (ρ > 1e-6 here),
    # so the two must give the same loss and gradients for per-row ε_high.
    from gapo.core.losses import cispo_loss
    from gapo.core.surrogate import ClipBounds

    trainer = _trainer(policy, tmp_path, loss_type="cispo", eps_high_max=0.5)
    inputs = _inputs_with_stale_policy(trainer, seed=3)
    g = torch.Generator().manual_seed(3)
    inputs["gapo_eps_high"] = 0.2 + 0.3 * torch.rand(16, generator=g)  # a different cap on every row
    ours, g_ours = _loss_and_grads(trainer._compute_loss, trainer, inputs)

    def gapo_ref(model, x):
        ids = torch.cat([x["prompt_ids"], x["completion_ids"]], 1)
        am = torch.cat([x["prompt_mask"], x["completion_mask"]], 1)
        logp = GRPOTrainer._get_per_token_logps_and_entropies(trainer, model, ids, am, x["completion_ids"].size(1))[0]
        mask = x["completion_mask"].float()
        loss, _ = cispo_loss(
            logp,
            x["old_per_token_logps"],
            x["advantages"],
            mask,
            bounds=ClipBounds(1 - 1e-6, x["gapo_eps_high"]),
            agg="token-mean",
        )
        # TRL's cispo normaliser: num_items_in_batch / processes · grad-accum / steps_per_generation (1 · 1 / 2)
        normaliser = x["num_items_in_batch"].float() * trainer.current_gradient_accumulation_steps / 2
        return loss * mask.sum() / normaliser

    ref, g_ref = _loss_and_grads(gapo_ref, trainer, inputs)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-7)
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    # TRL's cispo_clip_ratio counts A > 0 tokens above each row's own cap 1 + ε_high(i)
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        logp = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, trainer.model, ids, am, ids.size(1) - inputs["prompt_ids"].size(1)
        )[0]
    ratio = torch.exp(logp - inputs["old_per_token_logps"])
    mask = inputs["completion_mask"].bool()
    capped = (ratio > 1 + inputs["gapo_eps_high"].unsqueeze(1)) & (inputs["advantages"] > 0).unsqueeze(1) & mask
    assert trainer._metrics["train"]["cispo_clip_ratio"][-1] == pytest.approx(capped.sum().item() / mask.sum().item())
    assert capped.any()  # the per-row caps bind on this batch
    # with every cap at 1 + epsilon, the loss is TRL's own cispo at epsilon_high = 1 + epsilon
    inputs["gapo_eps_high"] = torch.full((16,), 0.2)
    fixed, _ = _loss_and_grads(trainer._compute_loss, trainer, inputs)
    trainer.epsilon_high = 1.2
    try:
        trl_fixed, _ = _loss_and_grads(lambda m, x: GRPOTrainer._compute_loss(trainer, m, x), trainer, inputs)
    finally:
        trainer.epsilon_high = 0.2
    assert torch.equal(fixed, trl_fixed) and not torch.allclose(fixed, ours)


def test_cispo_epsilon_is_trl_cap_minus_one_on_every_row_with_no_headroom(policy, tmp_path):
    # TRL's cispo caps every row's IS weight at epsilon_high = E (ScaleRL: 5.0). GAPO caps row i at
    # 1 + ε_high(i): 1 + epsilon where A ≤ 0, 1 + eps_high_max for a lone success. So E = 5 is
    # epsilon = eps_high_max = 4 (TRL's loss exactly), and GAPO on top keeps epsilon = 4.
    trainer = _trainer(policy, tmp_path, loss_type="cispo", epsilon=4.0, eps_high_max=4.0)
    inputs = _inputs_with_stale_policy(trainer, seed=5)
    inputs["old_per_token_logps"][::2] -= 2.0  # ratios e^2 ≈ 7.4 on even rows: TRL's cap 5 binds
    assert torch.equal(inputs["gapo_eps_high"], torch.full((16,), 4.0))  # from the trainer's own rewards

    def trl(x, cap):
        trainer.epsilon_high = cap
        try:
            return _loss_and_grads(lambda m, y: GRPOTrainer._compute_loss(trainer, m, y), trainer, x)
        finally:
            trainer.epsilon_high = 4.0

    ours, g_ours = _loss_and_grads(trainer._compute_loss, trainer, inputs)
    ref, g_ref = trl(inputs, 5.0)
    assert torch.equal(ours, ref) and all(torch.equal(a, b) for a, b in zip(g_ours, g_ref))
    assert trainer._metrics["train"]["cispo_clip_ratio"][-1] > 0  # the cap binds
    assert not torch.equal(trl(inputs, 7.0)[0], ref)  # ... so the cap's value shows in the loss
    # GAPO on top of TRL's cap: ε_high from the schedule, 4 where A ≤ 0 (TRL's 5) and 6 (cap 7) for
    # the lone success; the loss is TRL's at 5 on the A ≤ 0 rows plus TRL's at 7 on the others
    trainer.args.eps_high_max = 6.0
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    eps = trainer.compute_eps_high(rewards, 4)
    torch.testing.assert_close(eps, torch.tensor([6.0, 4, 4, 4, 4 + 4 / 3, 4 + 4 / 3, 4, 4] + [4.0] * 8))
    pos = inputs["advantages"] > 0
    inputs["gapo_eps_high"] = torch.where(pos, 6.0, 4.0)
    ours = trainer._compute_loss(trainer.model, inputs).detach()
    torch.testing.assert_close(ours, trl(_rows(inputs, pos), 7.0)[0] + trl(_rows(inputs, ~pos), 5.0)[0])


def test_liger_kernel_leaves_the_loss_to_the_adapter(policy, tmp_path, monkeypatch):
    # trl 1.16 applies Liger's layer kernels only (it forces liger_kernel_config fused_linear_cross_entropy
    # =False and rejects True), so the loss is still GRPOTrainer._compute_loss, i.e. GAPO's. liger-kernel
    # (Triton, GPU) cannot run here: transformers' apply_liger_kernel is replaced by a recorder, and the
    # test checks that training then applies GAPO's per-rollout bound exactly as without Liger.
    import transformers.trainer as hf_trainer

    calls = []
    monkeypatch.setattr(hf_trainer, "apply_liger_kernel", lambda model, cfg: calls.append(dict(cfg or {})))
    path, tok = policy
    trainer = GAPOTrainer(
        model=path,
        reward_funcs=has_a,
        args=_config(tmp_path, max_steps=2, use_liger_kernel=True),
        train_dataset=_dataset(),
        processing_class=tok,
    )
    trainer.train()
    assert calls == [{"fused_linear_cross_entropy": False}]
    logs = [h for h in trainer.state.log_history if "loss" in h]
    seen = [
        (int(k.rsplit("/", 1)[1]), v) for h in logs for k, v in h.items() if k.startswith("clip/eps_high_pos_by_c/")
    ]
    assert seen and all(v == pytest.approx(0.2 + 0.08 * (4 - c) / 3, abs=1e-6) for c, v in seen)
    # Liger's fused cross-entropy would replace the forward: TRL refuses it
    with pytest.raises(ValueError, match="fused_linear_cross_entropy"):
        GAPOTrainer(
            model=path,
            reward_funcs=has_a,
            train_dataset=_dataset(),
            processing_class=tok,
            args=_config(tmp_path, use_liger_kernel=True, liger_kernel_config={"fused_linear_cross_entropy": True}),
        )


def test_quick_start_block_of_the_docs_builds_without_gapo_warnings(tmp_path, monkeypatch):
    # docs/scale-out.md, TRL "Quick start": the block a user copies. Run it with the trainer lines left
    # out (no hub here); both configurations must be valid and pass every GAPO check without a warning.
    import re
    import warnings
    from pathlib import Path

    from gapo.integrations.trl import _width_warnings

    text = (Path(__file__).resolve().parents[2] / "docs" / "scale-out.md").read_text()
    section = text.split("### Quick start: the configuration to copy", 1)[1].split("\n### ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    assert "from gapo.integrations.trl import GAPOConfig, GAPOTrainer" in block
    code = "\n".join(ln for ln in block.splitlines() if not ln.startswith(("trainer", "from gapo.integrations")))
    monkeypatch.chdir(tmp_path)
    # the block is written for GPUs (TRL's default bf16=True): the same configurations on CPU here
    scope: dict = {"GAPOConfig": lambda **kw: GAPOConfig(**kw, use_cpu=True, bf16=False)}
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        exec(compile(code, "scale-out.md", "exec"), scope)
    assert not _gapo_warnings(rec)
    for name, level in (("args", "token"), ("gspo_args", "sequence")):
        cfg = scope[name]
        assert isinstance(cfg, GAPOConfig) and cfg.importance_sampling_level == level
        assert _width_warnings(cfg) == [], name
        assert cfg.steps_per_generation > cfg.gradient_accumulation_steps  # the reuse that makes clipping matter
    assert (scope["gspo_args"].epsilon, scope["gspo_args"].eps_high_max) == (3e-3, 5e-3)
    assert scope["args"].reward_range == "group"
    assert scope["correct"](["2+2=4"], [4]) == [1.0]
