"""Sampler parity: greedy equals ``model.generate``, log-probs equal a full forward pass."""

import pytest
import torch

from gapo.policy.model import build_model, build_tokenizer
from gapo.policy.sampling import left_pad, logprobs, sample

torch.set_num_threads(1)

ALPHABET = "0123456789+-*/()= ,\n:"
EOS, PAD = 2, 0


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(ALPHABET)


@pytest.fixture(scope="module")
def model(tok):
    m = build_model(len(tok), "micro", seed=0).eval()
    with torch.no_grad():  # make EOS a frequent argmax so that rows stop at different lengths
        m.lm_head.weight[EOS] *= 6.0
    return m


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok(s).input_ids for s in ["12+3=", "4,5,6:", "7", "1 2 3 4 5 6 7 8", "9*9", "(1+2)*3="]]


def _full_logp(model, r, temperature=1.0):
    # Reference: one plain forward pass over prompt ++ completion, full (B, L, V) log-softmax.
    ids, mask = r.input_ids, r.attention_mask
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float() / temperature
    T = r.completion_ids.shape[1]
    lp = torch.log_softmax(logits[:, -T - 1 : -1], -1)
    return lp.gather(-1, r.completion_ids[..., None])[..., 0] * r.response_mask


def test_greedy_equals_generate(model, prompts):
    r = sample(model, prompts, max_new_tokens=24, temperature=0, eos_token_id=EOS, pad_token_id=PAD)
    ids, mask = left_pad(prompts, pad_token_id=PAD)
    g = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24, eos_token_id=EOS, pad_token_id=PAD
    )[:, ids.shape[1] :]
    T = r.completion_ids.shape[1]
    assert torch.equal(r.completion_ids, g[:, :T])
    assert (g[:, T:] == PAD).all()
    lengths = r.lengths.tolist()
    assert min(lengths) < max(lengths), "the test model should stop rows at different lengths"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logp_equals_full_forward(model, prompts, temperature):
    gen = torch.Generator().manual_seed(1)
    r = sample(model, prompts * 4, max_new_tokens=30, temperature=temperature, eos_token_id=EOS, generator=gen)
    with torch.no_grad():
        ref = _full_logp(model, r, temperature)
        lp, _ = logprobs(model, r.input_ids, r.attention_mask, r.completion_ids.shape[1], temperature=temperature)
    assert torch.allclose(r.logp, ref, atol=1e-5, rtol=0)
    assert torch.allclose(lp * r.response_mask, ref, atol=1e-5, rtol=0)


def test_eos_handling(model, prompts):
    gen = torch.Generator().manual_seed(2)
    N = 20
    r = sample(model, prompts * 8, max_new_tokens=N, eos_token_id=EOS, pad_token_id=PAD, generator=gen)
    stopped = 0
    for ids, m, lp in zip(r.completion_ids.tolist(), r.response_mask.tolist(), r.logp.tolist()):
        n = sum(m)
        assert m == [1] * n + [0] * (len(m) - n)  # contiguous response
        assert all(i == PAD for i in ids[n:]) and all(x == 0.0 for x in lp[n:])
        if EOS in ids[:n]:
            assert ids.index(EOS) == n - 1  # EOS is the last response token, included in the mask
            stopped += 1
        else:
            assert n == N
    assert 0 < stopped < len(r.lengths)
    assert r.completion_ids.shape[1] == max(r.lengths.tolist())


def test_no_eos_runs_to_max(model, prompts):
    r = sample(model, prompts, max_new_tokens=7, eos_token_id=None, generator=torch.Generator().manual_seed(0))
    assert r.completion_ids.shape == (len(prompts), 7) and r.response_mask.all()


def test_tiny_top_p_equals_greedy(model, prompts):
    g = sample(model, prompts, max_new_tokens=16, temperature=0, eos_token_id=EOS)
    s = sample(model, prompts, max_new_tokens=16, top_p=1e-6, eos_token_id=EOS, generator=torch.Generator().manual_seed(3))
    assert torch.equal(g.completion_ids, s.completion_ids)
    assert torch.allclose(g.logp, s.logp, atol=1e-6)


def test_top_p_samples_only_from_nucleus(model, tok):
    # One step from one prompt, many rows: every drawn token lies in the smallest top-p prefix.
    p = tok("12+").input_ids
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([p])).logits[0, -1].float(), -1)
    sp, si = probs.sort(descending=True)
    k = int(((sp.cumsum(0) - sp) < 0.5).sum())
    nucleus = set(si[:k].tolist())
    r = sample(model, [p] * 400, max_new_tokens=1, top_p=0.5, generator=torch.Generator().manual_seed(4))
    assert set(r.completion_ids[:, 0].tolist()) <= nucleus


def test_sampling_follows_the_distribution(model, tok):
    p = tok("4,5,6:").input_ids
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([p])).logits[0, -1].float() / 0.8, -1)
    n = 4000
    r = sample(model, [p] * n, max_new_tokens=1, temperature=0.8, generator=torch.Generator().manual_seed(5))
    freq = torch.bincount(r.completion_ids[:, 0], minlength=probs.numel()).float() / n
    assert (freq - probs).abs().max() < 0.035  # ~4.5 sigma at p = 0.5


def test_seeded_determinism(model, prompts):
    a = sample(model, prompts, max_new_tokens=16, eos_token_id=EOS, generator=torch.Generator().manual_seed(7))
    b = sample(model, prompts, max_new_tokens=16, eos_token_id=EOS, generator=torch.Generator().manual_seed(7))
    c = sample(model, prompts, max_new_tokens=16, eos_token_id=EOS, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logp, b.logp)
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_left_padding_batch_equals_one_by_one(model, prompts):
    batch = sample(model, prompts, max_new_tokens=20, temperature=0, eos_token_id=EOS)
    for i, p in enumerate(prompts):
        one = sample(model, [p], max_new_tokens=20, temperature=0, eos_token_id=EOS)
        n = int(one.lengths[0])
        assert int(batch.lengths[i]) == n
        assert torch.equal(batch.completion_ids[i, :n], one.completion_ids[0, :n])
        assert torch.allclose(batch.logp[i, :n], one.logp[0, :n], atol=1e-5)


def test_tensor_prompts_and_compaction_off(model, prompts):
    ids, mask = left_pad(prompts)
    a = sample(model, ids, mask, max_new_tokens=20, temperature=0, eos_token_id=EOS)
    b = sample(model, prompts, max_new_tokens=20, temperature=0, eos_token_id=EOS, compact=False)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.allclose(a.logp, b.logp, atol=1e-5)
    with pytest.raises(ValueError, match="left-padded"):
        sample(model, ids.flip(1), mask.flip(1), max_new_tokens=2)


def test_chunked_logprobs_equal_unchunked_with_grads(model, prompts):
    r = sample(model, prompts * 2, max_new_tokens=20, eos_token_id=EOS, generator=torch.Generator().manual_seed(9))
    T = r.completion_ids.shape[1]
    m = r.response_mask.float()
    results = []
    for chunk in (None, 3):
        model.zero_grad()
        lp, ent = logprobs(model, r.input_ids, r.attention_mask, T, chunk_size=chunk)
        ((lp * m).sum() + (ent * m).sum()).backward()
        results.append((lp.detach(), ent.detach(), model.lm_head.weight.grad.clone()))
    model.zero_grad()
    (lp0, e0, g0), (lp1, e1, g1) = results
    assert torch.allclose(lp0 * m, lp1 * m, atol=1e-6)
    assert torch.allclose(e0 * m, e1 * m, atol=1e-6)
    assert torch.allclose(g0, g1, atol=1e-5)
    # entropy against the definition on the full (B, T, V) distribution
    with torch.no_grad():
        pos = (r.attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=r.input_ids, attention_mask=r.attention_mask, position_ids=pos).logits[:, -T - 1 : -1]
        ref = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    assert torch.allclose(e0 * m, ref * m, atol=1e-5)


def _qwen2_gqa(vocab):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)  # q/k/v biases, 2 key-value heads for 4 query heads (GQA)
    m = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                     tie_word_embeddings=False)).float().eval()
    with torch.no_grad():
        m.lm_head.weight[EOS] *= 6.0
        for layer in m.model.layers:
            layer.self_attn.k_proj.bias.normal_()
    return m


@pytest.mark.parametrize("arch", ["llama", "qwen2-gqa"])
def test_fast_decoder_equals_model_forward(model, tok, prompts, arch):
    # the fast KV-cached decoder must reproduce model.forward's decoding: same tokens, same logp
    from gapo.policy.sampling import _FastLM

    m = model if arch == "llama" else _qwen2_gqa(len(tok))
    assert _FastLM.build(m) is not None
    for temperature in (0, 0.8):
        a, b = (sample(m, prompts * 3, max_new_tokens=24, temperature=temperature, eos_token_id=EOS, fast=fast,
                       generator=torch.Generator().manual_seed(11)) for fast in (True, False))
        assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.response_mask, b.response_mask)
        assert torch.allclose(a.logp, b.logp, atol=1e-6, rtol=0)
        if temperature:
            assert torch.allclose(a.logp, _full_logp(m, a, temperature), atol=1e-5, rtol=0)


def test_fast_decoder_declines_hooked_models(model):
    from gapo.policy.sampling import _FastLM

    h = model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    try:
        assert _FastLM.build(model) is None
    finally:
        h.remove()
    assert _FastLM.build(model) is not None


@pytest.mark.parametrize("arch", ["llama", "qwen2-gqa"])
def test_fast_logprobs_equal_model_forward_with_grads(model, tok, prompts, arch):
    # shared-prompt forward (each distinct prompt once, G copies) == model.model on every row,
    # values and gradients; prompts of different lengths (left padding), rows stopped early
    m = model if arch == "llama" else _qwen2_gqa(len(tok))
    r = sample(m, prompts * 4, max_new_tokens=20, eos_token_id=EOS, generator=torch.Generator().manual_seed(12))
    assert r.lengths.min() < r.lengths.max()
    T = r.completion_ids.shape[1]
    mk = r.response_mask.float()
    out = []
    for fast in (True, False):
        m.zero_grad()
        lp, ent = logprobs(m, r.input_ids, r.attention_mask, T, temperature=0.9, fast=fast)
        ((lp * mk).sum() + 0.1 * (ent * mk).sum()).backward()
        out.append((lp.detach() * mk, ent.detach() * mk, [p.grad.clone() for p in m.parameters()]))
    m.zero_grad()
    (lp0, e0, g0), (lp1, e1, g1) = out
    assert torch.allclose(lp0, lp1, atol=1e-5, rtol=0) and torch.allclose(e0, e1, atol=1e-5, rtol=0)
    for a, b in zip(g0, g1):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # and against the plain full forward of the model
        assert torch.allclose(logprobs(m, r.input_ids, r.attention_mask, T)[0] * mk, _full_logp(m, r), atol=1e-5)


@pytest.mark.parametrize("arch,chunks", [("llama", {}), ("qwen2-gqa", {}),
                                         ("llama", {"chunk_size": 3, "max_saved_bytes": 0})])
def test_packed_completion_forward_equals_padded(model, tok, prompts, arch, chunks, monkeypatch):
    # packing the live completion positions (the decoder's _FastLM._packed and logprobs' head)
    # changes no live value: log-probs and entropies bit for bit (to the last bit with tiny
    # checkpointed head chunks), gradients up to float summation order; a row that stopped at its first
    # token (no live input position) and the padding stay finite, the padding comes back as 0
    from gapo.policy import fast_lm

    m = model if arch == "llama" else _qwen2_gqa(len(tok))
    r = sample(m, prompts * 4, max_new_tokens=20, eos_token_id=EOS, generator=torch.Generator().manual_seed(14))
    ids, attn, mk = r.input_ids.clone(), r.attention_mask.clone(), r.response_mask.clone()
    P = r.prompt_ids.shape[1]
    ids[0, P + 1 :], attn[0, P + 1 :], mk[0, 1:] = PAD, 0, 0  # row 0: one response token only
    T, mk = r.completion_ids.shape[1], mk.float()
    live = attn[:, P:-1].float().mean()
    assert 0 < live < fast_lm.PACK_BELOW, live  # the default takes the packed path here
    out = []
    for pack_below in (1.0, 0.0):  # always pack, never pack
        monkeypatch.setattr(fast_lm, "PACK_BELOW", pack_below)
        m.zero_grad()
        lp, ent = logprobs(m, ids, attn, T, temperature=0.9, **chunks)
        assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
        if pack_below:
            assert not lp[mk == 0].any() and not ent[mk == 0].any()
        ((lp * mk).sum() + 0.1 * (ent * mk).sum()).backward()
        out.append((lp.detach() * mk, ent.detach() * mk, [p.grad.clone() for p in m.parameters()]))
    m.zero_grad()
    (lp0, e0, g0), (lp1, e1, g1) = out
    if chunks:  # 3-position head chunks: products of 3 rows, for which MKL may pick another kernel
        assert torch.allclose(lp0, lp1, atol=1e-6, rtol=0) and torch.allclose(e0, e1, atol=1e-6, rtol=0)
    else:
        assert torch.equal(lp0, lp1) and torch.equal(e0, e1)
    for a, b in zip(g0, g1):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_entropy_grad_false_detaches_entropy_only(model, prompts):
    r = sample(model, prompts * 2, max_new_tokens=20, eos_token_id=EOS, generator=torch.Generator().manual_seed(13))
    T, m = r.completion_ids.shape[1], r.response_mask.float()
    grads = []
    for entropy_grad in (True, False):
        model.zero_grad()
        lp, ent = logprobs(model, r.input_ids, r.attention_mask, T, chunk_size=3, entropy_grad=entropy_grad)
        assert ent.requires_grad == entropy_grad
        (lp * m).sum().backward()
        grads.append((lp.detach(), ent.detach(), model.lm_head.weight.grad.clone()))
    model.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_checkpointed_chunks_equal_kept_chunks(model, prompts):
    # max_saved_bytes decides only whether chunks are recomputed in backward: same values, same gradients
    r = sample(model, prompts * 2, max_new_tokens=20, eos_token_id=EOS, generator=torch.Generator().manual_seed(5))
    T, m = r.completion_ids.shape[1], r.response_mask.float()
    out = []
    for saved in (2**30, 0):
        model.zero_grad()
        lp, ent = logprobs(model, r.input_ids, r.attention_mask, T, chunk_size=3, max_saved_bytes=saved)
        ((lp * m).sum() + (ent * m).sum()).backward()
        out.append((lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]))
    model.zero_grad()
    (lp0, e0, g0), (lp1, e1, g1) = out
    assert torch.equal(lp0, lp1) and torch.equal(e0, e1)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))


def test_kept_logits_budget_counts_the_entropy_softmax(model, prompts, monkeypatch):
    # with entropy gradients backward keeps each chunk's softmax too, so the budget counts the
    # logits twice: a budget between 1x and 2x of the logits keeps them without, checkpoints with
    from gapo.policy import sampling

    r = sample(model, prompts * 2, max_new_tokens=20, eos_token_id=EOS, generator=torch.Generator().manual_seed(6))
    B, T, V = r.completion_ids.shape[0], r.completion_ids.shape[1], model.config.vocab_size
    live = int(r.response_mask.sum())  # the head runs on the packed live positions: one row of them
    calls = []
    real = sampling.checkpoint
    monkeypatch.setattr(sampling, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    for entropy_grad, checkpointed in ((False, False), (True, True)):
        calls.clear()
        logprobs(model, r.input_ids, r.attention_mask, T, chunk_size=3, max_saved_bytes=6 * live * V,
                 entropy_grad=entropy_grad)
        assert bool(calls) == checkpointed, (entropy_grad, len(calls), B)


def test_fast_decoder_under_gradient_checkpointing(tok, prompts):
    # transformers' gradient_checkpointing_enable registers an input-grad hook on the embedding:
    # sampling (eval mode) keeps the fast decoder, with model.forward's tokens and log-probs;
    # the training forward still declines it (it does not checkpoint)
    from gapo.policy.sampling import _FastLM

    m = build_model(len(tok), "micro", seed=0)
    with torch.no_grad():
        m.lm_head.weight[EOS] *= 6.0
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert m.model.embed_tokens._forward_hooks  # the hook this is about
    m.train()
    assert _FastLM.build(m) is None
    m.eval()
    assert _FastLM.build(m) is not None
    h = m.model.layers[0].mlp.register_forward_hook(lambda *a: None)  # any other hook still declines
    assert _FastLM.build(m) is None
    h.remove()
    a, b = (sample(m, prompts * 2, max_new_tokens=16, temperature=0.8, eos_token_id=EOS, fast=fast,
                   generator=torch.Generator().manual_seed(21)) for fast in (True, False))
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.allclose(a.logp, b.logp, atol=1e-6, rtol=0)
