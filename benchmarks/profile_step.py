"""Where one RL step of gapo's Trainer goes, part by part, at bench_step.py's two sizes (issue 37).

    python benchmarks/profile_step.py [--configs tiny big] [--steps N] [--threads 1] [--gemm-n 2048] [--json PATH]

The work is exactly ``bench_step.py``'s gapo side: ``bench_step.run_gapo`` builds and runs the
Trainer (the tiny size: 1 warm-up + ``--steps`` measured steps of 8 × 8 rollouts of ≤ 16 tokens
at the 1.06M Qwen2; the compute-bound size: ``--steps`` steps, no warm-up, 8 × 8 rollouts of 128
tokens at the 34.2M shape ``30m``, μ = 1), and the policies come from ``bench_step.make_policy``.
While it runs, gapo's functions are wrapped in CPU timers (``time.process_time``, which a busy
machine changes less than wall time); each timer keeps its *exclusive* time (its own minus the
timed calls inside it), so the parts never overlap and, with "other", add up to the step:

- sampling: ``FastLM.prefill`` (each distinct prompt once, the KV cache, the first logits); per
  decoded token ``FastLM.step``'s decoder layers (embedding, attention, MLP, norms) and its head
  (the ``(b, H) · (H, V)`` projection); in ``_pick`` the ``log_softmax`` over the vocabulary and
  the rest of the draw (``exp``, the filters if any, the inverse-CDF search of ``sampling._draw``
  (``torch.multinomial`` before issue 37), the gather); ``_decode``'s own work (stop
  checks, writes into the outputs, the host syncs, dropping finished rows: Python between
  kernels); and ``Trainer._sample``'s own work (padding the prompts, building the decoder, masks);
- scoring: ``Trainer._rollout`` less sampling (decoding the texts, the rewards, the batch);
- update: ``Trainer._update_batch`` (the behaviour log-probs' forward where one runs: none with
  one mini-batch, where the update's first forward gives them; and the batch's masks); the
  update's forward split into the decoder (``FastLM.hidden``), the head with its log-softmax and
  entropy (``logprobs._head_stats``) and ``Trainer._logprobs``' own work (packing, autocast);
  ``update.micro_batch_loss``; ``optimizer.backward``; ``optimizer.step`` (clip + fused AdamW);
  ``Trainer._update``'s own work (mini-batch bookkeeping, the gradient zeroing, statistics);
- other: ``Trainer.train_step``'s own work (advantages, GAPO's ε_high, metrics, samples) and,
  as the remainder of the step's CPU time, everything between two steps (``run_gapo``'s logging
  of the record) and the timers' own cost (two clock and two ``getrusage`` reads per timed
  call, ≈ 2 µs).

A step's CPU time is counted from the end of one ``train_step`` to the end of the next, as
``bench_step.py`` counts it (the first step from its own start). Reported: each part's CPU time
per step (mean over the measured steps), its share of the step, the share of it spent in the
kernel (system time, ``getrusage``: mostly page faults of fresh memory) and its page faults; for
the parts made of matrix products, their nominal FLOP/s as a fraction of this machine's fp32
GEMM rate (``bench_step.gemm_rate`` at ``--gemm-n``, measured first; ``matmul_rates``). After the measured steps one
more rollout runs under a ``TorchDispatchMode`` that counts the aten operators (kernels: each
one a launch on an accelerator) per decoded token, by part, and those that make the host wait
for the device on an accelerator (``_local_scalar_dense`` — ``int()``, ``.item()`` — ``nonzero``,
``unique``, ``masked_select``, ``equal``, ``is_nonzero``).

Everything runs in this process with ``--threads`` torch threads (``torch.set_num_threads``;
``OMP_NUM_THREADS`` defaults to 1). The last line, ``profile tiny:sampling=… big:…``, gives each
size's four group shares.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_step import Work, gemm_rate, make_policy, run_gapo  # noqa: E402  (no heavy imports)

# (key, label, group), in the table's order; "other.between" is the remainder of the step
PARTS = (
    ("sampling.prefill", "prefill (distinct prompts once, KV cache, first logits)", "sampling"),
    ("sampling.decode.layers", "decode: decoder layers per token (attention, MLP, norms)", "sampling"),
    ("sampling.decode.head", "decode: head, (b, H) · (H, V) per token", "sampling"),
    ("sampling.decode.log_softmax", "decode: log-softmax over the vocabulary", "sampling"),
    ("sampling.decode.draw", "decode: the draw (`_pick`: exp, the search, gather)", "sampling"),
    ("sampling.decode.python", "decode: stop checks, output writes, Python between kernels", "sampling"),
    ("sampling.setup", "setup (prompt padding, decoder build, masks)", "sampling"),
    ("scoring", "texts and rewards", "scoring"),
    ("update.prepare", "behaviour log-probs forward (none at 1 mini-batch) and masks", "update"),
    ("update.forward.decoder", "forward: decoder (`FastLM.hidden`)", "update"),
    ("update.forward.head", "forward: head, log-softmax, entropy (`_head_stats`)", "update"),
    ("update.forward.rest", "forward: packing, autocast (`Trainer._logprobs`)", "update"),
    ("update.loss", "loss (`micro_batch_loss`)", "update"),
    ("update.backward", "backward", "update"),
    ("update.optimizer", "optimiser step (clip + fused AdamW)", "update"),
    ("update.bookkeeping", "mini-batch bookkeeping, zero_grad, statistics", "update"),
    ("other.train_step", "`train_step`'s own work (advantages, ε_high, metrics)", "other"),
    ("other.between", "between steps (logging) and the timers' own cost", "other"),
)
GROUPS = ("sampling", "scoring", "update", "other")
DECODE = tuple(k for k, _, _ in PARTS if k.startswith("sampling.decode."))
SYNC_OPS = frozenset(
    {"_local_scalar_dense", "nonzero", "unique_dim", "_unique2", "masked_select", "equal", "is_nonzero"}
)


def rusage() -> tuple[float, float]:
    """``(system CPU seconds, page faults)`` of this process so far (``getrusage``)."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_stime, u.ru_minflt + u.ru_majflt


class Ranges:
    """Nested CPU-time ranges: ``enter(name)`` / ``exit()``; ``excl[name]`` is the time inside
    ``name`` less the time of the ranges opened inside it, so no time is counted twice.
    ``meter`` (e.g. ``rusage``) is read with the clock and kept the same way, in ``extra[name]``."""

    def __init__(self, clock=time.process_time, meter=None):
        self.clock, self.meter = clock, meter
        self.stack: list[list] = []  # [name, reading at the start, readings of the ranges inside]
        self.excl: defaultdict[str, float] = defaultdict(float)
        self.extra: defaultdict[str, list] = defaultdict(lambda: [0.0] * len(self.read()[1:]))
        self.calls: Counter[str] = Counter()
        self.items: Counter[str] = Counter()  # counted work (decoded rows), snapshot with the times

    def read(self) -> tuple:
        return (self.clock(), *self.meter()) if self.meter else (self.clock(),)

    def snapshot(self) -> dict:
        out = {**self.excl, **{f"#{k}": v for k, v in self.items.items()}}
        for name, values in self.extra.items():
            out.update({f"{j}:{name}": v for j, v in enumerate(values, 1)})
        return out

    def top(self) -> str | None:
        return self.stack[-1][0] if self.stack else None

    def enter(self, name: str) -> None:
        r = self.read()
        self.stack.append([name, r, [0.0] * len(r)])

    def exit(self) -> None:
        name, r0, inner = self.stack.pop()
        d = [b - a for a, b in zip(r0, self.read())]
        self.excl[name] += d[0] - inner[0]
        if len(d) > 1:
            self.extra[name] = [x + dj - ij for x, dj, ij in zip(self.extra[name], d[1:], inner[1:])]
        self.calls[name] += 1
        if self.stack:
            self.stack[-1][2] = [a + b for a, b in zip(self.stack[-1][2], d)]

    def wrap(self, fn, name: str, inside: frozenset | None = None):
        """``fn`` timed as range ``name`` when the innermost open range is one of ``inside``
        (``None``: always); elsewhere its time stays with the range that called it."""

        def timed(*args, **kwargs):
            if inside is not None and self.top() not in inside:
                return fn(*args, **kwargs)
            self.enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.exit()

        return timed


class _TorchFor:
    """The ``torch`` module as ``gapo.policy.sampling`` sees it, with ``log_softmax`` timed (the
    ``_pick`` of the step splits into the log-softmax and the draw without touching its code)."""

    def __init__(self, torch, log_softmax):
        self._torch, self.log_softmax = torch, log_softmax

    def __getattr__(self, name):
        return getattr(self._torch, name)


def instrument(ranges: Ranges, steps: list) -> ExitStack:
    """Wrap gapo's step functions in ``ranges`` (module docstring); each ``Trainer.train_step``
    appends ``(reading delta, snapshot, trainer)`` to ``steps``, after a first entry holding the
    snapshot before the first step. Undone when the stack closes."""
    import torch

    from gapo.policy import logprobs, sampling
    from gapo.rl import optimizer, trainer, update

    stack = ExitStack()

    def patch(owner, attr, name, inside=None):
        stack.enter_context(mock.patch.object(owner, attr, ranges.wrap(getattr(owner, attr), name, inside)))

    T, upd = trainer.Trainer, frozenset({"update.bookkeeping"})
    patch(T, "_rollout", "scoring")
    patch(T, "_sample", "sampling.setup")
    patch(sampling, "_decode", "sampling.decode.python")
    patch(sampling, "_pick", "sampling.decode.draw")
    log_softmax = ranges.wrap(torch.log_softmax, "sampling.decode.log_softmax", frozenset({"sampling.decode.draw"}))
    stack.enter_context(mock.patch.object(sampling, "torch", _TorchFor(torch, log_softmax)))
    _instrument_fast_lm(ranges, stack)
    patch(T, "_update_batch", "update.prepare")
    patch(T, "_update", "update.bookkeeping")
    patch(T, "_logprobs", "update.forward.rest", upd)  # inside _update_batch: the behaviour forward, whole
    patch(logprobs, "_head_stats", "update.forward.head", frozenset({"update.forward.rest"}))
    patch(update, "micro_batch_loss", "update.loss", upd)
    patch(optimizer, "backward", "update.backward", upd)
    patch(optimizer, "step", "update.optimizer", upd)
    step = ranges.wrap(T.train_step, "other.train_step")
    last_end: list[tuple] = []

    def train_step(self):
        start = ranges.read()
        if not steps:  # what the ranges held before the first step
            steps.append(((0.0,) * len(start), ranges.snapshot(), None))
        rec = step(self)
        end = ranges.read()
        steps.append((tuple(b - a for a, b in zip(last_end[-1] if last_end else start, end)), ranges.snapshot(), self))
        last_end.append(end)
        return rec

    stack.enter_context(mock.patch.object(T, "train_step", train_step))
    return stack


def _instrument_fast_lm(ranges: Ranges, stack: ExitStack) -> None:
    """``FastLM``'s prefill, decoding step (its rows counted), the decoding step's head (not the
    prefill's: that stays in the prefill) and ``hidden`` (the update's decoder)."""
    from gapo.policy.fast_lm import FastLM

    init, prefill, step, hidden = FastLM.__init__, FastLM.prefill, FastLM.step, FastLM.hidden

    def fast_init(self, model):
        init(self, model)
        self.head = ranges.wrap(self.head, "sampling.decode.head", frozenset({"sampling.decode.layers"}))

    def step_rows(self, tok, pos):  # the rows each decoding step computes (finished ones too)
        ranges.items["decode_rows"] += tok.shape[0]
        return step(self, tok, pos)

    for attr, fn in (
        ("__init__", fast_init),
        ("prefill", ranges.wrap(prefill, "sampling.prefill")),
        ("step", ranges.wrap(step_rows, "sampling.decode.layers")),
        ("hidden", ranges.wrap(hidden, "update.forward.decoder", frozenset({"update.forward.rest"}))),
    ):
        stack.enter_context(mock.patch.object(FastLM, attr, fn))


def _op_counter(ranges: Ranges):
    """A ``TorchDispatchMode`` counting the aten operators per innermost range, and those among
    them that wait for an accelerator (``SYNC_OPS``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCount(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: Counter[str] = Counter()
            self.syncs: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            where = ranges.top()
            self.ops[where] += 1
            if func.overloadpacket.__name__ in SYNC_OPS:
                self.syncs[where] += 1
            return func(*args, **(kwargs or {}))

    return OpCount()


def _per_part(steps: list, measured: range, j: int) -> dict:
    """Field ``j`` of the readings (0: CPU s, 1: system CPU s, 2: page faults) summed over the
    ``measured`` steps, per part; "other.between" is the step's total less the parts."""
    prefix = f"{j}:" if j else ""
    out = dict.fromkeys((k for k, _, _ in PARTS), 0.0)
    for i in measured:
        for k in out:
            if k != "other.between":
                out[k] += steps[i][1].get(prefix + k, 0.0) - steps[i - 1][1].get(prefix + k, 0.0)
    out["other.between"] = sum(steps[i][0][j] for i in measured) - sum(out.values())
    return out


def shares(steps: list, warmup: int) -> dict:
    """Per part: mean CPU seconds per measured step, its share of the step, and (where the
    readings have them, ``rusage``) the system CPU seconds and page faults in it."""
    measured = range(1 + warmup, len(steps))  # steps[0]: the snapshot before the first step
    n, fields = len(measured), len(steps[0][0])
    secs = _per_part(steps, measured, 0)
    total = sum(secs.values())
    extra = [_per_part(steps, measured, j) for j in range(1, fields)]
    parts = {k: {"cpu_s": v / n, "share": v / total} for k, v in secs.items()}
    for name, values in zip(("sys_s", "faults"), extra):
        for k, v in values.items():
            parts[k][name] = v / n
    rows = steps[-1][1].get("#decode_rows", 0) - steps[warmup][1].get("#decode_rows", 0)
    return {
        "step_cpu_s": total / n,
        "step_sys_s": sum(extra[0].values()) / n if extra else None,
        "step_faults": sum(extra[1].values()) / n if extra else None,
        "decode_rows_per_step": rows / n,
        "parts": parts,
        "groups": {g: sum(v for k, v in secs.items() if k.split(".")[0] == g) / total for g in GROUPS},
    }


def count_decode(ranges: Ranges, trainer) -> dict:
    """One more rollout under the operator counter: aten operators and syncs per decoded token."""
    draws = ranges.calls["sampling.decode.draw"]
    counter = _op_counter(ranges)
    with counter:
        trainer._rollout()
    tokens = ranges.calls["sampling.decode.draw"] - draws
    return {
        "decode_steps": tokens,
        "ops_per_token": {k: counter.ops[k] / tokens for k in DECODE},
        "ops_per_token_total": sum(counter.ops[k] for k in DECODE) / tokens,
        "syncs_per_token": sum(counter.syncs[k] for k in DECODE) / tokens,
        "prefill_ops": counter.ops["sampling.prefill"],
        "sampling_syncs": sum(v for k, v in counter.syncs.items() if k and k.startswith("sampling")),
    }


def profile(policy: str, work: Work, threads: int = 1) -> dict:
    """Run ``bench_step.run_gapo(policy, work, threads, μ = 1)`` instrumented; returns the shares
    (``shares``), the decode counts (``count_decode``) and ``run_gapo``'s own figures."""
    ranges, steps = Ranges(meter=rusage), []
    with instrument(ranges, steps):
        bench = run_gapo(policy, work, threads, 1)
        counts = count_decode(ranges, steps[-1][2])
    out = shares(steps, work.warmup)
    decode = sum(out["parts"][k]["cpu_s"] for k in DECODE)
    out.update(
        counts,
        shape=work.shape,
        max_tokens=work.max_tokens,
        steps=work.steps,
        n_params=bench["n_params"],
        completion_tokens_per_step=bench["completion_tokens_per_step"],
        head_share_of_decode=out["parts"]["sampling.decode.head"]["cpu_s"] / decode,
        vocab_share_of_decode=sum(
            out["parts"][k]["cpu_s"] for k in ("sampling.decode.head", "sampling.decode.log_softmax")
        )
        / decode,
        decode_cpu_s=decode,
    )
    return out


def matmul_rates(r: dict, gemm: float) -> dict:
    """Each product-bound part's nominal FLOP/s as a fraction of the GEMM rate ``gemm``: the
    weights' products only (attention, ≤ 3% of them here, and everything element-wise left
    out), 2 FLOPs per weight and row forward, 4 backward. Decoding counts every row it computed
    (``decode_rows_per_step``, finished rows included); the update counts the completion tokens."""
    from bench_trl_step import SHAPES

    c = SHAPES[r["shape"]]
    head = c["hidden_size"] * c["vocab"]
    layers = r["n_params"] - head * (1 if c["tie_word_embeddings"] else 2)  # no embedding, no head
    rows, tokens = r["decode_rows_per_step"], r["completion_tokens_per_step"]
    flops = {
        "sampling.decode.layers": 2 * layers * rows,
        "sampling.decode.head": 2 * head * rows,
        "update.forward.decoder": 2 * layers * tokens,
        "update.forward.head": 2 * head * tokens,
        "update.backward": 4 * (layers + head) * tokens,
    }
    return {k: f / r["parts"][k]["cpu_s"] / gemm for k, f in flops.items()}


def table(r: dict, title: str) -> str:
    """The Markdown table of one size: every part, then the four groups."""
    ms = 1e3
    lines = [
        f"**{title}** ({r['n_params'] / 1e6:.2f}M parameters, {r['completion_tokens_per_step']:.0f} completion "
        f"tokens per step, {r['steps']} measured step(s), {r['step_cpu_s']:.3f} CPU-s per step)",
        "",
        "| phase | part | CPU ms/step | share | of it system time | page faults/step | products vs GEMM rate |",
        "|---|---|---|---|---|---|---|",
    ]
    rates = r.get("matmul_rates", {})
    for k, label, group in PARTS:
        p, rate = r["parts"][k], f"{rates[k]:.0%}" if k in rates else ""
        sys_s = f"{p['sys_s'] / p['cpu_s']:.0%}" if p["cpu_s"] > 0 else ""
        lines.append(
            f"| {group} | {label} | {p['cpu_s'] * ms:.1f} | {p['share']:.1%} | {sys_s} | {p['faults']:.0f} | {rate} |"
        )
    lines.append(
        "| **total** | "
        + ", ".join(f"{g} **{r['groups'][g]:.1%}**" for g in GROUPS)
        + f" | {r['step_cpu_s'] * ms:.1f} | 100% | {r['step_sys_s'] / r['step_cpu_s']:.0%} "
        f"| {r['step_faults']:.0f} | |"
    )
    per = r["ops_per_token"]
    lines += [
        "",
        f"Decoding computed {r['decode_rows_per_step']:.0f} rows per step for "
        f"{r['completion_tokens_per_step']:.0f} completion tokens"
        + (f" (GEMM rate {r['gemm_flops_per_s'] / 1e9:.1f} GFLOP/s)" if "gemm_flops_per_s" in r else "")
        + f". Decode, per token ({r['decode_steps']} decoding steps counted): "
        f"{r['ops_per_token_total']:.0f} aten operators (layers {per['sampling.decode.layers']:.0f}, "
        f"head {per['sampling.decode.head']:.0f}, log-softmax {per['sampling.decode.log_softmax']:.0f}, "
        f"draw {per['sampling.decode.draw']:.0f}, between {per['sampling.decode.python']:.0f}), "
        f"{r['syncs_per_token']:.2f} host syncs; the head is {r['head_share_of_decode']:.1%} of decode time, "
        f"head + log-softmax {r['vocab_share_of_decode']:.1%}.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["tiny", "big"], choices=["tiny", "big"])
    ap.add_argument("--steps", type=int, default=None, help="measured steps (default: 5 tiny, 1 compute-bound)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--big-shape", default="30m", help="the compute-bound size's shape (bench_trl_step.SHAPES)")
    ap.add_argument("--big-tokens", type=int, default=128, help="completion tokens at the compute-bound size")
    ap.add_argument("--gemm-n", type=int, default=2048, help="GEMM rate's matrix size (bench_step.gemm_rate); 0: none")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    works = {
        "tiny": Work(a.steps or 5, 1, "tiny", 16),
        "big": Work(a.steps or 1, 0, a.big_shape, a.big_tokens),
    }
    gemm = gemm_rate(a.threads, a.gemm_n)["flops_per_s"] if a.gemm_n else None
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for c in a.configs:
            w = works[c]
            path = str(Path(tmp) / f"policy-{w.shape}")
            make_policy(path, shape=w.shape)
            results[c] = r = profile(path, w, a.threads)
            if gemm:
                r.update(gemm_flops_per_s=gemm, matmul_rates=matmul_rates(r, gemm))
            print(table(results[c], f"{c} ({w.shape}, <= {w.max_tokens} tokens)") + "\n", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print(
        "profile " + " ".join(f"{c}:" + ",".join(f"{g}={results[c]['groups'][g]:.3f}" for g in GROUPS) for c in results)
    )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
