"""Top-k, min-p and the repetition penalty: ``filtered_logits`` equals transformers' processors in
``generate``'s order, the two decoders draw the same tokens with them, greedy decoding is the
argmax of the penalised logits (``generate``'s), ``logp`` stays the unfiltered policy's, and the
``sampling.*`` keys reach the rollouts."""

import dataclasses
import math

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from gapo.policy.model import build_model, build_tokenizer
from gapo.policy.sampling import DecodeOptions, SamplingParams, filtered_logits, left_pad, sample

torch.set_num_threads(1)

EOS, PAD = 2, 0
V = 50


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer("0123456789+-*/()= ,\n:")


@pytest.fixture(scope="module")
def model(tok):
    m = build_model(len(tok), "micro", seed=0).eval()
    with torch.no_grad():  # a frequent EOS: rows stop at different lengths, and compaction runs
        m.lm_head.weight[EOS] *= 6.0
    return m


@pytest.fixture(scope="module")
def greedy_model(tok):
    m = build_model(len(tok), "micro", seed=0).eval()
    with torch.no_grad():  # greedy rows end at different lengths, most after several tokens
        m.lm_head.weight[EOS] *= 2.0
    return m


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok(s).input_ids for s in ["12+3=", "4,5,6:", "7", "1 2 3 4 5 6 7 8", "9*9", "(1+2)*3="]]


# ------------------------------------------------------------------ parity with transformers
def _hf(logits, params: SamplingParams, input_ids=None):
    """transformers' processors for ``params``, built as ``GenerationMixin._get_logits_processor``
    builds them: the repetition penalty, then (sampling) temperature, top-k, top-p, min-p."""
    procs = LogitsProcessorList()
    if params.repetition_penalty != 1:
        procs.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.temperature > 0:
        if params.temperature != 1:
            procs.append(TemperatureLogitsWarper(float(params.temperature)))
        if params.top_k:
            procs.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1:
            procs.append(TopPLogitsWarper(params.top_p))
        if params.min_p:
            procs.append(MinPLogitsWarper(params.min_p))
    ids = torch.zeros((logits.shape[0], 1), dtype=torch.long) if input_ids is None else input_ids
    return procs(ids, logits.clone())


def _seen(input_ids, vocab=V):
    return torch.zeros((input_ids.shape[0], vocab), dtype=torch.bool).scatter_(1, input_ids, True)


def _same(ours, ref):
    assert torch.equal(torch.isinf(ours), torch.isinf(ref)), "a different set of tokens is filtered"
    keep = ~torch.isinf(ref)
    assert torch.allclose(ours[keep], ref[keep], atol=1e-6, rtol=1e-6)


def _logits(seed, B=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((B, V), generator=g) * 3


@pytest.mark.parametrize("top_k", [1, 3, 17, V, V + 30])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_top_k_equals_transformers(top_k, temperature):
    for seed in range(5):
        x = _logits(seed)
        p = SamplingParams(4, temperature=temperature, top_k=top_k)
        _same(filtered_logits(x, p), _hf(x, p))
    kept = (~torch.isinf(filtered_logits(_logits(0), SamplingParams(4, top_k=top_k)))).sum(-1)
    assert (kept == min(top_k, V)).all()


def test_top_k_keeps_every_token_tied_with_the_kth():
    x = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, -1.0], [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]])
    p = SamplingParams(4, top_k=2)
    out = filtered_logits(x, p)
    _same(out, _hf(x, p))
    assert (~torch.isinf(out)).sum(-1).tolist() == [4, 6]  # 3.0 and the three 2.0s; all six ties


@pytest.mark.parametrize("min_p", [0.02, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 1.7])
def test_min_p_equals_transformers(min_p, temperature):
    for seed in range(5):
        x = _logits(seed)
        p = SamplingParams(4, temperature=temperature, min_p=min_p)
        _same(filtered_logits(x, p), _hf(x, p))


def test_min_p_one_keeps_the_top_tokens_and_their_ties():
    x = torch.tensor([[1.0, 4.0, 4.0, 3.9], [2.0, 0.0, -1.0, 1.0]])
    p = SamplingParams(4, min_p=1.0)
    out = filtered_logits(x, p)
    _same(out, _hf(x, p))
    assert (~torch.isinf(out)).tolist() == [[False, True, True, False], [True, False, False, False]]


@pytest.mark.parametrize("penalty", [0.5, 0.9, 1.3, 2.0])
def test_repetition_penalty_equals_transformers(penalty):
    # negative, zero and positive logits; ids repeated in a row (penalised once, as transformers)
    x = _logits(7)
    x[:, :4] = torch.tensor([-2.0, 0.0, 1.5, -0.25])
    ids = torch.tensor([[0, 1, 2, 3, 2, 2, 9], [3, 3, 3, 3, 3, 3, 3], [10, 0, 10, 0, 45, 1, 49], [5, 6, 7, 8, 9, 1, 2]])
    p = SamplingParams(4, temperature=0.8, repetition_penalty=penalty)
    out = filtered_logits(x, p, _seen(ids))
    _same(out, _hf(x, p, ids))
    assert torch.allclose(out[1, 3], x[1, 3] / 0.8 * penalty)  # negative logit: multiplied by θ
    assert torch.allclose(out[0, 2], x[0, 2] / penalty / 0.8)  # positive: divided by θ, once
    assert torch.equal(out[1, :3], x[1, :3] / 0.8)  # ids not seen: untouched
    # greedy: the penalised raw logits (transformers applies the penalty without do_sample too)
    greedy = dataclasses.replace(p, temperature=0)
    _same(filtered_logits(x, greedy, _seen(ids)), _hf(x, greedy, ids))


@pytest.mark.parametrize("seed", range(6))
def test_all_filters_together_equal_transformers_chain(seed):
    g = torch.Generator().manual_seed(100 + seed)
    x = _logits(seed, B=6)
    ids = torch.randint(0, V, (6, 12), generator=g)
    p = SamplingParams(
        4,
        temperature=[0.5, 0.9, 1.3][seed % 3],
        top_p=[0.95, 0.7, 1.0][seed % 3],
        top_k=[5, 20, 0][seed % 3] + seed,
        min_p=[0.0, 0.05, 0.2][(seed + 1) % 3],
        repetition_penalty=[1.2, 0.8][seed % 2],
    )
    _same(filtered_logits(x, p, _seen(ids)), _hf(x, p, ids))


def test_filters_off_and_greedy_leave_the_logits_alone():
    x = _logits(3)
    assert torch.equal(filtered_logits(x, SamplingParams(4)), x)
    assert torch.equal(filtered_logits(x, SamplingParams(4, temperature=0, top_k=1, top_p=0.1, min_p=1)), x)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_pick_draws_by_the_inverse_cdf(top_p):
    # one uniform per row from the generator, then the first index whose running mass (float64)
    # exceeds u times the row's mass: computed here by hand, token by token
    from gapo.policy.sampling import _pick

    x, params = _logits(4, B=8), SamplingParams(4, temperature=0.7, top_p=top_p)
    tok, lp = _pick(x, params, torch.Generator().manual_seed(9))
    probs = torch.softmax(filtered_logits(x, params), -1) if top_p < 1 else torch.log_softmax(x / 0.7, -1).exp()
    u = torch.rand(8, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    want = []
    for b in range(8):
        row = probs[b].double().tolist()
        target, acc = float(u[b]) * math.fsum(row), 0.0
        want.append(next(v for v, p in enumerate(row) if (acc := acc + p) > target))
    assert tok.tolist() == want
    assert torch.equal(lp, torch.log_softmax(x / 0.7, -1).gather(-1, tok[:, None])[:, 0])


def test_draw_frequencies_match_the_probabilities():
    # 200000 draws from one row with zeros among the weights, a rare token (1e-3) and an
    # unnormalised sum: zero weights never come, and Pearson's chi-square over the rest stays
    # below its 0.999 quantile (df = 4: 18.47)
    from gapo.policy.sampling import _draw

    w = torch.tensor([0.0, 0.2, 0.0, 0.499, 0.3, 0.0, 0.001, 0.0]) * 3
    n = 200_000
    counts = torch.bincount(_draw(w.expand(n, -1), torch.Generator().manual_seed(4)), minlength=8).double()
    assert counts[w == 0].sum() == 0
    expected = n * w.double() / w.double().sum()
    live = w > 0
    chi2 = float((((counts - expected) ** 2)[live] / expected[live]).sum())
    assert chi2 < 18.47, (chi2, counts.tolist())


def test_draw_never_lands_past_the_mass(monkeypatch):
    # u as close to 1 as float64 allows: u times the sum may round up to the sum itself, and the
    # draw must still return the last index with weight, not a zero-weight one after it
    from gapo.policy.sampling import _draw

    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.full(a[0], 1 - 2**-53, dtype=torch.float64))
    w = torch.tensor([[0.1, 0.7, 0.3, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0]])
    assert _draw(w).tolist() == [2, 2]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_draw_refuses_broken_probabilities(bad):
    from gapo.policy.sampling import _draw

    with pytest.raises(RuntimeError, match="NaN, infinite or all zero"):
        _draw(torch.tensor([[0.5, 0.5], [0.5, bad]]))
    with pytest.raises(RuntimeError, match="NaN, infinite or all zero"):
        _draw(torch.zeros(2, 3))


# ------------------------------------------------------------------ sample()
def _qwen2(vocab):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    m = Qwen2ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        m.lm_head.weight[EOS] *= 6.0
    return m


def _full_logp(model, r, temperature):
    ids, mask = r.input_ids, r.attention_mask
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    T = r.completion_ids.shape[1]
    lp = torch.log_softmax(logits[:, -T - 1 : -1] / temperature, -1)
    return lp.gather(-1, r.completion_ids[..., None])[..., 0] * r.response_mask


FILTERS = [
    dict(top_k=4),
    dict(min_p=0.15),
    dict(repetition_penalty=1.4),
    dict(repetition_penalty=0.7),
    dict(top_k=6, top_p=0.9, min_p=0.05, repetition_penalty=1.2),
]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("filters", FILTERS)
def test_fast_and_hf_decoders_draw_the_same_tokens(model, tok, prompts, arch, filters):
    m = model if arch == "llama" else _qwen2(len(tok))
    p = SamplingParams(20, temperature=0.9, eos_token_id=EOS, **filters)
    a, b = (
        sample(m, prompts * 3, params=p, generator=torch.Generator().manual_seed(5), options=DecodeOptions(fast=f))
        for f in (True, False)
    )
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.allclose(a.logp, b.logp, atol=1e-6, rtol=0)
    # logp is the unfiltered, unpenalised policy's at the temperature (what logprobs recomputes)
    assert torch.allclose(a.logp, _full_logp(m, a, 0.9), atol=1e-5, rtol=0)
    lengths = a.lengths.tolist()
    assert min(lengths) < max(lengths)  # rows finished at different steps: compaction ran


@pytest.mark.parametrize("filters", [dict(top_k=1), dict(top_k=3, min_p=0.5), dict(min_p=1.0), dict(top_p=0.1)])
def test_greedy_ignores_top_k_and_min_p(model, prompts, filters):
    plain, filtered = (
        sample(model, prompts, params=SamplingParams(16, temperature=0, eos_token_id=EOS, **f)) for f in ({}, filters)
    )
    assert torch.equal(plain.completion_ids, filtered.completion_ids)
    assert torch.equal(plain.logp, filtered.logp)


@pytest.mark.parametrize("penalty", [1.5, 0.6])
def test_greedy_with_a_penalty_equals_generate(greedy_model, tok, penalty):
    model = greedy_model
    # equal-length prompts: generate's input_ids then hold no padding (which it would penalise)
    prompts = [tok(s).input_ids for s in ["12+3=", "4,5,6", "(7*7)", "99-1=", "8 8 8"]]
    p = SamplingParams(24, temperature=0, eos_token_id=EOS, repetition_penalty=penalty)
    ids, mask = left_pad(prompts, pad_token_id=PAD)
    g = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=24,
        repetition_penalty=penalty,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )[:, ids.shape[1] :]
    for fast in (True, False):
        r = sample(model, prompts, params=p, pad_token_id=PAD, options=DecodeOptions(fast=fast))
        T = r.completion_ids.shape[1]
        assert torch.equal(r.completion_ids, g[:, :T]) and (g[:, T:] == PAD).all()
    plain = sample(model, prompts, params=dataclasses.replace(p, repetition_penalty=1.0), pad_token_id=PAD)
    assert not torch.equal(plain.completion_ids, r.completion_ids), "the penalty should change the greedy text"
    assert r.lengths.float().mean() > 4  # rows long enough for repeats to matter


@pytest.mark.parametrize("fast", [True, False])
def test_the_seen_ids_follow_compaction_and_skip_padding(greedy_model, prompts, fast):
    model = greedy_model
    # greedy decoding draws no random numbers: compacting rows, and padding prompts to one
    # width, must not change a row's text; the pad id is made the most penalised token
    greedy = sample(model, prompts, params=SamplingParams(20, temperature=0, eos_token_id=EOS))
    pad = int(torch.mode(greedy.completion_ids[greedy.response_mask.bool()]).values)
    p = SamplingParams(20, temperature=0, eos_token_id=EOS, repetition_penalty=1.6)
    runs = [
        sample(model, prompts, params=p, pad_token_id=pad, options=DecodeOptions(compact=c, fast=fast, check_every=1))
        for c in (True, False)
    ]
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    for i, prompt in enumerate(prompts):
        alone = sample(model, [prompt], params=p, pad_token_id=pad, options=DecodeOptions(fast=fast))
        n = int(alone.lengths[0])
        assert runs[0].completion_ids[i, :n].tolist() == alone.completion_ids[0, :n].tolist(), i
        assert int(runs[0].lengths[i]) == n


@pytest.mark.parametrize("penalty", [1.0, 1.5])
def test_top_k_one_draws_the_penalised_argmax(model, prompts, penalty):
    kw = dict(eos_token_id=EOS, repetition_penalty=penalty)
    greedy = sample(model, prompts, params=SamplingParams(20, temperature=0, **kw))
    top1 = sample(
        model, prompts, params=SamplingParams(20, temperature=1.3, top_k=1, **kw), generator=torch.Generator()
    )
    assert torch.equal(top1.completion_ids, greedy.completion_ids)
    assert torch.allclose(top1.logp, _full_logp(model, top1, 1.3), atol=1e-5, rtol=0)


def _first_token_logits(model, tok):
    ids = torch.tensor([tok("12+3=").input_ids])
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -1].float(), ids


@pytest.mark.parametrize("filters", [dict(top_k=3), dict(min_p=0.2), dict(repetition_penalty=3.0, top_k=4)])
def test_first_tokens_follow_the_filtered_distribution(model, tok, filters):
    logits, ids = _first_token_logits(model, tok)
    p = SamplingParams(1, temperature=0.8, **filters)
    want = torch.softmax(filtered_logits(logits[None], p, _seen(ids, logits.shape[-1]))[0], -1)
    n = 6000
    r = sample(model, ids.repeat(n, 1), params=p, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(r.completion_ids[:, 0], minlength=len(want)).float() / n
    assert (freq[want == 0] == 0).all(), "a filtered token was drawn"
    assert (want > 0).sum() >= 2 and (want < 1).all()  # the test needs a real choice
    assert (freq - want).abs().max() < 4 * math.sqrt(0.25 / n)  # 4 standard errors at most


# ------------------------------------------------------------------ validation and the config
@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_k=True), "top_k"),
        (dict(min_p=-0.1), "min_p"),
        (dict(min_p=1.5), "min_p"),
        (dict(min_p=float("nan")), "min_p"),
        (dict(min_p="0.1"), "min_p"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(repetition_penalty=-1.2), "repetition_penalty"),
        (dict(repetition_penalty=float("inf")), "repetition_penalty"),
        (dict(repetition_penalty=None), "repetition_penalty"),
    ],
)
def test_bad_filter_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        SamplingParams(4, **kwargs)


def test_filter_defaults_are_off_and_ints_are_kept():
    np = pytest.importorskip("numpy")
    p = SamplingParams(4)
    assert (p.top_k, p.min_p, p.repetition_penalty, p.filtered) == (0, 0.0, 1.0, False)
    q = SamplingParams(4, top_k=np.int64(5), min_p=1, repetition_penalty=np.float32(1.1))
    assert type(q.top_k) is int and q.filtered


def test_config_keys_are_listed_and_checked(capsys):
    from gapo.cli import main
    from gapo.rl.config import load_config

    main(["config", "sampling"])
    out = capsys.readouterr().out
    for key in ("sampling.top_k: int = 0", "sampling.min_p: float = 0.0", "sampling.repetition_penalty: float = 1.0"):
        assert key in out
    for bad, key in [("top_k=-1", "top_k"), ("min_p=1.5", "min_p"), ("repetition_penalty=0", "repetition_penalty")]:
        with pytest.raises(ValueError, match=rf"^sampling\.{key}"):
            load_config(None, [f"sampling.{bad}"])
    cfg = load_config(None, ["sampling.top_k=7", "sampling.min_p=0.1", "sampling.repetition_penalty=1.1"])
    assert (cfg.sampling.top_k, cfg.sampling.min_p, cfg.sampling.repetition_penalty) == (7, 0.1, 1.1)


def test_the_trainer_samples_with_every_sampling_key_and_evaluation_with_none(tmp_path, monkeypatch):
    from gapo import tasks
    from gapo.policy.model import save_policy
    from gapo.rl import trainer as trainer_mod
    from gapo.rl.config import load_config
    from gapo.rl.evaluate import eval_params

    task = tasks.get("countdown", n_numbers=2, num_range=(1, 10))
    tok = build_tokenizer(task.alphabet)
    save_policy(build_model(len(tok), "micro", seed=0), tok, tmp_path / "policy")
    filters = ["sampling.top_k=7", "sampling.min_p=0.1", "sampling.repetition_penalty=1.1", "sampling.top_p=0.9"]
    cfg = load_config(
        None,
        [
            f"model.path={tmp_path / 'policy'}",
            "task.name=countdown",
            "task.params.n_numbers=2",
            "task.params.num_range=[1,10]",
            "task.train_size=20",
            "eval.problems=4",
            "train.prompts=2",
            "train.group_size=2",
            "train.progress=false",
            "sampling.max_new_tokens=5",
            *filters,
        ],
    )
    seen, real = [], trainer_mod.sample
    monkeypatch.setattr(trainer_mod, "sample", lambda *a, **kw: seen.append(kw["params"]) or real(*a, **kw))
    tr = trainer_mod.Trainer(cfg, tmp_path / "run")
    try:
        ro = tr._sample(tr.pool[:2])
    finally:
        tr.folder.release()
    assert ro.completion_ids.shape[0] == 4
    p = seen[-1]
    assert (p.top_k, p.min_p, p.repetition_penalty, p.top_p, p.max_new_tokens) == (7, 0.1, 1.1, 0.9, 5)
    assert eval_params(cfg, 5) == SamplingParams(5)  # evaluation: eval.temperature/top_p, nothing of these
