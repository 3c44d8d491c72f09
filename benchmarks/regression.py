"""Golden regression check: small deterministic trainings must reproduce their recorded metrics.

    python benchmarks/regression.py record              # write benchmarks/golden/*.jsonl
    python benchmarks/regression.py check               # rerun everything, compare exactly
    python benchmarks/regression.py check --only demo resume
    python benchmarks/regression.py list

Training is deterministic on CPU, so a change that is meant to leave behaviour alone (a
restructuring, a rename) must reproduce every metric bit for bit. Each *unit* below runs gapo
only through its command line (``python -m gapo.cli ...`` in a child process), never through
module paths, so the check survives moving code between modules. Every unit writes its records
as compact JSON lines; every line carries ``_src`` (the run or artefact it came from). ``check``
compares each record with the golden one exactly (floats equal after a JSON round trip), ignoring
``time/*`` fields, and prints, per source, the first key that differs and the set of keys that
differ anywhere.

Units (about 3 minutes together on 2 quiet CPU cores; 4-5 times that on a busy machine):

- ``demo``: ``gapo demo`` (fixed clipping vs GAPO, the demo's own settings) with fewer steps and
  a smaller evaluation.
- ``grid``: ``gapo compare`` on a tiny grid: regime ``low`` (the shipped preset) × token GAPO,
  GSPO-sequence GAPO (``gspo`` + linear schedule), CISPO and pass@k shaping; regimes
  ``high_mini`` and ``arith_mini`` (the ``high`` preset's SFT mix and RL task, and the grid's
  arithmetic regime, each pretrained for 60 steps from scratch into an empty cache, so
  pretraining is covered too) × token GAPO. Pretraining statistics are compared as well.
- ``resume``: one ``gapo train`` run straight through, the same run stopped by SIGTERM and resumed,
  and the same run killed (SIGKILL) after a periodic checkpoint and resumed; all three must give
  the golden records.
- ``resume_quick``: ``resume``'s SIGTERM-resumed run alone, against ``resume``'s golden records
  (which a straight run recorded): what ``--quick`` and the test suite run. Two training processes
  instead of three; that a resumed run equals the straight one in-process is
  tests/rl/test_trainer.py::test_resume_is_bit_exact, and ``resume`` runs the straight one too.
- ``eval``: ``gapo eval`` of the default base policy (its preset → task resolution).
- ``parity``: values of the verl and TRL adapters (``gapo.integrations.*``): verl's registered
  ``gapo``/``gapo_seq`` losses on a fixed batch (loss, gradient sums, metrics) and two optimiser
  steps of TRL's ``GAPOTrainer`` on a random tiny Qwen2 (its log history; reward range fixed to
  (0, 1), since the adapter's default became the group's own range). Skipped where verl or TRL
  are not installed.

Run it with the interpreter of the environment under test (``.venv/bin/python``). To check
another checkout's code, put its ``src`` first: ``PYTHONPATH=/path/to/src``. Golden values
depend on the CPU and the torch build they were recorded with (``golden/meta.json``: ``torch`` and
``cpu``). On the recording CPU ``check`` is exact; on another one it compares floats to a relative
``--rtol`` (1e-3 by default) and everything else exactly, and says so. For a bit-for-bit check on
another machine, ``record`` from a trusted commit first (``--golden DIR`` keeps those records apart).

Configuration keys renamed by a later change (``algo.eps_high`` → ``algo.eps_high_max``) are
detected at start, by asking the command line (separately for fixed and GAPO schedules), and
applied to every override the units pass; the golden records do not contain config keys.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
IGNORED_PREFIXES = ("time/",)

# --------------------------------------------------------------------------------- the units
# The demo's own overrides come from `gapo demo` itself; only length and evaluation shrink.
DEMO_ARGS = ["--steps", "3", "--eval-every", "2", "--eval-problems", "16", "--eval-samples", "8", "--seed", "0"]

RESUME_OVERRIDES = [
    "model.base_preset=low",
    "train.steps=6",
    "train.prompts=4",
    "train.group_size=4",
    "train.mini_batches=2",
    "train.epochs=2",
    "train.checkpoint_every=2",
    "train.progress=false",
    "train.seed=3",
    "algo.eps_schedule=linear",
    "algo.eps_low=0.2",
    "algo.eps_high=0.28",
    "optim.lr=1e-4",
    "eval.problems=4",
    "eval.samples=2",
    "eval.every=3",
]

EVAL_ARGS = ["--problems", "16", "--n", "8"]

HIGH_MIX = [[{"n_numbers": 2, "num_range": [1, 10]}, 0.25], [{"n_numbers": 3, "num_range": [1, 10]}, 0.75]]
HIGH_TASK = {"n_numbers": 2, "num_range": [1, 10]}
ARITH_TASK = {"digits": 2, "ops": "+-*"}
GRID = {
    "name": "regression",
    "methods": ["gapo", "gapo_seq", "cispo", "passk"],
    "regimes": ["low", "high_mini", "arith_mini"],
    "seeds": [0],
    "workers": 2,
    "method_defs": {
        "cispo": {
            "algo.loss": "cispo",
            "algo.eps_schedule": "fixed",
            "algo.advantage": "drgrpo",
            "algo.advantage_params": {},
            "algo.eps_low": 0.2,
            "algo.eps_high": 0.28,
        },
    },
    "regime_defs": {
        "high_mini": {
            "base": {
                "name": "high_mini",
                "sft_mix": HIGH_MIX,
                "rl_task": HIGH_TASK,
                "pool_size": 200,
                "max_steps": 60,
                "time_budget_s": None,
                "warmup_steps": 10,
            },
            "methods": ["gapo"],
        },
        "arith_mini": {
            "base": {
                "name": "arith_mini",
                "task": "arithmetic",
                "sft_mix": [[ARITH_TASK, 1.0]],
                "rl_task": ARITH_TASK,
                "pool_size": 300,
                "max_steps": 60,
                "time_budget_s": None,
                "warmup_steps": 10,
            },
            "task": {"name": "arithmetic", "params": ARITH_TASK},
            "methods": ["gapo"],
        },
    },
    "common": {
        "optim.lr": 1e-4,
        "train.steps": 3,
        "train.prompts": 8,
        "train.group_size": 8,
        "train.mini_batches": 4,
        "train.epochs": 2,
        "train.checkpoint_every": 0,
        "eval.problems": 8,
        "eval.samples": 4,
        "eval.every": 0,
    },
}

UNITS = ["demo", "grid", "resume", "eval", "parity", "resume_quick"]
FULL = ["demo", "grid", "resume", "eval", "parity"]  # `check` without --only/--quick
# what tests/test_regression.py checks: small enough to finish well inside the test's timeout on a
# busy machine (2 short training processes); the full set stays a benchmark command
QUICK = ["resume_quick"]
GOLDEN_OF = {"resume_quick": "resume"}  # units compared with another unit's golden records


# --------------------------------------------------------------------------------- helpers
class Env:
    """How to call the gapo under test, and the key names it accepts."""

    def __init__(self, work: Path, verbose: bool):
        self.work = work
        self.verbose = verbose
        self.cache = work / "cache"  # empty: presets come from the package, mini presets are trained
        self.env = dict(
            os.environ, GAPO_CACHE=str(self.cache), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1"
        )
        self.renames: dict[str, dict[str, str]] = {"fixed": {}, "gapo": {}}  # by kind of eps schedule

    def gapo(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gapo.cli", *args]

    def run(self, args: list[str], *, timeout: float = 900) -> subprocess.CompletedProcess:
        if self.verbose:
            print("  $ gapo " + " ".join(args[3:]), flush=True)
        p = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout, cwd=self.work)
        if p.returncode != 0:
            raise RuntimeError(f"`{' '.join(args[3:])}` exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        return p

    @staticmethod
    def _kind(schedule: str | None) -> str:
        return "fixed" if schedule in (None, "fixed") else "gapo"

    def key(self, k: str, schedule: str | None = None) -> str:
        return self.renames[self._kind(schedule)].get(k, k)

    def overrides(self, items: list[str]) -> list[str]:
        pairs = [it.partition("=")[::2] for it in items]
        schedule = dict(pairs).get("algo.eps_schedule")
        return [f"{self.key(k, schedule)}={v}" for k, v in pairs]

    def detect_renames(self) -> None:
        """``algo.eps_high`` → ``algo.eps_high_max`` once gapo renames it (the old key is then an
        error naming the new one), asked separately for fixed and GAPO schedules. Each probe fails
        validation on purpose (``train.group_size=1``), so nothing runs."""
        for kind, schedule in (("fixed", "fixed"), ("gapo", "linear")):
            probe = self.gapo(
                "train",
                "--out",
                str(self.work / "probe"),
                f"algo.eps_schedule={schedule}",
                "algo.eps_low=0.2",
                "algo.eps_high=0.28",
                "train.group_size=1",
            )
            p = subprocess.run(probe, env=self.env, capture_output=True, text=True, timeout=300, cwd=self.work)
            msg = p.stdout + p.stderr
            if "must be >= 2" in msg or ("group_size" in msg and "eps_high_max" not in msg):
                continue  # the key was accepted; validation stopped at group_size
            if "eps_high_max" in msg:
                self.renames[kind]["algo.eps_high"] = "algo.eps_high_max"
                print(f"note: with a {kind} schedule, config key algo.eps_high is now algo.eps_high_max", flush=True)
                continue
            raise RuntimeError(f"cannot tell which eps key gapo accepts ({kind} schedule); probe said:\n{msg[-3000:]}")


def normalise(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if not k.startswith(IGNORED_PREFIXES)}


def read_metrics(path: Path, src: str) -> list[dict]:
    out = []
    for ln in path.read_text().splitlines():
        if ln.strip():
            out.append({"_src": src, **normalise(json.loads(ln))})
    return out


def pretrain_stats(cache: Path) -> list[dict]:
    """The loss curve and step count of every base policy trained into ``cache`` (times dropped)."""
    out = []
    for meta in sorted(cache.glob("base/*/gapo_policy.json")):
        extra = json.loads(meta.read_text()).get("extra", {})
        st = dict(extra.get("stats", {}))
        for k in ("train_s", "train_cpu_s", "data_s", "build_s"):
            st.pop(k, None)
        st["curve"] = [[c[0], c[2]] for c in st.get("curve", [])]  # (step, seconds, loss) -> (step, loss)
        name = extra.get("pretrain_config", {}).get("name", meta.parent.name)
        out.append({"_src": f"pretrain/{name}", "cache_key": extra.get("cache_key"), **st})
    return out


# --------------------------------------------------------------------------------- unit runners
def unit_demo(env: Env) -> list[dict]:
    out = env.work / "demo"
    env.run(env.gapo("demo", "--out", str(out), *DEMO_ARGS))
    return [r for m in ("fixed", "gapo") for r in read_metrics(out / m / "metrics.jsonl", f"demo/{m}")]


def unit_grid(env: Env) -> list[dict]:
    import yaml

    grid = json.loads(json.dumps(GRID))
    for m in grid["method_defs"].values():
        schedule = m.get("algo.eps_schedule")
        for k in list(m):
            m[env.key(k, schedule)] = m.pop(k)
    cfg = env.work / "grid.yaml"
    cfg.write_text(yaml.safe_dump(grid, sort_keys=False))
    out = env.work / "grid"
    env.run(env.gapo("compare", "--config", str(cfg), "--out", str(out)))
    recs = []
    for f in sorted(out.glob("**/metrics.jsonl")):
        src = "grid/" + f.parent.relative_to(out).as_posix()
        recs += read_metrics(f, src)
    n_cells = len({r["_src"] for r in recs})
    if n_cells != 6:
        raise RuntimeError(f"grid: expected 6 cells with metrics, found {n_cells}; see {out}")
    return recs + pretrain_stats(env.cache)


def _train_args(env: Env, out: Path, *extra: str) -> list[str]:
    return env.gapo("train", "--out", str(out), *extra, *env.overrides(RESUME_OVERRIDES))


def _n_train(path: Path) -> int:
    if not path.is_file():
        return 0
    return sum(1 for ln in path.read_text().splitlines() if ln.endswith("}") and '"kind": "train"' in ln)


def _interrupt(env: Env, out: Path, sig: int, after: int) -> None:
    """Start the run, send ``sig`` once ``after`` train records are written; it must not finish."""
    if env.verbose:
        print(f"  $ gapo train --out {out} … (signal {sig} after {after} steps)", flush=True)
    p = subprocess.Popen(
        _train_args(env, out), env=env.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=env.work
    )
    log = out / "metrics.jsonl"
    while p.poll() is None and _n_train(log) < after:
        time.sleep(0.01)
    if p.poll() is not None:
        raise RuntimeError(
            f"resume: the run ended before it could be interrupted (rc {p.returncode}):\n{p.stdout.read()[-3000:]}"
        )
    p.send_signal(sig)
    text, _ = p.communicate(timeout=600)
    want = 130 if sig == signal.SIGTERM else -signal.SIGKILL
    if p.returncode != want:
        raise RuntimeError(f"resume: interrupted run exited {p.returncode}, expected {want}:\n{text[-3000:]}")
    if (out / "policy").exists():
        raise RuntimeError("resume: the interrupted run finished anyway")


def _stopped_and_resumed(env: Env, d: Path, sig: int, after: int) -> list[dict]:
    _interrupt(env, d, sig, after)
    env.run(_train_args(env, d, "--resume"))
    return read_metrics(d / "metrics.jsonl", "resume")


def unit_resume(
    env: Env, interruptions=(("term", signal.SIGTERM, 2), ("kill", signal.SIGKILL, 3)), folder: str = "resume"
) -> list[dict]:
    straight = env.work / f"{folder}-straight"
    env.run(_train_args(env, straight))
    golden = read_metrics(straight / "metrics.jsonl", "resume")
    for name, sig, after in interruptions:
        got = _stopped_and_resumed(env, env.work / f"{folder}-{name}", sig, after)
        where = first_difference(golden, got)
        if where:
            raise RuntimeError(
                f"resume: run stopped by {signal.Signals(sig).name} and resumed differs from the straight run: {where}"
            )
    return golden


def unit_eval(env: Env) -> list[dict]:
    p = env.run(env.gapo("eval", *EVAL_ARGS))
    text = p.stdout
    res = json.loads(text[text.index("{") : text.rindex("}") + 1])
    return [{"_src": "eval/low", **normalise(res)}]


PARITY = r"""
import json, math, tempfile
import torch

def num(v):
    if isinstance(v, torch.Tensor):
        v = v.detach().double().mean().item() if v.numel() > 1 else v.item()
    if hasattr(v, "value"):  # verl's Metric
        v = v.value
    if isinstance(v, (list, tuple)):
        return [num(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v

def emit(rec):
    print("@@REC " + json.dumps(rec))

try:
    import verl  # noqa: F401
    have_verl = True
except ImportError:
    have_verl = False
if have_verl:
    import gapo.integrations.verl as gv
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import ActorConfig
    g = torch.Generator().manual_seed(0)
    G, P, T = 8, 4, 16
    B = G * P
    rewards = (torch.rand(B, generator=g) < 0.4).float()
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    r = rewards.view(P, G)
    adv = ((r - r.mean(1, keepdim=True)).reshape(B, 1).expand(B, T) * mask).contiguous()
    old = -torch.rand(B, T, generator=g) * 3.0
    logp = old + torch.randn(B, T, generator=g) * 0.3
    logp_seq = old + torch.randn(B, T, generator=g) * 0.02  # sequence ratios near GSPO's narrow band
    cases = [("gapo", 0.2, 0.2, dict(eps_high_max=0.28, eps_schedule="linear")),
             ("gapo", 0.2, 0.2, dict(eps_high_max=0.28, eps_schedule="log")),
             ("gapo_seq", 3e-3, 3e-3, dict(eps_high_max=5e-3, eps_schedule="linear"))]
    for name, lo, hi, pl in cases:
        for agg in ("token-mean", "seq-mean-token-sum-norm"):
            cfg = ActorConfig(strategy="fsdp", rollout_n=G, ppo_micro_batch_size_per_gpu=1, clip_ratio=lo,
                              clip_ratio_low=lo, clip_ratio_high=hi, loss_agg_mode=agg,
                              policy_loss=gv.GAPOPolicyLossConfig(loss_mode=name, **pl))
            x = (logp_seq if name == "gapo_seq" else logp).clone().requires_grad_(True)
            loss, m = get_policy_loss_fn(name)(old_log_prob=old, log_prob=x, advantages=adv, response_mask=mask,
                                               loss_agg_mode=agg, config=cfg)
            loss.backward()
            emit({"_src": f"verl/{name}/{pl['eps_schedule']}/{agg}", "loss": loss.item(),
                  "grad_sum": x.grad.sum().item(), "grad_abs_sum": x.grad.abs().sum().item(),
                  **{k: num(v) for k, v in sorted(m.items())}})

try:
    import trl  # noqa: F401
    have_trl = True
except ImportError:
    have_trl = False
if have_trl:
    from datasets import Dataset
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from gapo.integrations.trl import GAPOConfig, GAPOTrainer
    alphabet, specials = "abcde+=", ["<pad>", "<bos>", "<eos>", "<unk>"]
    tmp = tempfile.mkdtemp()
    vocab = {t: i for i, t in enumerate(specials + list(alphabet))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.save(tmp + "/tokenizer.json")
    tok = PreTrainedTokenizerFast(tokenizer_file=tmp + "/tokenizer.json", pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<eos>", unk_token="<unk>", padding_side="left")
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                 pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
                     ).save_pretrained(tmp + "/model")

    def frac_a(completions, **kwargs):
        return [c.count("a") / max(len(c), 1) for c in completions]

    # the reward (a share of characters) is not binary; the golden values use the fixed range (0, 1),
    # which gapo at d293606 always used (later versions default to the group's own range)
    fixed_range = {"reward_range": ["0", "1"]} if "reward_range" in GAPOConfig.__dataclass_fields__ else {}
    args = GAPOConfig(output_dir=tmp + "/out", use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                      per_device_train_batch_size=8, num_generations=4, max_completion_length=6, logging_steps=1,
                      learning_rate=3e-2, max_steps=4, num_iterations=2, steps_per_generation=2, seed=0,
                      loss_type="dapo", beta=0.0, epsilon=0.2, eps_high_max=0.28, disable_tqdm=True, **fixed_range)
    data = Dataset.from_list([{"prompt": alphabet[i % 5] + alphabet[(i + 1) % 5] + "="} for i in range(8)])
    tr = GAPOTrainer(model=tmp + "/model", reward_funcs=frac_a, args=args, train_dataset=data, processing_class=tok)
    tr.train()
    for i, h in enumerate(tr.state.log_history):
        emit({"_src": f"trl/log{i}", **{k: num(v) for k, v in sorted(h.items())
                                          if not any(s in k for s in ("runtime", "per_second", "time"))}})
    emit({"_src": "trl/params", "sum": float(sum(p.detach().double().sum() for p in tr.model.parameters())),
          "abs_sum": float(sum(p.detach().double().abs().sum() for p in tr.model.parameters()))})
"""


def unit_parity(env: Env) -> list[dict]:
    if env.verbose:
        print("  $ python -c <verl/TRL adapter values>", flush=True)
    p = subprocess.run(
        [sys.executable, "-c", PARITY], env=env.env, capture_output=True, text=True, timeout=900, cwd=env.work
    )
    if p.returncode != 0:
        raise RuntimeError(f"parity snippet exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return [json.loads(ln[6:]) for ln in p.stdout.splitlines() if ln.startswith("@@REC ")]


def unit_resume_quick(env: Env) -> list[dict]:
    # the SIGTERM-resumed run's records are compared with resume's golden ones (a straight run's);
    # a folder of its own: `check --only resume resume_quick` runs both units in one work folder
    return _stopped_and_resumed(env, env.work / "resume_quick-term", signal.SIGTERM, 2)


# A processor other than the recording one changes floats in their last bits (seen: 1e-7 relative at step 0,
# growing over training steps); a token, reward or count that moves is a real difference at any tolerance.
OTHER_CPU_RTOL = 1e-3

RUNNERS = {
    "demo": unit_demo,
    "grid": unit_grid,
    "resume": unit_resume,
    "eval": unit_eval,
    "parity": unit_parity,
    "resume_quick": unit_resume_quick,
}


# --------------------------------------------------------------------------------- comparison
def _roundtrip(recs: list[dict]) -> list[dict]:
    return [json.loads(json.dumps(r)) for r in recs]


def _by_src(recs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in recs:
        out.setdefault(r["_src"], []).append(r)
    return out


def _where(r: dict) -> str:
    bits = [f"{k}={r[k]}" for k in ("kind", "step") if k in r]
    return f"[{', '.join(bits)}] " if bits else ""


def same(a, b, rtol: float = 0.0) -> bool:
    """Equal after a JSON round trip; with ``rtol > 0`` two floats may differ by ``rtol`` relative
    (ints, bools and strings stay exact). Lists element by element."""
    if a == b:
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, rtol) for x, y in zip(a, b))
    if rtol and isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= rtol * max(abs(a), abs(b)) + 1e-12
    return False


def max_rel_diff(golden: list[dict], got: list[dict]) -> float:
    """The largest relative difference of any float pair (for the report of a tolerant check)."""
    worst = 0.0
    for ra, rb in zip(_roundtrip(golden), _roundtrip(got)):
        for k, a in ra.items():
            b = rb.get(k)
            if isinstance(a, float) and isinstance(b, float) and a != b:
                worst = max(worst, abs(a - b) / max(abs(a), abs(b)))
    return worst


def compare(golden: list[dict], got: list[dict], rtol: float = 0.0) -> dict[str, dict]:
    """Per source: ``{"first": str | None, "keys": sorted differing keys}`` (floats to ``rtol``)."""
    g, n = _by_src(_roundtrip(golden)), _by_src(_roundtrip(got))
    res = {}
    for src in sorted(set(g) | set(n)):
        a, b = g.get(src, []), n.get(src, [])
        first, keys = None, set()
        if not a or not b:
            first = "missing in the " + ("new run" if a else "golden set")
        elif len(a) != len(b):
            first = f"{len(b)} records, golden {len(a)}"
        for ra, rb in zip(a, b):
            for k in list(ra) + [k for k in rb if k not in ra]:
                if k not in rb or k not in ra or not same(ra[k], rb[k], rtol):
                    keys.add(k)
                    if first is None:
                        va = ra.get(k, "<absent>")
                        vb = rb.get(k, "<absent>")
                        first = f"{_where(ra)}{k}: golden {_short(va)}, now {_short(vb)}"
        res[src] = {"first": first, "keys": sorted(keys)}
    return res


def first_difference(golden: list[dict], got: list[dict]) -> str | None:
    for src, d in compare(golden, got).items():
        if d["first"]:
            return f"{src}: {d['first']}"
    return None


def _short(v) -> str:
    s = json.dumps(v)
    return s if len(s) < 80 else s[:77] + "..."


def write_golden(path: Path, recs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in recs))


def read_golden(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def cpu_fingerprint() -> str:
    """What decides the last bits of CPU floats besides the torch build: the kernels torch picks
    (its CPU capability) and the processor (model name and a hash of its feature flags)."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    cap = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    model, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "model name" and not model.startswith("model:"):
                model = "model: " + val.strip()
            elif key.strip() == "flags" and not flags:
                flags = hashlib.sha256(" ".join(sorted(val.split())).encode()).hexdigest()[:12]
    except OSError:
        pass
    return f"{cap}; {model}; flags {flags or '?'}"


def _meta() -> dict:
    # torch's version from its installed metadata (what torch.__version__ says), not by importing
    # it: that alone is ~4 s of CPU; the interpreter under test is asked, with its own sys.path
    code = "import gapo, json, importlib.metadata as m; print(json.dumps([gapo.__file__, m.version('torch')]))"
    where, tv = json.loads(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    return {
        "gapo": where,
        "torch": tv,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_fingerprint(),
    }


# --------------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["record", "check", "list"])
    ap.add_argument("--only", nargs="+", choices=UNITS, help="a subset of the units")
    ap.add_argument("--quick", action="store_true", help=f"only {QUICK}")
    ap.add_argument("--golden", default=str(GOLDEN), help="folder of the golden files")
    ap.add_argument("--keep", help="keep the run folders here (default: a temporary folder, removed)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--note", default="", help="record: stored in golden/meta.json (e.g. the commit recorded from)")
    ap.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="check: compare floats to this relative tolerance (ints, strings and bools stay exact). "
        f"Default: exact when the golden records come from this CPU (meta.json's cpu), else "
        f"{OTHER_CPU_RTOL:g}: another processor changes the last bits of floats, not tokens or counts",
    )
    return ap


def _check_rtol(units: list[str], golden: Path, meta: dict, rtol: float | None) -> float | None:
    """``check``'s float tolerance: ``rtol`` when given, else exact for golden records from this CPU
    and ``OTHER_CPU_RTOL`` for another; ``None`` (after saying so) when a unit has no golden file."""
    missing = [u for u in units if not (golden / f"{GOLDEN_OF.get(u, u)}.jsonl").is_file()]
    if missing:
        print(f"no golden file for {missing} in {golden}; run `record` first", file=sys.stderr)
        return None
    mf = golden / "meta.json"
    gmeta = json.loads(mf.read_text()) if mf.is_file() else {}
    if gmeta.get("torch") != meta["torch"]:
        print(
            f"warning: golden values were recorded with torch {gmeta.get('torch')}, "
            f"this is {meta['torch']}; floats may differ for that reason alone",
            flush=True,
        )
    rtol = rtol if rtol is not None else 0.0 if gmeta.get("cpu") == meta["cpu"] else OTHER_CPU_RTOL
    if rtol:
        print(
            f"golden records from another CPU ({gmeta.get('cpu', 'not recorded')}; this is {meta['cpu']}): "
            f"floats compared to rtol {rtol:g}, ints and strings exactly (a token that moves changes a reward "
            "mean or a pass rate by far more)",
            flush=True,
        )
    return rtol


def _check_unit(u: str, recs: list[dict], golden: Path, rtol: float, dt: float) -> tuple[bool, float]:
    """Compare unit ``u``'s records with its golden file, printing each differing source; returns
    (whether they differ, the largest relative float difference when ``rtol`` is set, else 0)."""
    gold = read_golden(golden / f"{GOLDEN_OF.get(u, u)}.jsonl")
    res = compare(gold, recs, rtol)
    worst = 0.0
    if rtol:
        worst = max_rel_diff(gold, recs)
        print(f"  largest float difference: {worst:.2g} relative")
    bad = {s: d for s, d in res.items() if d["first"]}
    for s, d in bad.items():
        print(f"  DIFF {s}: {d['first']}")
        print(f"       differing keys: {', '.join(d['keys']) or '-'}")
    print(f"  {'differs' if bad else 'identical'}: {len(res) - len(bad)}/{len(res)} sources ({dt:.0f}s)", flush=True)
    return bool(bad), worst


def _run_units(args: argparse.Namespace, units: list[str], env: Env, rtol: float) -> tuple[list[str], float]:
    """Run each unit and record or check it; returns (the failed units, the largest relative float
    difference seen). A unit that raises is reported and failed, the other units go on."""
    golden, failed, worst = Path(args.golden), [], 0.0
    for u in units:
        t0 = time.perf_counter()
        print(f"[{u}]", flush=True)
        try:
            recs = RUNNERS[u](env)
        except Exception as e:  # noqa: BLE001 - reported, the other units go on
            print(f"  ERROR: {e}", flush=True)
            failed.append(u)
            continue
        dt = time.perf_counter() - t0
        if args.command == "record":
            if u in GOLDEN_OF:
                print(f"  (not recorded: {u} is checked against {GOLDEN_OF[u]}'s records)")
                continue
            write_golden(golden / f"{u}.jsonl", recs)
            print(f"  recorded {len(recs)} records from {len({r['_src'] for r in recs})} sources ({dt:.0f}s)")
            continue
        bad, diff = _check_unit(u, recs, golden, rtol, dt)
        worst = max(worst, diff)
        if bad:
            failed.append(u)
    return failed, worst


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "list":
        for u in UNITS:
            print(f"{u:8s} {RUNNERS[u].__name__}")
        return 0
    units = args.only or (QUICK if args.quick else FULL)
    golden = Path(args.golden)
    meta = _meta()
    print(f"gapo under test: {meta['gapo']} (torch {meta['torch']})", flush=True)
    rtol = _check_rtol(units, golden, meta, args.rtol) if args.command == "check" else 0.0
    if rtol is None:
        return 2
    tmp = None
    if args.keep:
        work = Path(args.keep)
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="gapo-regression-")
        work = Path(tmp.name)
    env = Env(work, verbose=not args.quiet)
    env.detect_renames()
    t_all = time.perf_counter()
    try:
        failed, worst = _run_units(args, units, env, rtol)
        if args.command == "record" and not failed:
            meta.pop("gapo")  # a path of this machine
            meta.update(units=[u for u in units if u not in GOLDEN_OF], note=args.note)
            (golden / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    finally:
        if tmp is not None:
            tmp.cleanup()
    # a tolerant check that found no float difference at all was exact after all
    ok = ("all identical" if not worst else f"all equal within rtol {rtol:g}") if args.command == "check" else "done"
    print(f"{'FAILED: ' + ', '.join(failed) if failed else ok} ({time.perf_counter() - t_all:.0f}s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
