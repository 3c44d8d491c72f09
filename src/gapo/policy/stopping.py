"""Where a sampled completion stops: stop tokens and stop strings (``gapo.policy.sampling``'s
module docstring states the semantics).

- ``as_eos_ids``: the stop token ids, as one tuple of distinct ids;
- ``split_stop``: a stop string that is the text of a special token the decoder skips
  (``<|im_end|>``) stops as that token; the others are matched in the decoded text;
- ``StopScan``: the first token at which each row's decoded completion contains a stop string,
  found by incremental detokenisation (a window of a few tokens per unfinished row and step,
  never a whole completion);
- ``cut_at_stop``: a decoded text up to its first stop string (the stop string is not in it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gapo.core.checks import as_int

__all__ = ["cut_at_stop", "as_eos_ids", "split_stop", "StopScan"]


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
    for x in items:
        i = as_int(x)  # python and numpy integers, not bools, floats or strings
        if i is None:
            raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
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


class StopScan:
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
        for offset in range(t + 1 - self.seen):  # the tokens since the last check
            j = self.seen + offset
            live = [k for k in live if j < lens[k]]  # rows past their stop token are done
            if not live:
                break
            rows = [self.open[k] for k in live]
            for k, r in zip(live, rows):
                self.ids[r].append(new[k][offset])
            if self.whole:
                still = []
                for k, r in zip(live, rows):
                    if self._whole_hit(r):
                        hit.append((r, j))
                    else:
                        still.append(k)
                live = still
                continue
            live = self._scan_step(live, rows, j, hit)
        self.open = [self.open[k] for k in live if t + 1 < lens[k]]
        self.seen = t + 1
        return hit

    def _scan_step(self, live: list[int], rows: list[int], j: int, hit: list) -> list[int]:
        """Incremental detokenisation of token ``j`` of ``rows`` (one backend call for all their
        windows); appends ``(row, j)`` to ``hit`` where a stop string completes, returns the
        indices of ``live`` still open."""
        texts = self.decode(
            [self.ids[r][self.prefix[r] : self.read[r]] for r in rows] + [self.ids[r][self.prefix[r] :] for r in rows]
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
        return still

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
