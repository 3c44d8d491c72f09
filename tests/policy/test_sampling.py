"""Sampler parity: greedy equals ``model.generate``, log-probs equal a full forward pass."""

import pytest
import torch

from gapo.policy.logprobs import HeadMemory, logprobs
from gapo.policy.model import build_model, build_tokenizer
from gapo.policy.sampling import DecodeOptions, SamplingParams, left_pad, sample

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
    r = sample(
        model, prompts, params=SamplingParams(max_new_tokens=24, temperature=0, eos_token_id=EOS), pad_token_id=PAD
    )
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
    r = sample(
        model,
        prompts * 4,
        params=SamplingParams(max_new_tokens=30, temperature=temperature, eos_token_id=EOS),
        generator=gen,
    )
    with torch.no_grad():
        ref = _full_logp(model, r, temperature)
        lp, _ = logprobs(model, r.input_ids, r.attention_mask, r.completion_ids.shape[1], temperature=temperature)
    assert torch.allclose(r.logp, ref, atol=1e-5, rtol=0)
    assert torch.allclose(lp * r.response_mask, ref, atol=1e-5, rtol=0)


def test_eos_handling(model, prompts):
    gen = torch.Generator().manual_seed(2)
    N = 20
    r = sample(
        model, prompts * 8, params=SamplingParams(max_new_tokens=N, eos_token_id=EOS), pad_token_id=PAD, generator=gen
    )
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
    r = sample(
        model,
        prompts,
        params=SamplingParams(max_new_tokens=7, eos_token_id=None),
        generator=torch.Generator().manual_seed(0),
    )
    assert r.completion_ids.shape == (len(prompts), 7) and r.response_mask.all()


def test_tiny_top_p_equals_greedy(model, prompts):
    g = sample(model, prompts, params=SamplingParams(max_new_tokens=16, temperature=0, eos_token_id=EOS))
    s = sample(
        model,
        prompts,
        params=SamplingParams(max_new_tokens=16, top_p=1e-6, eos_token_id=EOS),
        generator=torch.Generator().manual_seed(3),
    )
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
    r = sample(
        model, [p] * 400, params=SamplingParams(max_new_tokens=1, top_p=0.5), generator=torch.Generator().manual_seed(4)
    )
    assert set(r.completion_ids[:, 0].tolist()) <= nucleus


def test_sampling_follows_the_distribution(model, tok):
    p = tok("4,5,6:").input_ids
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([p])).logits[0, -1].float() / 0.8, -1)
    n = 4000
    r = sample(
        model,
        [p] * n,
        params=SamplingParams(max_new_tokens=1, temperature=0.8),
        generator=torch.Generator().manual_seed(5),
    )
    freq = torch.bincount(r.completion_ids[:, 0], minlength=probs.numel()).float() / n
    assert (freq - probs).abs().max() < 0.035  # ~4.5 sigma at p = 0.5


def test_seeded_determinism(model, prompts):
    a = sample(
        model,
        prompts,
        params=SamplingParams(max_new_tokens=16, eos_token_id=EOS),
        generator=torch.Generator().manual_seed(7),
    )
    b = sample(
        model,
        prompts,
        params=SamplingParams(max_new_tokens=16, eos_token_id=EOS),
        generator=torch.Generator().manual_seed(7),
    )
    c = sample(
        model,
        prompts,
        params=SamplingParams(max_new_tokens=16, eos_token_id=EOS),
        generator=torch.Generator().manual_seed(8),
    )
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logp, b.logp)
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_left_padding_batch_equals_one_by_one(model, prompts):
    batch = sample(model, prompts, params=SamplingParams(max_new_tokens=20, temperature=0, eos_token_id=EOS))
    for i, p in enumerate(prompts):
        one = sample(model, [p], params=SamplingParams(max_new_tokens=20, temperature=0, eos_token_id=EOS))
        n = int(one.lengths[0])
        assert int(batch.lengths[i]) == n
        assert torch.equal(batch.completion_ids[i, :n], one.completion_ids[0, :n])
        assert torch.allclose(batch.logp[i, :n], one.logp[0, :n], atol=1e-5)


def test_tensor_prompts_and_compaction_off(model, prompts):
    ids, mask = left_pad(prompts)
    a = sample(model, ids, mask, SamplingParams(max_new_tokens=20, temperature=0, eos_token_id=EOS))
    b = sample(
        model,
        prompts,
        params=SamplingParams(max_new_tokens=20, temperature=0, eos_token_id=EOS),
        options=DecodeOptions(compact=False),
    )
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.allclose(a.logp, b.logp, atol=1e-5)
    with pytest.raises(ValueError, match="left-padded"):
        sample(model, ids.flip(1), mask.flip(1), SamplingParams(max_new_tokens=2))


def test_chunked_logprobs_equal_unchunked_with_grads(model, prompts):
    r = sample(
        model,
        prompts * 2,
        params=SamplingParams(max_new_tokens=20, eos_token_id=EOS),
        generator=torch.Generator().manual_seed(9),
    )
    T = r.completion_ids.shape[1]
    m = r.response_mask.float()
    results = []
    for chunk in (None, 3):
        model.zero_grad()
        lp, ent = logprobs(model, r.input_ids, r.attention_mask, T, memory=HeadMemory(chunk_size=chunk))
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
    m = (
        Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=vocab,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=128,
                tie_word_embeddings=False,
            )
        )
        .float()
        .eval()
    )
    with torch.no_grad():
        m.lm_head.weight[EOS] *= 6.0
        for layer in m.model.layers:
            layer.self_attn.k_proj.bias.normal_()
    return m


@pytest.mark.parametrize("arch", ["llama", "qwen2-gqa"])
def test_fast_decoder_equals_model_forward(model, tok, prompts, arch):
    # the fast KV-cached decoder must reproduce model.forward's decoding: same tokens, same logp
    from gapo.policy.sampling import FastLM

    m = model if arch == "llama" else _qwen2_gqa(len(tok))
    assert FastLM.build(m) is not None
    for temperature in (0, 0.8):
        a, b = (
            sample(
                m,
                prompts * 3,
                params=SamplingParams(max_new_tokens=24, temperature=temperature, eos_token_id=EOS),
                generator=torch.Generator().manual_seed(11),
                options=DecodeOptions(fast=fast),
            )
            for fast in (True, False)
        )
        assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.response_mask, b.response_mask)
        assert torch.allclose(a.logp, b.logp, atol=1e-6, rtol=0)
        if temperature:
            assert torch.allclose(a.logp, _full_logp(m, a, temperature), atol=1e-5, rtol=0)


def test_fast_decoder_declines_hooked_models(model):
    from gapo.policy.sampling import FastLM

    h = model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    try:
        assert FastLM.build(model) is None
    finally:
        h.remove()
    assert FastLM.build(model) is not None


@pytest.mark.parametrize("arch", ["llama", "qwen2-gqa"])
def test_fast_logprobs_equal_model_forward_with_grads(model, tok, prompts, arch):
    # shared-prompt forward (each distinct prompt once, G copies) == model.model on every row,
    # values and gradients; prompts of different lengths (left padding), rows stopped early
    m = model if arch == "llama" else _qwen2_gqa(len(tok))
    r = sample(
        m,
        prompts * 4,
        params=SamplingParams(max_new_tokens=20, eos_token_id=EOS),
        generator=torch.Generator().manual_seed(12),
    )
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


@pytest.mark.parametrize(
    "arch,chunks", [("llama", {}), ("qwen2-gqa", {}), ("llama", {"chunk_size": 3, "max_saved_bytes": 0})]
)
def test_packed_completion_forward_equals_padded(model, tok, prompts, arch, chunks, monkeypatch):
    # packing the live completion positions (the decoder's FastLM._packed and logprobs' head)
    # changes no live value: log-probs and entropies bit for bit (to the last bit with tiny
    # checkpointed head chunks), gradients up to float summation order; a row that stopped at its first
    # token (no live input position) and the padding stay finite, the padding comes back as 0
    from gapo.policy import fast_lm

    m = model if arch == "llama" else _qwen2_gqa(len(tok))
    r = sample(
        m,
        prompts * 4,
        params=SamplingParams(max_new_tokens=20, eos_token_id=EOS),
        generator=torch.Generator().manual_seed(14),
    )
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
        lp, ent = logprobs(m, ids, attn, T, temperature=0.9, memory=HeadMemory(**chunks))
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
    r = sample(
        model,
        prompts * 2,
        params=SamplingParams(max_new_tokens=20, eos_token_id=EOS),
        generator=torch.Generator().manual_seed(13),
    )
    T, m = r.completion_ids.shape[1], r.response_mask.float()
    grads = []
    for entropy_grad in (True, False):
        model.zero_grad()
        lp, ent = logprobs(
            model, r.input_ids, r.attention_mask, T, entropy_grad=entropy_grad, memory=HeadMemory(chunk_size=3)
        )
        assert ent.requires_grad == entropy_grad
        (lp * m).sum().backward()
        grads.append((lp.detach(), ent.detach(), model.lm_head.weight.grad.clone()))
    model.zero_grad()
    (lp0, e0, g0), (lp1, e1, g1) = grads
    assert torch.equal(lp0, lp1) and torch.equal(e0, e1)
    # with the entropy's gradient autograd sums one weight gradient per chunk; without it the
    # fused head takes one product over all rows (tests/policy/test_fused_head.py): the same
    # gradient up to the rounding of another summation order (entries near 0 cancel)
    torch.testing.assert_close(g0, g1, rtol=1e-5, atol=1e-6 * float(g0.abs().max()))
    assert not torch.equal(g0, torch.zeros_like(g0))


def test_checkpointed_chunks_equal_kept_chunks(model, prompts):
    # max_saved_bytes decides only whether chunks are recomputed in backward: same values, same gradients
    r = sample(
        model,
        prompts * 2,
        params=SamplingParams(max_new_tokens=20, eos_token_id=EOS),
        generator=torch.Generator().manual_seed(5),
    )
    T, m = r.completion_ids.shape[1], r.response_mask.float()
    out = []
    for saved in (2**30, 0):
        model.zero_grad()
        lp, ent = logprobs(
            model, r.input_ids, r.attention_mask, T, memory=HeadMemory(chunk_size=3, max_saved_bytes=saved)
        )
        ((lp * m).sum() + (ent * m).sum()).backward()
        out.append((lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]))
    model.zero_grad()
    (lp0, e0, g0), (lp1, e1, g1) = out
    assert torch.equal(lp0, lp1) and torch.equal(e0, e1)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))


def test_kept_logits_budget_counts_the_entropy_softmax(model, prompts, monkeypatch):
    # with entropy gradients backward keeps each chunk's softmax too, so the budget counts the
    # logits twice: a budget between 1x and 2x of the logits keeps them without, checkpoints with
    from gapo.policy import logprobs as logprobs_mod

    r = sample(
        model,
        prompts * 2,
        params=SamplingParams(max_new_tokens=20, eos_token_id=EOS),
        generator=torch.Generator().manual_seed(6),
    )
    B, T, V = r.completion_ids.shape[0], r.completion_ids.shape[1], model.config.vocab_size
    live = int(r.response_mask.sum())  # the head runs on the packed live positions: one row of them
    calls = []
    real = logprobs_mod.checkpoint
    monkeypatch.setattr(logprobs_mod, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    for entropy_grad, checkpointed in ((False, False), (True, True)):
        calls.clear()
        logprobs(
            model,
            r.input_ids,
            r.attention_mask,
            T,
            entropy_grad=entropy_grad,
            memory=HeadMemory(chunk_size=3, max_saved_bytes=6 * live * V),
        )
        assert bool(calls) == checkpointed, (entropy_grad, len(calls), B)


def test_fast_decoder_under_gradient_checkpointing(tok, prompts):
    # transformers' gradient_checkpointing_enable registers an input-grad hook on the embedding:
    # sampling (eval mode) keeps the fast decoder, with model.forward's tokens and log-probs;
    # the training forward still declines it (it does not checkpoint)
    from gapo.policy.sampling import FastLM

    m = build_model(len(tok), "micro", seed=0)
    with torch.no_grad():
        m.lm_head.weight[EOS] *= 6.0
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert m.model.embed_tokens._forward_hooks  # the hook this is about
    m.train()
    assert FastLM.build(m) is None
    m.eval()
    assert FastLM.build(m) is not None
    h = m.model.layers[0].mlp.register_forward_hook(lambda *a: None)  # any other hook still declines
    assert FastLM.build(m) is None
    h.remove()
    a, b = (
        sample(
            m,
            prompts * 2,
            params=SamplingParams(max_new_tokens=16, temperature=0.8, eos_token_id=EOS),
            generator=torch.Generator().manual_seed(21),
            options=DecodeOptions(fast=fast),
        )
        for fast in (True, False)
    )
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.allclose(a.logp, b.logp, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------------
# Stopping (gapo.policy.sampling's module docstring, gapo.policy.stopping): every stop token of generation_config, and
# stop strings in the decoded text, on a Qwen2.5-base-like layout. The checkpoint is a tiny Qwen2
# with a byte-level BPE tokenizer whose EOS is <|endoftext|> while chat turns end in <|im_end|>,
# and generation_config.json's eos_token_id is [<|im_end|>, <|endoftext|>] (Qwen2.5-Math's layout).
# It is overfit to answer each question below and then run on, as a base model does.

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QA = {  # question -> (gold, what the model writes after the chat prompt)
    "What is 4 + 1?": ("5", "The answer is \\boxed{5}<|im_end|>\\boxed{7 + 6 + 8}\\boxed{3}<|endoftext|>"),
    "What is 5 * 2?": ("10", "5 * 2 = \\boxed{10}\n\nQuestion: 3 + 3 = \\boxed{6}<|im_end|>\\boxed{6}<|endoftext|>"),
    "What is 2 + 2?": ("4", "The answer is \\boxed{4}<|im_end|>\\boxed{9}<|endoftext|>"),  # the eval split
}
EVAL_Q = "What is 2 + 2?"


def _write_math_data(root):
    import json as _json

    rows = {q: {"question": q, "answer": f"#### {gold}"} for q, (gold, _) in QA.items()}
    train, ev = root / "train.jsonl", root / "eval.jsonl"
    train.write_text("".join(_json.dumps(r) + "\n" for q, r in rows.items() if q != EVAL_Q))
    ev.write_text(_json.dumps(rows[EVAL_Q]) + "\n")
    return train, ev


def build_qwen_base(path, data_root, *, steps: int = 150):
    """Save the checkpoint described above to ``path``; returns the math task's params."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from gapo import tasks
    from gapo.policy.chat import PromptEncoder
    from gapo.policy.model import load_policy

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [
        f"{a} + {b} = \\boxed{{{a + b}}}\n\nQuestion: {a} * {b} = {a * b}" for a in range(1, 11) for b in range(1, 11)
    ] + ["system user assistant The answer is What"] * 10
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tk = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials[1:],
    )
    tk.chat_template = CHATML
    eot, im_end = tk.convert_tokens_to_ids("<|endoftext|>"), tk.convert_tokens_to_ids("<|im_end|>")
    cfg = Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=len(tk),
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tk.save_pretrained(path)
    GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot).save_pretrained(path)
    # overfit on the exact prompts the trainer builds (chat template applied)
    model, tok = load_policy(path)
    train, ev = _write_math_data(data_root)
    params = {"path": str(train), "eval_path": str(ev), "template": "{question}"}  # the prompt: the question
    task = tasks.build("math", params)
    enc = PromptEncoder(tok)
    seqs = [
        (enc.ids(p), tok(QA[p.meta["question"]][1], add_special_tokens=False).input_ids)
        for p in task.generate("train", 2, 0)[:2] + task.generate("eval", 1, 0)[:1]
    ]
    assert len({tuple(p) for p, _ in seqs}) == 3
    L = max(len(p) + len(a) for p, a in seqs)
    ids = torch.tensor([[eot] * (L - len(p) - len(a)) + p + a for p, a in seqs])
    att = (torch.arange(L)[None] >= torch.tensor([L - len(p) - len(a) for p, a in seqs])[:, None]).long()
    labels = torch.tensor([[-100] * (L - len(a)) + a for _, a in seqs])
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=att, position_ids=pos, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(path)
    return params


@pytest.fixture(scope="module")
def qwen_base(tmp_path_factory):
    """(path, math task params, model, tokenizer) of the Qwen2.5-base-like checkpoint."""
    pytest.importorskip("math_verify")
    from gapo.policy.model import load_policy

    root = tmp_path_factory.mktemp("qwen-base")
    path = root / "model"
    params = build_qwen_base(path, root)
    model, tok = load_policy(path)
    return path, params, model, tok


def _chat_ids(tok, question):
    from gapo.policy.chat import PromptEncoder
    from gapo.tasks.base import Problem

    return PromptEncoder(tok).ids(Problem(question, None))


def _greedy_text(tok, r, i=0, **kw):
    return tok.decode([t for t, m in zip(r.completion_ids[i].tolist(), r.response_mask[i].tolist()) if m], **kw)


def test_eos_token_ids_reads_generation_config(qwen_base):
    from types import SimpleNamespace as NS

    from gapo.policy.model import eos_token_ids

    _, _, model, tok = qwen_base
    eot, im_end = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id == eot != im_end  # the layout under test: tokenizer EOS != chat end
    assert eos_token_ids(model, tok) == (eot, im_end)  # the tokenizer's EOS first, then generation_config's
    t = NS(eos_token_id=3)
    assert eos_token_ids(NS(generation_config=NS(eos_token_id=5), config=NS(vocab_size=10)), t) == (3, 5)
    assert eos_token_ids(NS(generation_config=NS(eos_token_id=[3, 7, 3]), config=NS(vocab_size=10)), t) == (3, 7)
    # no generation_config: the model config's; ids the model cannot sample are ignored
    assert eos_token_ids(NS(config=NS(eos_token_id=[4, 99], vocab_size=10)), t) == (3, 4)
    assert eos_token_ids(NS(generation_config=NS(eos_token_id=None), config=NS(eos_token_id=None)), t) == (3,)


@pytest.mark.parametrize("fast", [True, False])
def test_sampling_stops_at_every_generation_config_eos(qwen_base, fast):
    from gapo.policy.model import eos_token_ids

    _, _, model, tok = qwen_base
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    qs = list(QA)
    prompts = [_chat_ids(tok, q) for q in qs]
    # the model runs on after the turn's end, as a base model does: the tokenizer's EOS alone
    # lets every row write on to <|endoftext|> or the limit (what sampling did before)
    late = sample(
        model,
        prompts,
        params=SamplingParams(max_new_tokens=40, temperature=0, eos_token_id=tok.eos_token_id),
        options=DecodeOptions(fast=fast),
    )
    assert all("\\boxed{" in t.split("}", 1)[1] for t in late.texts(tok)), late.texts(tok)
    r = sample(
        model,
        prompts,
        params=SamplingParams(max_new_tokens=40, temperature=0, eos_token_id=eos_token_ids(model, tok)),
        options=DecodeOptions(fast=fast),
    )
    for i, q in enumerate(qs):
        answer = QA[q][1].split("<|im_end|>")[0]
        n = int(r.lengths[i])
        assert r.completion_ids[i, n - 1] == im_end  # the stop token is the last token of the response mask
        assert r.response_mask[i].tolist() == [1] * n + [0] * (r.completion_ids.shape[1] - n)
        assert (r.completion_ids[i, n:] == tok.pad_token_id).all() and (r.logp[i, n:] == 0).all()
        assert torch.equal(r.completion_ids[i, :n], late.completion_ids[i, :n])  # the same tokens until then
        assert r.texts(tok)[i] == answer  # the text left for the verifier ends at the answer
    assert r.eos_ids == (tok.eos_token_id, im_end)


def test_a_stop_string_that_is_a_special_token_stops_at_it(qwen_base):
    _, _, model, tok = qwen_base
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    q = "What is 4 + 1?"
    r = sample(
        model,
        [_chat_ids(tok, q)],
        params=SamplingParams(max_new_tokens=40, temperature=0, eos_token_id=tok.eos_token_id, stop=["<|im_end|>"]),
        tokenizer=tok,
    )
    assert r.completion_ids[0, int(r.lengths[0]) - 1] == im_end and im_end in r.eos_ids and r.stop == ()
    assert r.texts(tok) == ["The answer is \\boxed{5}"]


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize(
    "stop,text",
    [
        ("\n\nQuestion:", "5 * 2 = \\boxed{10}"),  # spans four tokens: '\n' '\n' 'Question' ':'
        ("xed{1", "5 * 2 = \\bo"),  # starts inside 'boxed' and ends inside '10'
        ("estio", "5 * 2 = \\boxed{10}\n\nQu"),  # starts and ends inside the one token 'Question'
    ],
)
def test_stop_string_across_tokens_cuts_text_and_mask(qwen_base, fast, stop, text):
    from gapo.policy.model import eos_token_ids

    _, _, model, tok = qwen_base
    prompt = _chat_ids(tok, "What is 5 * 2?")
    eos = eos_token_ids(model, tok)
    free = sample(
        model,
        [prompt],
        params=SamplingParams(max_new_tokens=40, temperature=0, eos_token_id=eos),
        options=DecodeOptions(fast=fast),
    )
    full = _greedy_text(tok, free, skip_special_tokens=True)
    assert full.startswith(text + stop)
    ids = free.completion_ids[0, : int(free.lengths[0])].tolist()
    # the token that completes the stop string: the first prefix whose text contains it
    k = next(j for j in range(1, len(ids) + 1) if stop in tok.decode(ids[:j]))
    r = sample(
        model,
        [prompt],
        params=SamplingParams(max_new_tokens=40, temperature=0, eos_token_id=eos, stop=[stop, "never here"]),
        tokenizer=tok,
        options=DecodeOptions(fast=fast),
    )
    assert int(r.lengths[0]) == k and r.completion_ids.shape[1] == k  # nothing sampled past it
    assert r.completion_ids[0].tolist() == ids[:k]
    assert r.texts(tok) == [text]  # cut before the stop string: it is not part of the text
    assert r.stop == (stop, "never here")


def _first_stop(tok, ids, stops):
    """Brute force: the first j such that the text of ids[:j + 1] contains a stop string, else None."""
    return next(
        (j for j in range(len(ids)) if any(s in tok.decode(ids[: j + 1], skip_special_tokens=True) for s in stops)),
        None,
    )


@pytest.mark.parametrize("fast", [True, False])
def test_sampled_rows_end_at_their_first_stop(qwen_base, fast):
    """At a high temperature rows wander: each ends exactly where the brute-force definition
    (first prefix containing a stop string, or a stop token, or the limit) says."""
    from gapo.policy.model import eos_token_ids

    _, _, model, tok = qwen_base
    eos, N, stops = eos_token_ids(model, tok), 30, ["\n\n", "+ 6", "xed{1"]
    prompts = [_chat_ids(tok, q) for q in QA] * 6
    r = sample(
        model,
        prompts,
        params=SamplingParams(max_new_tokens=N, temperature=1.3, eos_token_id=eos, stop=stops),
        tokenizer=tok,
        generator=torch.Generator().manual_seed(0),
        options=DecodeOptions(fast=fast),
    )
    kinds = set()
    for i in range(len(prompts)):
        n = int(r.lengths[i])
        ids = r.completion_ids[i, :n].tolist()
        j = _first_stop(tok, ids, stops)
        if j is not None:
            assert j == n - 1, (i, ids)  # ended at the token completing the first stop string
            kinds.add("stop")
            text = tok.decode(ids, skip_special_tokens=True)
            cut = min(text.find(s) for s in stops if s in text)
            assert r.texts(tok)[i] == text[:cut]
        elif ids[-1] in eos:
            kinds.add("eos")
        else:
            assert n == N
            kinds.add("limit")
        assert (r.completion_ids[i, n:] == tok.pad_token_id).all() and (r.logp[i, n:] == 0).all()
        assert r.response_mask[i, :n].all() and not r.response_mask[i, n:].any()
    assert {"stop", "eos"} <= kinds, kinds


def test_fast_and_hf_paths_agree_with_stops(qwen_base):
    from gapo.policy.model import eos_token_ids

    _, _, model, tok = qwen_base
    eos, stops = eos_token_ids(model, tok), ["\n\nQ", "+ 6", "ed{1"]
    prompts = [_chat_ids(tok, q) for q in QA] * 5
    runs = {}
    for fast in (True, False):
        for every in (1, 8):  # 8: how often an accelerator checks (and the stop scan runs)
            runs[fast, every] = sample(
                model,
                prompts,
                params=SamplingParams(max_new_tokens=32, temperature=1.5, eos_token_id=eos, stop=stops),
                tokenizer=tok,
                generator=torch.Generator().manual_seed(3),
                options=DecodeOptions(fast=fast, compact=False, check_every=every),
            )
    ref = runs[True, 1]
    assert len(set(ref.lengths.tolist())) > 2
    for key, r in runs.items():
        assert torch.equal(r.completion_ids, ref.completion_ids), key
        assert torch.equal(r.response_mask, ref.response_mask), key
        assert torch.allclose(r.logp, ref.logp, atol=1e-5, rtol=0), key
        assert r.texts(tok) == ref.texts(tok), key
    # compaction (rows leaving the cache) gives both paths the same draws too
    a, b = (
        sample(
            model,
            prompts,
            params=SamplingParams(max_new_tokens=32, temperature=1.5, eos_token_id=eos, stop=stops),
            tokenizer=tok,
            generator=torch.Generator().manual_seed(4),
            options=DecodeOptions(fast=fast),
        )
        for fast in (True, False)
    )
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.response_mask, b.response_mask)


def test_train_and_eval_stop_where_the_model_stops(qwen_base, tmp_path, capsys):
    """``gapo train`` and ``gapo eval`` on the Qwen2.5-base-like checkpoint: rollouts end at the
    chat end token (generation_config's EOS list) and at ``sampling.stop``, and the verifier scores
    the answer, not the boxes written after it (stopping only at the tokenizer's EOS, every
    completion here scores 0: the last box wins)."""
    import json

    from gapo.cli import main

    path, params, _, _ = qwen_base
    args = [
        "--model",
        str(path),
        "--task",
        f"math:{params['path']}",
        f"task.params.eval_path={params['eval_path']}",
        'task.params.template="{question}"',
        "sampling.max_new_tokens=40",
        'sampling.stop=["\\n\\nQuestion:"]',
        "sampling.temperature=0.05",
        "eval.temperature=0.05",
    ]
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--out",
                str(run),
                *args,
                "train.steps=1",
                "train.prompts=2",
                "train.group_size=2",
                "train.mini_batches=1",
                "eval.problems=1",
                "eval.samples=2",
                "eval.every=0",
                "log.samples=4",
                "optim.lr=1e-9",
                "train.progress=false",
            ]
        )
        == 0
    ), capsys.readouterr().err
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    want = {"What is 4 + 1?": "The answer is \\boxed{5}", "What is 5 * 2?": "5 * 2 = \\boxed{10}"}
    assert len(samples) == 4
    for s in samples:
        q = next(q for q in want if q in s["prompt"])
        assert (s["completion"], s["reward"]) == (want[q], 1.0), s
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in recs if r["kind"] == "eval"]
    assert evals and all(r["eval/pass@1"] == 1.0 for r in evals)
    assert all(r["eval/response_len"] == 10 for r in evals)  # "The answer is \boxed{4}<|im_end|>": 10 tokens
    capsys.readouterr()
    # gapo eval stops the same way (the training split holds the stop-string question)
    assert main(["eval", *args, "--split", "train", "--problems", "2", "--n", "2"]) == 0, capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    assert res["eval/pass@1"] == 1.0 and res["eval/problems"] == 2


def test_texts_leave_out_a_stop_token_that_is_not_special(model, tok, prompts):
    """A stop token is left out of the text even when decoding would keep it (an EOS id of
    generation_config that is an ordinary token): here ``=`` of the character tokenizer."""
    eq = tok.convert_tokens_to_ids("=")
    r = sample(
        model,
        prompts * 4,
        params=SamplingParams(max_new_tokens=20, eos_token_id=[EOS, eq]),
        pad_token_id=PAD,
        generator=torch.Generator().manual_seed(21),
    )
    ended = 0
    for i, text in enumerate(r.texts(tok)):
        n = int(r.lengths[i])
        ids = r.completion_ids[i, :n].tolist()
        assert eq not in ids[:-1] and EOS not in ids[:-1]  # the first stop token ends the row
        if ids[-1] == eq:
            ended += 1
            assert text == tok.decode(ids[:-1], skip_special_tokens=True) and not text.endswith("=")
    assert ended > 0


def _tokenizers():
    """Tokenizers of three decoding kinds: byte-level BPE (GPT-2/Qwen), SentencePiece-style
    Metaspace (Llama 2/Mistral: a leading space per word), and gapo's character tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["the answer is 42. Question: what is 6 * 7? Résumé: naïve café, 5 € or 🙂 Answer: done"] * 20
    out = {}
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    out["bytelevel"] = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")
    sp = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    sp.pre_tokenizer = pre_tokenizers.Metaspace()
    sp.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    sp.train_from_iterator(
        corpus,
        trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<eos>"] + [f"<0x{b:02X}>" for b in range(256)]),
    )
    out["metaspace"] = PreTrainedTokenizerFast(tokenizer_object=sp, eos_token="<eos>", unk_token="<unk>")
    out["char"] = build_tokenizer("".join(sorted(set("".join(corpus)))))
    # decoding that cleans up spaces (" ." -> "."): the scan decodes through tokenizer.decode
    out["char-cleanup"] = build_tokenizer("".join(sorted(set("".join(corpus)))))
    out["char-cleanup"].clean_up_tokenization_spaces = True
    return out


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace", "char", "char-cleanup"])
def test_stop_scan_finds_the_first_stop_like_brute_force(kind):
    """``StopScan`` (incremental, a few tokens decoded per step) ends each row at the same token
    as decoding every prefix in full would, for stop strings that span tokens, start or end inside
    one, hold multi-byte characters split across byte tokens, or begin with a space."""
    import random

    from gapo.policy.stopping import StopScan

    tk = _tokenizers()[kind]
    rng = random.Random(0)
    pieces = [
        "the",
        " answer",
        " is",
        " 42",
        ".",
        " Question",
        ":",
        " what",
        " 6 * 7",
        "?",
        " Résumé",
        " naïve",
        " café",
        ",",
        " 5 €",
        " or",
        " 🙂",
        " Answer",
        " done",
        "\n",
        "\n\n",
        " .",
        " ,",
    ]
    cases = 0
    for _trial in range(60):
        texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(3, 12))) for _ in range(4)]
        rows = [tk(t, add_special_tokens=False).input_ids for t in texts]
        src = rng.choice(texts)
        a = rng.randrange(len(src))
        stops = [src[a : a + rng.randint(1, 8)], rng.choice([" Answer:", "€ or", "🙂", "é", "\n\n", "42."])]
        stops = [s for s in stops if s.strip() or s == "\n\n"]
        if not stops:
            continue
        N = max(map(len, rows))
        out_tok = torch.tensor([r + [0] * (N - len(r)) for r in rows])
        out_len = torch.tensor([len(r) for r in rows])
        every = rng.choice([1, 3, 8])
        scan, hits = StopScan(tk, stops, len(rows)), {}
        assert scan.whole == (kind == "char-cleanup")  # incremental unless decoding post-processes
        for t in range(N):
            if (t + 1) % every == 0 or t == N - 1:
                hits.update(dict(scan.scan(out_tok, out_len, t)))
        for i, ids in enumerate(rows):
            want = _first_stop(tk, ids, stops)
            assert hits.get(i) == want, (kind, texts[i], stops, hits.get(i), want)
            cases += want is not None
    assert cases > 30


def test_sampling_stop_config_key():
    from gapo.rl.config import Config, apply_overrides, load_config

    cfg = load_config(None, ['sampling.stop=["\\n\\nQuestion:", "</answer>"]'])
    assert cfg.sampling.stop == ["\n\nQuestion:", "</answer>"]
    assert Config().sampling.stop == []
    for bad, why in (
        ('sampling.stop=[""]', "non-empty strings"),
        ("sampling.stop=[3]", "expected a string"),
        ("sampling.stop=</answer>", "expected a list"),
        ("sampling.stop={a: 1}", "expected a list"),
    ):
        with pytest.raises(ValueError, match="sampling.stop") as e:
            load_config(None, [bad])
        assert why in str(e.value), (bad, str(e.value))
    c = Config()
    c.sampling.stop = ["ok", None]  # set programmatically: validation still catches it
    with pytest.raises(ValueError, match="sampling.stop: must be a list of non-empty strings"):
        c.validate()
    assert apply_overrides(Config(), ["sampling.stop=[]"]).sampling.stop == []


def test_stop_strings_need_the_tokenizer(model, prompts):
    with pytest.raises(ValueError, match="tokenizer"):
        sample(model, prompts, params=SamplingParams(max_new_tokens=4, eos_token_id=EOS, stop=["="]))


def test_eos_token_id_forms():
    import numpy as np

    from gapo.policy.stopping import as_eos_ids

    assert as_eos_ids(None) == () and as_eos_ids(5) == (5,) and as_eos_ids([5, 3, 5]) == (5, 3)
    assert as_eos_ids(torch.tensor([4, 2])) == (4, 2) and as_eos_ids([np.int64(7)]) == (7,)
    assert as_eos_ids(np.int64(6)) == (6,) and as_eos_ids(torch.tensor(1)) == (1,)
    for bad in ([1.5], [True], ["2"], "2", 2.0, True):
        with pytest.raises(ValueError, match="eos_token_id"):
            as_eos_ids(bad)
