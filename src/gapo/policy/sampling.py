"""Batched KV-cached sampling with per-token log-probs: the decode loop.

Works with any Hugging Face causal LM (the embedded policy or a real checkpoint).

Log-prob semantics (the same as verl's and TRL's ``old_logp``): for a sampled token ``y_t``

    logp[b, t] = log_softmax(logits[b, t] / temperature)[y_t]

i.e. the log-probability under the *temperature-scaled, unfiltered, unpenalised* policy.
``logprobs`` with the same ``temperature`` recomputes exactly this quantity (up to float error), so
the ratio ``exp(logp − old_logp)`` is 1 on the first mini-batch. The token itself is drawn from
``filtered_logits``, Hugging Face ``generate``'s processors in its order: the repetition penalty
(CTRL, arXiv 1909.05858) on the raw logits of every id the row has seen (prompt and completion,
each id once: ``l / θ`` where ``l > 0``, ``l · θ`` elsewhere), then the temperature, top-k
(arXiv 1805.04833), top-p (arXiv 1904.09751) and min-p (arXiv 2407.01082). Top-k, top-p and min-p
only decide which tokens may be drawn, and the repetition penalty reshapes the distribution; none
of them changes ``logp`` (as in verl/TRL, where the trainer recomputes the old log-probs from the
model, without them). With any of them on, the behaviour policy is therefore off-policy with
respect to ``logp`` — slightly for a mild filter, more for the penalty, which moves mass between
tokens; keep them off (``top_p = 1``, ``top_k = 0``, ``min_p = 0``, ``repetition_penalty = 1``)
for exact on-policy ratios. ``temperature = 0`` means greedy decoding: the argmax of the penalised
logits (no top-k/top-p/min-p, as in ``generate``), its ``logp`` taken at temperature 1.

Layout: prompts are left-padded (``prompt_ids (B, P)``, ``prompt_mask (B, P)``), completions are
right-padded (``completion_ids (B, T)``, ``response_mask (B, T)``); ``Rollout.input_ids`` is their
concatenation, whose last ``T`` columns are the response — what ``gapo.policy.logprobs.logprobs``
expects (it recomputes the same ``logp``, memory-bounded, for the update).

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

Stop strings are found by incremental detokenisation (``gapo.policy.stopping.StopScan``): each
step decodes a window of a few tokens per unfinished row, never a whole completion.

Arguments come grouped: ``SamplingParams`` (what is drawn and where it stops), ``DecodeOptions``
(how ``sample`` runs it: never the distribution); ``logprobs``' memory bounds are ``HeadMemory``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gapo.core.checks import as_int, is_real
from gapo.policy.fast_lm import FastLM, left_pad_positions
from gapo.policy.stopping import StopScan, as_eos_ids, cut_at_stop, split_stop


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
      matched in the decoded completion (``sample`` needs the ``tokenizer`` for them);
    - ``top_k``: int >= 0, only the ``top_k`` most likely tokens (and those tied with the last) may
      be drawn; ``0`` is off (TRL's default);
    - ``min_p``: in [0, 1], only tokens with probability >= ``min_p`` × the top token's may be
      drawn; ``0`` is off;
    - ``repetition_penalty``: finite, > 0, the CTRL penalty ``θ`` on every id a row has seen
      (module docstring; ``> 1`` discourages repeats, ``< 1`` encourages them); ``1`` is off.

    An invalid value is a ``ValueError`` naming the field, raised when the parameters are built.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    eos_token_id: tuple[int, ...] | None = None
    stop: tuple[str, ...] = ()
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self):
        n = as_int(self.max_new_tokens)
        if n is None or n < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (an int), got {self.max_new_tokens!r}")
        object.__setattr__(self, "max_new_tokens", n)
        t = self.temperature
        if not is_real(t) or not (math.isfinite(t) and t >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {t!r}")
        if not is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
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
        self._check_filters()

    def _check_filters(self):
        k = as_int(self.top_k)
        if k is None or k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0: off), got {self.top_k!r}")
        object.__setattr__(self, "top_k", k)
        if not is_real(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] (0: off), got {self.min_p!r}")
        penalty = self.repetition_penalty
        if not is_real(penalty) or not (math.isfinite(penalty) and penalty > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1: off), got {penalty!r}")

    @property
    def filtered(self) -> bool:
        """Whether a filter other than top-p, or the repetition penalty, is on."""
        return self.top_k > 0 or self.min_p > 0 or self.repetition_penalty != 1


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
        every = self.check_every
        if every is not None:
            if as_int(every) is None or every < 1:
                raise ValueError(f"check_every must be an int >= 1 or None, got {every!r}")
            object.__setattr__(self, "check_every", as_int(every))


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


def filtered_logits(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """The logits ``(B, V)`` a token is drawn from (``softmax``; the argmax at temperature 0), in
    ``generate``'s order: the repetition penalty ``θ`` on the ids ``seen (B, V)`` marks (CTRL, arXiv
    1909.05858: ``l / θ`` where ``l > 0``, ``l · θ`` elsewhere; ``None``: no id seen), then
    ``/ temperature``, top-k, top-p, min-p; a filtered token's logit is ``-inf``. Temperature 0
    (greedy) stops after the penalty: the filters never change an argmax."""
    z = logits.float()
    if seen is not None and params.repetition_penalty != 1:
        theta = params.repetition_penalty
        z = torch.where(seen, torch.where(z < 0, z * theta, z / theta), z)
    if params.temperature <= 0:
        return z
    z = z / params.temperature
    if params.top_k:  # ties with the k-th logit stay, as in TopKLogitsWarper
        kth = z.topk(min(params.top_k, z.shape[-1]), -1).values[:, -1:]
        z = z.masked_fill(z < kth, -math.inf)
    if params.top_p < 1.0:  # the smallest most likely prefix whose (renormalised) mass reaches top_p
        sp, si = torch.softmax(z, -1).sort(-1, descending=True)
        drop = (sp.cumsum(-1) - sp) >= params.top_p
        z = z.masked_fill(drop.scatter(-1, si, drop), -math.inf)
    if params.min_p > 0:  # p_v < min_p · max_v' p_v' goes (the top token always stays)
        probs = torch.softmax(z, -1)
        z = z.masked_fill(probs < params.min_p * probs.amax(-1, keepdim=True), -math.inf)
    return z


def _pick(logits: torch.Tensor, params: SamplingParams, generator, seen=None):
    """Next token (B,) and its log-prob (B,) under log_softmax(logits / temperature), drawn from
    ``filtered_logits``."""
    logits, temperature = logits.float(), params.temperature
    if temperature <= 0:
        tok = filtered_logits(logits, params, seen).argmax(-1)
        lp = torch.log_softmax(logits, -1)
        return tok, lp.gather(-1, tok[:, None])[:, 0]
    lp = torch.log_softmax(logits / temperature, -1)
    if params.filtered or params.top_p < 1.0:
        probs = torch.softmax(filtered_logits(logits, params, seen), -1)
    else:
        probs = lp.exp()
    tok = _draw(probs, generator)
    return tok, lp.gather(-1, tok[:, None])[:, 0]


def _draw(probs: torch.Tensor, generator=None) -> torch.Tensor:
    """One index per row of ``probs (B, V)`` (a softmax: non-negative, any positive sum), by the
    inverse of the cumulative distribution:

        tok = min{v : F_v > u · F_V},   F_v = Σ_{w <= v} probs_w (float64),   u ~ U[0, 1)

    One uniform per row: ``torch.multinomial`` draws one exponential per vocabulary entry, the
    largest single cost of sampling at a 32000-token vocabulary (BENCHMARKS.md, section 13). Exact
    in distribution as that is; an index of zero weight is never drawn. Weights that are NaN,
    infinite or all zero in a row raise, as in ``torch.multinomial`` (the sum shows them)."""
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:]
    torch._assert_async(
        torch.isfinite(total).all() & (total > 0).all(),
        "sampling: the next-token probabilities are NaN, infinite or all zero in a row",
    )
    u = torch.rand(total.shape, dtype=torch.float64, device=probs.device, generator=generator) * total
    # u · F_V may round up to F_V itself: stay below it, so that the index found has weight
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True)[:, 0]


class _Picker:
    """Each step's draw (``_pick`` with ``params`` and ``generator``) and, for the repetition penalty
    only, the ids each active row has seen: ``seen (B, V)``, the prompt's tokens (not its padding)
    and every token drawn since, rows selected as the decoder's are."""

    def __init__(self, params: SamplingParams, generator, seen: torch.Tensor | None = None):
        self.params, self.generator, self.seen = params, generator, seen

    @classmethod
    def build(cls, params: SamplingParams, generator, ids, mask, vocab: int) -> _Picker:
        if params.repetition_penalty == 1:
            return cls(params, generator)  # no (B, V) mask and no scatter per token when it is off
        # padding writes to an extra column, dropped: a pad id is seen only where the prompt has it
        seen = torch.zeros((ids.shape[0], vocab + 1), dtype=torch.bool, device=ids.device)
        seen.scatter_(1, ids.masked_fill(mask == 0, vocab), True)
        return cls(params, generator, seen[:, :vocab].contiguous())

    def __call__(self, logits):
        tok, lp = _pick(logits, self.params, self.generator, self.seen)
        if self.seen is not None:
            self.seen.scatter_(1, tok[:, None], True)
        return tok, lp

    def select(self, keep):
        if self.seen is not None:
            self.seen = self.seen[keep]


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
    eos_ids, stop = _stops(params, tokenizer)
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
        how = _Decoding(eos_ids, pad_token_id, options.compact, options.check_every)
        pick = _Picker.build(params, generator, ids, mask, logits.shape[-1])
        stops = StopScan(tokenizer, stop, B) if stop else None
        out_tok, out_lp, out_len = _decode(dec, logits, pos[:, -1:] + 1, B, N, how, pick=pick, stops=stops)
        T = int(out_len.max())
        resp = (torch.arange(N, device=device)[None] < out_len[:, None]).long()[:, :T]
        completion = out_tok[:, :T].masked_fill(resp == 0, pad_token_id)
        logp = out_lp[:, :T] * resp
    finally:
        model.train(was_training)
    return Rollout(ids, mask, completion, resp, logp, eos_ids=eos_ids, stop=tuple(stop))


def _stops(params: SamplingParams, tokenizer) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``(stop token ids, stop strings)`` of ``params``: a stop string that is a skipped special
    token's text joins the stop tokens (``split_stop``)."""
    eos_ids, stop = params.eos_token_id or (), params.stop
    if stop:
        if tokenizer is None:
            raise ValueError("stop strings need the tokenizer (tokenizer=...) to be found in the decoded text")
        stop_ids, stop = split_stop(tokenizer, stop)
        eos_ids = as_eos_ids(eos_ids + stop_ids)
    return eos_ids, stop


@dataclass(frozen=True)
class _Decoding:
    """How ``sample`` stops tokens (its arguments after validation): the stop ids, the padding id,
    whether finished rows leave the cache (``compact``) and how often stops are checked
    (``check_every``, ``None``: per device). What is drawn is the ``_Picker``'s."""

    eos_ids: tuple
    pad_token_id: int
    compact: bool
    check_every: int | None = None


def _decode(dec, logits, next_pos, B: int, N: int, how: _Decoding, *, pick: _Picker, stops=None):
    """The decoding loop of ``sample`` from the prefill's ``logits (B, V)``; returns
    ``(tokens (B, N), logp (B, N), length incl. the stop token (B,))``. ``next_pos (B, 1)``: the
    position of the first new token; ``pick`` draws the tokens. With ``how.compact``, finished rows
    leave ``dec``'s cache (and ``pick``'s seen ids) once a quarter of the active rows are done.
    ``stops`` (a ``StopScan``) ends rows at stop strings."""
    eos_ids, pad_token_id = how.eos_ids, how.pad_token_id
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
        tok, lp = pick(logits)
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
                pick.select(keep)
                rows, tok, done, next_pos = rows[keep], tok[keep], done[keep], next_pos[keep]
        logits = dec.step(tok, next_pos)
        next_pos = next_pos + 1
    return out_tok, out_lp, out_len


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
