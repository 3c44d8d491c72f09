"""Batched KV-cached sampling with per-token log-probs, and chunked log-prob recomputation.

Works with any Hugging Face causal LM (the embedded policy or a real checkpoint).

Log-prob semantics (the same as verl's and TRL's ``old_logp``): for a sampled token ``y_t``

    logp[b, t] = log_softmax(logits[b, t] / temperature)[y_t]

i.e. the log-probability under the *temperature-scaled, unfiltered* policy. ``logprobs`` with the
same ``temperature`` recomputes exactly this quantity (up to float error), so the ratio
``exp(logp − old_logp)`` is 1 on the first mini-batch. Top-p only decides which tokens may be
drawn; it does not renormalise ``logp`` (as in verl/TRL, where the trainer recomputes log-probs
without the filter). With ``top_p < 1`` the behaviour policy is therefore slightly off-policy
with respect to ``logp``; keep ``top_p = 1`` for exact on-policy ratios. ``temperature = 0``
means greedy decoding, and its ``logp`` are taken at temperature 1.

Layout: prompts are left-padded (``prompt_ids (B, P)``, ``prompt_mask (B, P)``), completions are
right-padded (``completion_ids (B, T)``, ``response_mask (B, T)``); ``Rollout.input_ids`` is their
concatenation, whose last ``T`` columns are the response — what ``logprobs`` expects.

Stopping (the semantics of Hugging Face ``generate`` for stop tokens, of vLLM/TRL for stop
strings): a row ends at the first of

- a *stop token*: any id of ``eos_token_id`` (an int or a list: the tokenizer's EOS plus every id
  of ``generation_config.eos_token_id``, see ``gapo.policy.model.eos_token_ids``). The token is
  kept in the response mask (it is trained on: the policy learns to stop) and left out of the
  decoded text;
- a *stop string* (``stop``), matched in the decoded completion whatever its tokenisation: it may
  span several tokens and start or end inside one. The row ends at the token that completes the
  first occurrence; that token is the last one in the response mask (trained on, like a stop
  token), nothing after it is sampled into the rollout, and ``Rollout.texts`` cuts the decoded
  text *before* the stop string (the stop string itself is not in the text, as in vLLM). A
  stop string that is the text of a special token the decoder skips (``<|im_end|>``) is that
  token, i.e. a stop token;
- ``max_new_tokens``.

Stop strings are found by incremental detokenisation (``_StopScan``): each step decodes a window
of a few tokens per unfinished row, never a whole completion.

Arguments come grouped: ``SamplingParams`` (what is drawn and where it stops), ``DecodeOptions``
(how ``sample`` runs it: never the distribution), ``HeadMemory`` (``logprobs``' memory bounds).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from gapo.policy.fast_lm import FastLM, left_pad_positions, live_index, pack, unpack


@dataclass
class Rollout:
    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P) 1 on prompt tokens
    completion_ids: torch.Tensor  # (B, T) right-padded with pad_token_id
    response_mask: torch.Tensor  # (B, T) 1 on generated tokens, EOS included
    logp: torch.Tensor  # (B, T) float32, 0 where response_mask is 0
    eos_ids: tuple[int, ...] = ()  # the stop tokens the rows were sampled with (left out of ``texts``)
    stop: tuple[str, ...] = ()  # the stop strings (``texts`` cuts before the first one)

    @property
    def input_ids(self) -> torch.Tensor:  # (B, P + T)
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:  # (B, P + T)
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def lengths(self) -> torch.Tensor:  # (B,)
        return self.response_mask.sum(dim=1)

    def texts(self, tokenizer, *, skip_special_tokens: bool = True) -> list[str]:
        """Decoded completions (response tokens only): without a final stop token (``eos_ids``),
        and cut before the first occurrence of a stop string (``stop``) — the text a verifier scores."""
        out, eos = [], set(self.eos_ids)
        for ids, m in zip(self.completion_ids.tolist(), self.response_mask.tolist()):
            ids = [i for i, k in zip(ids, m) if k]
            if ids and ids[-1] in eos:
                ids = ids[:-1]
            out.append(cut_at_stop(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens), self.stop))
        return out


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest occurrence of any string of ``stop``."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


def as_eos_ids(eos_token_id) -> tuple[int, ...]:
    """``None`` | an int | a list (tuple, 1-d tensor) of ints -> a tuple of distinct ids (order kept)."""
    if eos_token_id is None:
        return ()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.reshape(-1).tolist()
    items = eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
    out = []
    for i in items:
        try:  # python and numpy integers, not bools, floats or strings
            if isinstance(i, bool):
                raise TypeError
            i = operator.index(i)
        except TypeError:
            raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}") from None
        if i not in out:
            out.append(i)
    return tuple(out)


def split_stop(tokenizer, stop: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``(token ids, strings)`` of the stop strings ``stop``: a string that is the text of one
    special token which decoding skips (``<|im_end|>``, ``</s>``) can never appear in the decoded
    text, so it stops as that token; every other string is matched in the text."""
    stop = tuple(stop)
    if not stop:
        return (), ()
    special = dict(tokenizer.get_added_vocab()) if hasattr(tokenizer, "get_added_vocab") else {}
    for i in getattr(tokenizer, "all_special_ids", ()):
        special.setdefault(tokenizer.convert_ids_to_tokens(i), i)
    ids, strings = [], []
    for s in stop:
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        i = special.get(s)
        if i is not None and s not in tokenizer.decode([i], skip_special_tokens=True):
            ids.append(i)
        elif s not in strings:
            strings.append(s)
    return tuple(dict.fromkeys(ids)), tuple(strings)


@dataclass(frozen=True)
class SamplingParams:
    """What ``sample`` draws, and where a completion stops (the ``sampling`` config keys).

    - ``max_new_tokens``: int >= 1, the most tokens sampled per completion;
    - ``temperature``: finite, >= 0; tokens are drawn from ``softmax(logits / temperature)``,
      ``0`` is greedy decoding (``logp`` then at temperature 1);
    - ``top_p``: in (0, 1], nucleus sampling: only the smallest set of most likely tokens whose
      mass reaches ``top_p`` may be drawn (``logp`` is not renormalised: module docstring);
    - ``eos_token_id``: the stop tokens, ``None``, an int or a list of ints (kept as a tuple of
      distinct ids); a row ends at its first stop token, kept in the response mask. ``None``
      is no stop token for ``sample``, the model's own (``gapo.policy.model.eos_token_ids``)
      for ``gapo.rl.evaluate``;
    - ``stop``: stop strings, one string or a sequence of non-empty strings (kept as a tuple),
      matched in the decoded completion (``sample`` needs the ``tokenizer`` for them).

    An invalid value is a ``ValueError`` naming the field, raised when the parameters are built.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    eos_token_id: tuple[int, ...] | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        n = _as_int(self.max_new_tokens)
        if n is None or n < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (an int), got {self.max_new_tokens!r}")
        object.__setattr__(self, "max_new_tokens", n)
        t = self.temperature
        if not _is_real(t) or not (math.isfinite(t) and t >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {t!r}")
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.eos_token_id is not None:
            object.__setattr__(self, "eos_token_id", as_eos_ids(self.eos_token_id))
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        try:
            stop = tuple(stop)
        except TypeError:
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}") from None
        for x in stop:
            if not isinstance(x, str) or not x:
                raise ValueError(f"stop strings must be non-empty strings, got {x!r}")
        object.__setattr__(self, "stop", stop)


@dataclass(frozen=True)
class DecodeOptions:
    """How ``sample`` runs the decoding; none of it changes the sampling distribution.

    - ``compact``: finished rows leave the KV cache as the batch thins out (it changes which
      random numbers a row draws, never the distribution);
    - ``fast``: decode Llama/Qwen2 models with ``FastLM`` (the same numbers, less per-token
      overhead, each distinct prompt prefilled once); other models, and ``False``, go through
      ``model.forward``;
    - ``check_every``: tokens between two checks for finished rows and stop strings (a host sync
      each), an int >= 1, or ``None``: 1 on a CPU, 8 on an accelerator.
    """

    compact: bool = True
    fast: bool = True
    check_every: int | None = None

    def __post_init__(self):
        c = self.check_every
        if c is not None:
            if _as_int(c) is None or c < 1:
                raise ValueError(f"check_every must be an int >= 1 or None, got {c!r}")
            object.__setattr__(self, "check_every", _as_int(c))


@dataclass(frozen=True)
class HeadMemory:
    """``logprobs``' memory bounds for the LM head (see there).

    - ``chunk_size``: positions per chunk of the head, log-softmax and entropy; ``None``: as many
      as fit ``max_chunk_bytes`` of float32 logits;
    - ``max_chunk_bytes``: the float32 logits bytes of one chunk when ``chunk_size`` is ``None``;
    - ``max_saved_bytes``: the most logits bytes kept for the backward pass; beyond it each chunk
      is checkpointed (recomputed in backward).
    """

    chunk_size: int | None = None
    max_chunk_bytes: int = 256 * 2**20
    max_saved_bytes: int = 2**30

    def __post_init__(self):
        c = self.chunk_size
        if c is not None:
            if _as_int(c) is None or c < 1:
                raise ValueError(f"chunk_size must be an int >= 1 or None, got {c!r}")
            object.__setattr__(self, "chunk_size", _as_int(c))
        for name in ("max_chunk_bytes", "max_saved_bytes"):
            v = _as_int(getattr(self, name))
            if v is None or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {getattr(self, name)!r}")
            object.__setattr__(self, name, v)


def _as_int(x) -> int | None:
    """``x`` as an int (Python or NumPy integers, not bools or floats), else ``None``."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def _is_real(x) -> bool:
    """A real number (int, float, NumPy scalars), not a bool or a string."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def left_pad(prompt_ids, prompt_mask=None, *, pad_token_id: int = 0, device=None):
    """``(ids (B, P), mask (B, P))`` from a list of token-id lists or a tensor (+ mask)."""
    if isinstance(prompt_ids, torch.Tensor):
        ids = prompt_ids.to(device=device, dtype=torch.long)
        if ids.dim() == 1:
            ids = ids[None]
        mask = torch.ones_like(ids) if prompt_mask is None else prompt_mask.to(device=device, dtype=torch.long)
        if mask.shape != ids.shape:
            raise ValueError(f"prompt_mask shape {tuple(mask.shape)} != prompt_ids shape {tuple(ids.shape)}")
        if ids.shape[1] and (mask[:, -1] == 0).any():
            raise ValueError("prompts must be left-padded (the last column of prompt_mask must be 1)")
        return ids, mask
    seqs = [list(s) for s in prompt_ids]
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("need at least one prompt, and every prompt needs at least one token")
    P = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), P), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), P), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, P - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, P - len(s) :] = 1
    return ids.to(device), mask.to(device)


def _pick(logits: torch.Tensor, temperature: float, top_p: float, generator):
    """Next token (B,) and its log-prob (B,) under log_softmax(logits / temperature)."""
    logits = logits.float()
    if temperature <= 0:
        tok = logits.argmax(-1)
        lp = torch.log_softmax(logits, -1)
        return tok, lp.gather(-1, tok[:, None])[:, 0]
    lp = torch.log_softmax(logits / temperature, -1)
    probs = lp.exp()
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        drop = (sp.cumsum(-1) - sp) >= top_p
        sp = sp.masked_fill(drop, 0.0)
        choice = torch.multinomial(sp, 1, generator=generator)
        tok = si.gather(-1, choice)[:, 0]
    else:
        tok = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return tok, lp.gather(-1, tok[:, None])[:, 0]


@torch.no_grad()
def sample(
    model,
    prompt_ids,
    prompt_mask: torch.Tensor | None = None,
    params: SamplingParams | None = None,
    *,
    pad_token_id: int | None = None,
    tokenizer=None,
    generator: torch.Generator | None = None,
    options: DecodeOptions | None = None,
) -> Rollout:
    """Sample one completion per prompt with a KV cache; see the module docstring for ``logp``
    and for stopping.

    ``prompt_ids`` is a list of token-id lists, or a left-padded ``(B, P)`` tensor with
    ``prompt_mask``. ``params`` (``SamplingParams``) is what is drawn: each row stops after its
    first stop token (``params.eos_token_id``; included in the response mask, nothing after it),
    after the token that completes its first stop string (``params.stop``, which needs
    ``tokenizer``), or after ``params.max_new_tokens``; no stop token and no ``stop`` never stop
    early. The returned width ``T`` is the longest completion. ``pad_token_id`` fills the
    padding (default: the model's, else the first stop token, else 0). ``generator`` (on the
    model's device) makes sampling reproducible. ``options`` (``DecodeOptions``) is how the
    decoding runs (dropping finished rows from the cache, ``FastLM``), never the distribution.
    """
    options = DecodeOptions() if options is None else options
    if not isinstance(params, SamplingParams):
        raise TypeError(
            "sample() needs params=SamplingParams(max_new_tokens=...), got "
            + ("none" if params is None else type(params).__name__)
        )
    if not isinstance(options, DecodeOptions):
        raise TypeError(f"sample(): options must be a DecodeOptions, got {type(options).__name__}")
    eos_ids, stop = params.eos_token_id or (), params.stop
    if stop:
        if tokenizer is None:
            raise ValueError("stop strings need the tokenizer (tokenizer=...) to be found in the decoded text")
        stop_ids, stop = split_stop(tokenizer, stop)
        eos_ids = as_eos_ids(eos_ids + stop_ids)
    if pad_token_id is None:
        pad_token_id = getattr(model.config, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = eos_ids[0] if eos_ids else 0
    device = next(model.parameters()).device
    ids, mask = left_pad(prompt_ids, prompt_mask, pad_token_id=pad_token_id, device=device)
    B, N = ids.shape[0], params.max_new_tokens
    was_training = model.training
    model.eval()
    try:
        pos = left_pad_positions(mask)
        dec = (FastLM.build(model) if options.fast else None) or _HFDecoder(model)
        logits = dec.prefill(ids, mask, pos, N)
        how = _Decoding(params.temperature, params.top_p, eos_ids, pad_token_id, options.compact, options.check_every)
        out_tok, out_lp, out_len = _decode(
            dec,
            logits,
            pos[:, -1:] + 1,
            B,
            N,
            how,
            generator=generator,
            stops=_StopScan(tokenizer, stop, B) if stop else None,
        )
        T = int(out_len.max())
        resp = (torch.arange(N, device=device)[None] < out_len[:, None]).long()[:, :T]
        completion = out_tok[:, :T].masked_fill(resp == 0, pad_token_id)
        logp = out_lp[:, :T] * resp
    finally:
        model.train(was_training)
    return Rollout(ids, mask, completion, resp, logp, eos_ids=eos_ids, stop=tuple(stop))


@dataclass(frozen=True)
class _Decoding:
    """How ``sample`` picks and stops tokens (its arguments after validation): the sampling
    distribution (``temperature``, ``top_p``), the stop ids, the padding id, whether finished rows
    leave the cache (``compact``) and how often stops are checked (``check_every``, ``None``: per
    device)."""

    temperature: float
    top_p: float
    eos_ids: tuple
    pad_token_id: int
    compact: bool
    check_every: int | None = None


def _decode(dec, logits, next_pos, B: int, N: int, how: _Decoding, *, generator, stops=None):
    """The decoding loop of ``sample`` from the prefill's ``logits (B, V)``; returns
    ``(tokens (B, N), logp (B, N), length incl. the stop token (B,))``. ``next_pos (B, 1)``: the
    position of the first new token. With ``how.compact``, finished rows leave ``dec``'s cache once a
    quarter of the active rows are done. ``stops`` (a ``_StopScan``) ends rows at stop strings."""
    temperature, top_p, eos_ids, pad_token_id = how.temperature, how.top_p, how.eos_ids, how.pad_token_id
    compact, check_every = how.compact, how.check_every
    device = logits.device
    out_tok = torch.full((B, N), pad_token_id, dtype=torch.long, device=device)
    out_lp = torch.zeros((B, N), dtype=torch.float32, device=device)
    out_len = torch.full((B,), N, dtype=torch.long, device=device)  # length incl. the stop token
    rows = torch.arange(B, device=device)  # original row of each active row
    done = torch.zeros(B, dtype=torch.bool, device=device)
    # one id: the comparison of before (the same booleans as isin, and no lookup table per step)
    eos = None if not eos_ids else eos_ids[0] if len(eos_ids) == 1 else torch.tensor(eos_ids, device=device)
    # A host sync per token is free on CPU but stalls an accelerator; check less often there.
    if check_every is None:
        check_every = 1 if device.type == "cpu" else 8
    for t in range(N):
        tok, lp = _pick(logits, temperature, top_p, generator)
        tok = tok.masked_fill(done, pad_token_id)
        out_tok[rows, t] = tok
        out_lp[rows, t] = lp.masked_fill(done, 0.0)
        if eos is not None:
            newly = ((tok == eos) if isinstance(eos, int) else torch.isin(tok, eos)) & ~done
            out_len[rows] = torch.where(newly, t + 1, out_len[rows])
            done = done | newly
        if stops is not None and ((t + 1) % check_every == 0 or t == N - 1):
            # rows whose text completed a stop string at a token up to t end there (a row that
            # stopped between two checks of an accelerator drew a few more tokens: cut below)
            hit = stops.scan(out_tok, out_len, t)
            if hit:
                r = torch.tensor([h[0] for h in hit], device=device)
                out_len[r] = torch.tensor([h[1] + 1 for h in hit], device=device)
                stopped = torch.zeros(B, dtype=torch.bool, device=device)
                stopped[r] = True
                done = done | stopped[rows]
        if t == N - 1:
            break
        if (eos is not None or stops is not None) and (t + 1) % check_every == 0:
            n_done = int(done.sum())
            if n_done == done.numel():
                break
            if compact and dec.can_select and n_done * 4 >= done.numel() and done.numel() > 1:
                keep = (~done).nonzero()[:, 0]
                dec.select(keep)
                rows, tok, done, next_pos = rows[keep], tok[keep], done[keep], next_pos[keep]
        logits = dec.step(tok, next_pos)
        next_pos = next_pos + 1
    return out_tok, out_lp, out_len


class _StopScan:
    """The first token at which each row's decoded completion contains one of ``stops``.

    Incremental detokenisation (as vLLM's and TGI's): a row keeps the text decoded so far and
    two offsets ``prefix <= read`` into its tokens; a new token adds
    ``decode(ids[prefix:]) − decode(ids[prefix:read])`` — a window of a few tokens, so byte-level
    pieces, SentencePiece's leading spaces and merges across the window's first token come out
    as in the whole completion's decoding — held back while the window ends in an incomplete
    UTF-8 character (U+FFFD; the text before it is searched already). Only the new text and the
    ``len(longest stop) − 1`` characters before it are searched; a step decodes the windows of
    all its rows in one call of the ``tokenizers`` backend. A tokenizer whose ``decode`` is not
    its backend's (one that cleans up spaces, or post-processes otherwise: not concatenative)
    decodes each row's whole completion so far at each step instead. Decoding skips special
    tokens, as ``Rollout.texts`` does. A row ends at the first token ``j`` for which the decoding
    of its tokens ``0 … j`` contains a stop string (tests/policy/test_sampling.py checks this
    against decoding every prefix whole).
    """

    def __init__(self, tokenizer, stops: Sequence[str], B: int):
        self.stops = tuple(stops)
        self.back = max(len(s) for s in self.stops) - 1
        self.ids: list[list[int]] = [[] for _ in range(B)]
        self.text = [""] * B
        self.prefix, self.read = [0] * B, [0] * B
        self.open = list(range(B))  # rows not yet ended (by a stop string, a stop token or the limit)
        self.seen = 0  # tokens of each row already scanned
        self.tok = tokenizer
        backend = _plain_backend(tokenizer)
        # incremental: one backend call for all windows of a step; without a plain backend (a
        # decode that post-processes the text, e.g. cleans up spaces: not concatenative) each
        # step decodes the row's whole completion so far instead (exact, slower)
        self.whole = backend is None
        if backend is not None:
            self.decode = lambda ws: backend.decode_batch(ws, skip_special_tokens=True)

    def scan(self, out_tok: torch.Tensor, out_len: torch.Tensor, t: int) -> list[tuple[int, int]]:
        """``(row, position)`` of the rows whose first stop string completes at one of the
        positions ``seen … t`` (rows ended by a stop token are scanned up to it)."""
        if not self.open:
            self.seen = t + 1
            return []
        rows_t = torch.tensor(self.open, device=out_tok.device)
        new = out_tok[rows_t, self.seen : t + 1].tolist()  # one transfer per check
        lens = out_len[rows_t].tolist()
        hit, live = [], list(range(len(self.open)))  # live: indices into self.open
        for c in range(t + 1 - self.seen):
            j = self.seen + c
            live = [k for k in live if j < lens[k]]  # rows past their stop token are done
            if not live:
                break
            rows = [self.open[k] for k in live]
            for k, r in zip(live, rows):
                self.ids[r].append(new[k][c])
            if self.whole:
                still = []
                for k, r in zip(live, rows):
                    if self._whole_hit(r):
                        hit.append((r, j))
                    else:
                        still.append(k)
                live = still
                continue
            texts = self.decode(
                [self.ids[r][self.prefix[r] : self.read[r]] for r in rows]
                + [self.ids[r][self.prefix[r] :] for r in rows]
            )
            n, still = len(rows), []
            for i, (k, r) in enumerate(zip(live, rows)):
                pre, full = texts[i], texts[n + i]
                if len(full) <= len(pre):  # no new text yet (a special token, a first byte of a character)
                    still.append(k)
                    continue
                old, new_text = len(self.text[r]), full[len(pre) :]
                if new_text.endswith("\ufffd"):
                    # an incomplete character: not committed yet, but the text before it is final
                    # (a stop string may complete there, as in the decoding of the whole prefix)
                    tail = (self.text[r] + new_text.rstrip("\ufffd"))[max(0, old - self.back) :]
                else:
                    self.text[r] += new_text
                    self.prefix[r], self.read[r] = self.read[r], len(self.ids[r])
                    tail = self.text[r][max(0, old - self.back) :]
                if any(s in tail for s in self.stops):
                    hit.append((r, j))
                else:
                    still.append(k)
            live = still
        self.open = [self.open[k] for k in live if t + 1 < lens[k]]
        self.seen = t + 1
        return hit

    def _whole_hit(self, r: int) -> bool:
        text = self.tok.decode(self.ids[r], skip_special_tokens=True)
        return any(s in text for s in self.stops)


def _plain_backend(tokenizer):
    """The ``tokenizers`` backend of ``tokenizer`` when its ``decode`` is exactly the backend's
    (checked on a probe text whose decoding a space clean-up would change), else ``None``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "decode_batch"):
        return None
    try:
        probe = tokenizer.encode("a . b , c ? d ! e 's f n't g 'm h 've i 're j", add_special_tokens=False)
        same = tokenizer.decode(probe, skip_special_tokens=True) == backend.decode(probe, skip_special_tokens=True)
    except Exception:  # noqa: BLE001 - an unusual tokenizer: take the exact path
        return None
    if not same:
        return None
    try:  # a tokenizer class of its own may post-process in its decode
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # pragma: no cover - layout of other transformers versions
        return None
    return backend if type(tokenizer)._decode is TokenizersBackend._decode else None


class _HFDecoder:
    """Decoding through ``model.forward`` and its Hugging Face cache, with ``FastLM``'s decoding
    interface (``prefill`` / ``step`` / ``select``): the path of every model ``FastLM`` does not take."""

    def __init__(self, model):
        self.model = model
        self.cache = None

    def prefill(self, ids, mask, pos, n_new):
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        self.cache = out.past_key_values
        self.attn = torch.cat([mask, mask.new_ones((ids.shape[0], n_new))], dim=1)
        self.len = ids.shape[1]
        return out.logits[:, -1]

    def step(self, tok, pos):
        self.len += 1
        out = self.model(
            input_ids=tok[:, None],
            attention_mask=self.attn[:, : self.len],
            position_ids=pos,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        return out.logits[:, -1]

    @property
    def can_select(self) -> bool:
        return hasattr(self.cache, "batch_select_indices")

    def select(self, keep):
        self.cache.batch_select_indices(keep)
        self.attn = self.attn[keep]


def _head_and_decoder(model):
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    dec = model.get_decoder() if hasattr(model, "get_decoder") else None
    if head is None or dec is None or dec is model:
        return None, None
    return head, dec


def _chunk_stats(h, targets, head, temperature: float, softcap, entropy_grad: bool = True):
    # h (B, C, H), targets (B, C) -> logp (B, C), entropy (B, C); float32 math on a chunk only.
    logits = head(h).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, -1)
    logp = logits.gather(-1, targets[..., None])[..., 0] - lse
    # Without entropy_grad the entropy is a detached diagnostic: nothing is saved for its
    # backward. This matters beyond speed: in a checkpointed chunk, tensors recomputed for a
    # branch whose backward never runs stay alive until the whole backward ends, so a loss
    # without an entropy term would keep every chunk's (B, C, V) softmax and logits.
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        ent = lse - (torch.softmax(logits, -1) * logits).sum(-1)
    return logp, ent


def _full_head_stats(model, input_ids, attention_mask, pos, targets, temperature: float):
    # logp, entropy (B, T) through model.forward's own head: the (B, T, V) logits are built whole
    T = targets.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, logits_to_keep=T + 1).logits
    logits = logits[:, :-1].float() / temperature
    lse = torch.logsumexp(logits, -1)
    ent = lse - (torch.softmax(logits, -1) * logits).sum(-1)
    return logits.gather(-1, targets[..., None])[..., 0] - lse, ent


def logprobs(
    model,
    input_ids: torch.Tensor,  # (B, L) = left-padded prompt ++ right-padded response
    attention_mask: torch.Tensor,  # (B, L)
    response_len: int,  # T: the last T columns are the response
    *,
    temperature: float = 1.0,
    memory: HeadMemory | None = None,
    fast: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``logp (B, T)`` and ``entropy (B, T)`` of the response under
    ``softmax(logits / temperature)`` (``temperature <= 0`` is treated as 1).

    Memory-bounded (``memory``, a ``HeadMemory``): the decoder runs once, then the LM head,
    log-softmax and entropy run over chunks of ``memory.chunk_size`` positions (by default as many
    as fit ``max_chunk_bytes`` of float32 logits), so the ``(B, T, V)`` float32 tensor is never
    built whole for large ``V``. Under autograd the chunks' logits are kept for the backward pass
    while all of them together fit ``max_saved_bytes`` (float32; counted twice with
    ``entropy_grad``, whose backward also keeps the softmax); beyond that each chunk is
    checkpointed, so the backward pass recomputes the chunk's logits instead of storing them (the
    same values: a quarter more LM-head work for memory bounded by one chunk; BENCHMARKS.md). When completions end at
    different lengths (at most ``fast_lm.PACK_BELOW`` of the response positions live in
    ``attention_mask``), the decoder's per-token work and the head run on the live positions
    only, and the padding after EOS comes back as 0 (else as meaningless values): multiply by the
    response mask.
    ``fast`` runs the decoder of Llama/Qwen2 models with ``FastLM``, which computes each
    distinct prompt once (rows of a GRPO group share it); ``fast=False`` uses ``model.model``.
    ``entropy_grad=False`` returns the entropy detached (pass it when the loss has no entropy
    term: it keeps the memory of a checkpointed backward bounded, see ``_chunk_stats``).
    """
    memory = HeadMemory() if memory is None else memory
    if not isinstance(memory, HeadMemory):
        raise TypeError(f"logprobs(): memory must be a HeadMemory, got {type(memory).__name__}")
    B, L = input_ids.shape
    T = int(response_len)
    if not 0 < T < L:
        raise ValueError(f"response_len must be in [1, {L - 1}], got {T}")
    temperature = 1.0 if temperature <= 0 else float(temperature)
    pos = left_pad_positions(attention_mask)
    targets = input_ids[:, L - T :]
    head, dec = _head_and_decoder(model)
    softcap = getattr(model.config, "final_logit_softcapping", None)
    if head is None:  # unknown layout: fall back to the model's own head on the last T+1 positions
        return _full_head_stats(model, input_ids, attention_mask, pos, targets, temperature)
    decoder = FastLM.build(model) if fast else None
    if decoder is not None:  # the same hidden states, each distinct prompt computed once
        hidden = decoder.hidden(input_ids, attention_mask, T)
    else:
        hidden = dec(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos).last_hidden_state
        hidden = hidden[:, L - T - 1 : L - 1]  # position j predicts token j + 1
    V = head.out_features if hasattr(head, "out_features") else head.weight.shape[0]
    idx = live_index(attention_mask[:, L - T :].bool())  # response tokens, not the padding after EOS
    if idx is None:
        return _head_stats(hidden, targets, head, V, temperature, softcap, entropy_grad, memory)
    # the head, log-softmax and entropy on the live positions only, packed into one row: the
    # same values there (each position's logits depend on its hidden state alone), zeros at the padding
    lp, ent = _head_stats(
        pack(hidden, idx)[None], pack(targets, idx)[None], head, V, temperature, softcap, entropy_grad, memory
    )
    return unpack(lp[0], idx, B, T), unpack(ent[0], idx, B, T)


def _head_stats(hidden, targets, head, V, temperature, softcap, entropy_grad, budget: HeadMemory):
    """``logprobs``' head over ``hidden (B, T, H)`` in chunks of positions (see there)."""
    chunk_size, max_chunk_bytes, max_saved_bytes = budget.chunk_size, budget.max_chunk_bytes, budget.max_saved_bytes
    B, T = targets.shape
    if chunk_size is None:
        chunk_size = max(1, max_chunk_bytes // (4 * B * V * 3))  # logits, probs, product
    if chunk_size >= T:
        return _chunk_stats(hidden, targets, head, temperature, softcap, entropy_grad)
    # what backward keeps per kept chunk: its float32 logits, and with entropy gradients about as
    # much again (the softmax; bench_memory.py: +0.8x of the logits at T = 2048)
    saved = 4 * B * T * V * (2 if entropy_grad else 1)
    use_ckpt = torch.is_grad_enabled() and hidden.requires_grad and saved > max_saved_bytes
    lps, ents = [], []
    for s in range(0, T, chunk_size):
        h, y = hidden[:, s : s + chunk_size], targets[:, s : s + chunk_size]
        if use_ckpt:
            lp, en = checkpoint(_chunk_stats, h, y, head, temperature, softcap, entropy_grad, use_reentrant=False)
        else:
            lp, en = _chunk_stats(h, y, head, temperature, softcap, entropy_grad)
        lps.append(lp)
        ents.append(en)
    return torch.cat(lps, 1), torch.cat(ents, 1)
