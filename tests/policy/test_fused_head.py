"""The fused LM-head log-prob (``logprobs``' head when the entropy is a detached diagnostic):
the values and gradients of autograd's chain, bit for bit in one chunk, and within rounding
across chunks; kept and recomputed logits agree; a second backward is still right."""

import pytest
import torch
import torch.nn.functional as F

from gapo.policy.logprobs import HeadMemory, _head_stats, _HeadLogProb


def _reference(h, w, y, temperature):
    # autograd's chain, as logprobs' unfused head computes it
    z = F.linear(h, w).float()
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, -1)
    with torch.no_grad():
        ent = lse - (torch.softmax(z, -1) * z).sum(-1)
    return z.gather(-1, y[:, None])[:, 0] - lse, ent


def _case(n=37, H=16, V=50, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, H, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(V, H, generator=g) / 3).to(dtype).requires_grad_()
    y = torch.randint(0, V, (n,), generator=g)
    weight = torch.rand(n, generator=g)  # a loss weight per row, so that the gradient differs per row
    return h, w, y, weight


def _grads(fn, h, w, weight):
    h.grad = w.grad = None
    lp, ent = fn()
    (lp * weight).sum().backward()
    return lp.detach(), ent.detach(), h.grad.clone(), w.grad.clone()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_one_chunk_is_autograds_chain_bit_for_bit(temperature):
    h, w, y, weight = _case()
    ref = _grads(lambda: _reference(h, w, y, temperature), h, w, weight)
    got = _grads(lambda: _HeadLogProb.apply(h, w, y, temperature, h.shape[0], True), h, w, weight)
    for a, b in zip(ref, got):
        assert torch.equal(a, b)


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("rows", [1, 5, 36])
def test_chunks_agree_with_the_chain(rows, keep):
    h, w, y, weight = _case(seed=rows)
    ref = _grads(lambda: _reference(h, w, y, 0.9), h, w, weight)
    got = _grads(lambda: _HeadLogProb.apply(h, w, y, 0.9, rows, keep), h, w, weight)
    # the forward is row-wise, so equal but where MKL takes another kernel for a one-row product
    for a, b in zip(ref, got):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if rows > 1:
        assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])


@pytest.mark.parametrize("rows", [1, 4, 36])
def test_kept_logits_give_autograds_chain_bit_for_bit_at_any_chunk_size(rows):
    # kept float32 logits: the head's three products run over all rows at once, as the chain's
    # do, and everything else is row-wise; recomputed logits accumulate the weight gradient per
    # chunk, so they agree within rounding
    h, w, y, weight = _case(seed=3)
    ref = _grads(lambda: _reference(h, w, y, 0.8), h, w, weight)
    kept = _grads(lambda: _HeadLogProb.apply(h, w, y, 0.8, rows, True), h, w, weight)
    recomputed = _grads(lambda: _HeadLogProb.apply(h, w, y, 0.8, rows, False), h, w, weight)
    assert all(torch.equal(a, b) for a, b in zip(ref, kept))
    for a, b in zip(kept, recomputed):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_second_backward_recomputes_what_the_first_overwrote():
    h, w, y, weight = _case(seed=4)
    lp, _ = _HeadLogProb.apply(h, w, y, 1.0, 8, True)
    (lp * weight).sum().backward(retain_graph=True)
    first = w.grad.clone()
    (lp * weight).sum().backward()
    torch.testing.assert_close(w.grad, 2 * first)


def test_frozen_weight_gets_no_gradient_and_entropy_none():
    h, w, y, weight = _case(seed=5)
    w.requires_grad_(False)
    lp, ent = _HeadLogProb.apply(h, w, y, 1.0, 6, True)
    assert not ent.requires_grad
    (lp * weight).sum().backward()
    assert w.grad is None and h.grad is not None


def test_bfloat16_weights_follow_the_chain():
    h, w, y, weight = _case(seed=6, dtype=torch.bfloat16)
    ref = _grads(lambda: _reference(h, w, y, 1.0), h, w, weight)
    got = _grads(lambda: _HeadLogProb.apply(h, w, y, 1.0, h.shape[0], True), h, w, weight)
    assert got[2].dtype == got[3].dtype == torch.bfloat16
    for a, b in zip(ref, got):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "head_kw, entropy_grad, softcap",
    [({"bias": True}, False, None), ({}, True, None), ({}, False, 30.0)],
)
def test_what_the_fused_head_does_not_cover_takes_autograds_chain(head_kw, entropy_grad, softcap, monkeypatch):
    calls = []
    real = _HeadLogProb.apply
    monkeypatch.setattr(_HeadLogProb, "apply", lambda *a: calls.append(1) or real(*a))
    head = torch.nn.Linear(16, 50, **({"bias": False} | head_kw))
    h = torch.randn(2, 7, 16, requires_grad=True)
    y = torch.randint(0, 50, (2, 7))
    lp, ent = _head_stats(h, y, head, 50, 1.0, softcap, entropy_grad, HeadMemory())
    assert not calls and ent.requires_grad == entropy_grad
    h2 = torch.randn(2, 7, 16, requires_grad=True)
    _head_stats(h2, y, torch.nn.Linear(16, 50, bias=False), 50, 1.0, None, False, HeadMemory())
    assert calls  # the plain case does take it


def test_head_memory_sets_the_rows_and_what_is_kept(monkeypatch):
    seen = []
    real = _HeadLogProb.apply
    monkeypatch.setattr(_HeadLogProb, "apply", lambda *a: seen.append(a[4:]) or real(*a))
    head = torch.nn.Linear(16, 50, bias=False)
    h = torch.randn(3, 7, 16, requires_grad=True)
    y = torch.randint(0, 50, (3, 7))
    _head_stats(h, y, head, 50, 1.0, None, False, HeadMemory(chunk_size=2))
    _head_stats(h, y, head, 50, 1.0, None, False, HeadMemory(max_chunk_bytes=4 * 50 * 3 * 5, max_saved_bytes=0))
    with torch.no_grad():
        _head_stats(h, y, head, 50, 1.0, None, False, HeadMemory())
    assert seen == [(6, True), (5, False), (HeadMemory().max_chunk_bytes // (4 * 50 * 3), False)]
