"""The default number of torch threads on CPU (``model.threads: null``): measured once per machine.

gapo's CPU work is many small matrix multiplies (a decoding step of a small policy is a few
(64 × 128) × (128 × 512) products), where a second thread helps on some machines (an Intel Xeon
with AVX-512/AMX: the tiny RL step 0.093 s with two threads against 0.132 s with one) and
hurts badly on others (this project's shared 2-core AMD EPYC: up to 40× slower when a neighbour
holds a core; BENCHMARKS.md, section 3). So the default is measured: ``default_threads`` times
a miniature RL step of that shape (8 decoding steps of 64 rows and a log-prob forward and
backward through a 4-layer, hidden-128 Qwen2) at 1, 2,
4, … threads up to the cores this process may use (at most 8), and takes more than one thread
only if it is at least ``margin`` (20%) faster than one thread in *both* of two rounds (a
thread descheduled by a neighbour shows up as a slow round). About a second, once: the answer is
cached in ``$GAPO_CACHE/threads.json`` (default ``~/.cache/gapo``) under the CPU model, the
number of usable cores and the torch version, so every later run on the machine uses the same
count (thread counts can change float rounding, so a machine's runs stay comparable).
The probe runs a fraction of a second and cannot see a neighbour that takes a core a minute
later, which is what made two threads erratic on the shared machine; so at every start-up the
cached count is also capped by the cores idle right now, ``cores − 1-minute load average``
(rounded, at least 1). On this project's 2-core machine the probe alone measured two threads
45% faster, while the load average of 2–7 left no idle core: one thread, as measured for the
RL step (BENCHMARKS.md, section 3).

``GAPO_THREADS=<n>``, else an explicit ``OMP_NUM_THREADS=<n>`` (which torch itself follows),
overrides both the probe and the cache.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from gapo.policy.base_policy import cache_root
from gapo.policy.logprobs import logprobs
from gapo.policy.sampling import SamplingParams, sample

__all__ = ["default_threads", "probe"]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover
        pass
    return platform.processor() or platform.machine()


def _key() -> str:
    return f"{_cpu_model()}|cores={_cores()}|torch={torch.__version__}"


def _cache_file() -> Path:
    return cache_root() / "threads.json"


def _workload(reps: int = 1):
    # a miniature RL step of the embedded policy's shape (hidden 128, 4 layers): 8 KV-cached
    # decoding steps of 64 rows, then a forward and backward of the log-probs
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=32,
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=64,
        )
    )
    prompts = torch.randint(4, 32, (64, 8), generator=torch.Generator().manual_seed(0))

    def run():
        for _ in range(reps):
            ro = sample(model, prompts, params=SamplingParams(8), generator=torch.Generator().manual_seed(0))
            lp, _ = logprobs(model, ro.input_ids, ro.attention_mask, 8, entropy_grad=False)
            lp.sum().backward()
            model.zero_grad(set_to_none=True)

    return run


def _time(run, candidates, secs, rounds, repeats, before) -> None:
    try:
        for _ in range(rounds):
            for n in candidates:
                torch.set_num_threads(n)
                run()  # warm-up at this count (thread pool start)
                ts = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    run()
                    ts.append(time.perf_counter() - t0)
                secs[n].append(statistics.median(ts))
    finally:
        torch.set_num_threads(before)


def probe(candidates: list[int] | None = None, *, rounds: int = 2, repeats: int = 3, margin: float = 0.2) -> dict:
    """Time the probe at each thread count; returns ``{"threads": best, "seconds": {n: [round medians]}}``.
    The thread setting is restored afterwards."""
    if candidates is None:
        cores = min(_cores(), 8)
        candidates = [n for n in (1, 2, 4, 8) if n <= cores]
    before = torch.get_num_threads()
    secs: dict[int, list[float]] = {n: [] for n in candidates}
    with torch.random.fork_rng(devices=[]):  # the probe's model and draws leave the global stream alone
        _time(_workload(), candidates, secs, rounds, repeats, before)
    base = secs[candidates[0]]
    ok = [n for n in candidates[1:] if all(s <= (1 - margin) * b for s, b in zip(secs[n], base))]
    best = min(ok, key=lambda n: max(secs[n])) if ok else candidates[0]
    return {"threads": best, "seconds": secs}


def default_threads(*, cache: bool = True) -> int:
    """The thread count for ``model.threads: null`` on CPU: ``GAPO_THREADS``, else
    ``OMP_NUM_THREADS``, else the probe's count for this machine (cached, or measured and then
    cached), capped by the cores idle now."""
    for var in ("GAPO_THREADS", "OMP_NUM_THREADS"):
        env = os.environ.get(var, "").strip()
        if env:
            if not env.isdigit() or int(env) < 1:
                raise ValueError(f"{var} must be a positive integer, got {env!r}")
            return int(env)
    if _cores() <= 1:
        return 1
    return max(1, min(_probed(cache), round(_cores() - os.getloadavg()[0])))


def _probed(cache: bool) -> int:
    """The probe's thread count for this machine, from the cache or measured (then cached)."""
    key, path = _key(), _cache_file()
    table = {}
    if cache:
        try:
            table = json.loads(path.read_text())
            return int(table[key]["threads"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    res = probe()
    if cache:
        table[key] = {
            "threads": res["threads"],
            "seconds": {str(k): v for k, v in res["seconds"].items()},
            "load_average": os.getloadavg()[0],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps(table, indent=1)
            # written whole then renamed, so a concurrent reader sees the old table or the new one
            # (gapo.rl.run_dir.atomic_write's scheme; rl is above this package)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            try:
                tmp.write_text(text)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
        except OSError:  # a read-only cache: the probe runs again next time
            pass
    return res["threads"]
