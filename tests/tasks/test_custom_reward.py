"""Rewards of your own (gapo.tasks.custom) and the generic data:PATH task, without a model."""

import json
import textwrap

import pytest
import torch

from gapo import tasks
from gapo.exec.scoring import score_batch
from gapo.rl.config import load_config
from gapo.rl.rollout import merge_stats, probe_reward
from gapo.tasks.custom import RewardTask, absolute_spec, with_rewards
from gapo.tasks.reward_fn import check_value, parse_spec

REWARDS = textwrap.dedent("""
    def contains(prompt, completion, ref):
        return 1.0 if ref in completion else 0.0

    def short(prompt, completion, **fields):
        return 1.0 if len(completion) <= 5 else 0.0

    def only_even(prompt, completion, **fields):
        return None if fields["x"] % 2 else 0.5

    def string_one(prompt, completion, **fields):
        return "1"

    def a_bool(prompt, completion, **fields):
        return True

    def nan(prompt, completion, **fields):
        return float("nan")

    def never(prompt, completion, **fields):
        return None

    def raises(prompt, completion, **fields):
        raise KeyError("oops")

    NOT_A_FUNCTION = 3
""")


@pytest.fixture()
def rw(tmp_path):
    p = tmp_path / "my_rewards.py"
    p.write_text(REWARDS)
    return p


@pytest.fixture()
def data(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(
        "".join(json.dumps({"instruction": f"Say {i}", "ref": str(i), "x": i, "extra": "z"}) + "\n" for i in range(40))
    )
    return p


def _task(data, **kw):
    return tasks.build("data", {"path": str(data), "prompt_field": "instruction", "answer_fields": ["ref", "x"], **kw})


def _spec(rw, fn):
    return f"{rw}:{fn}"


def test_data_task_reads_named_columns_and_keeps_only_those(data):
    t = _task(data)
    probs = t.generate("train", 5, 0) + t.generate("eval", 2, 0)
    for p in probs:
        assert p.prompt.startswith("Say ")
        assert set(p.meta["fields"]) == {"instruction", "ref", "x"}  # 'extra' not asked for
        assert p.meta["fields"]["ref"] == p.prompt.split()[1]
    assert {p.prompt for p in t.generate("train", 36, 0)}.isdisjoint({p.prompt for p in t.generate("eval", 2, 0)})


def test_data_task_errors_name_the_file_and_column(data, tmp_path):
    with pytest.raises(ValueError, match=r"d\.jsonl:1: missing field 'nope'"):
        tasks.build("data", {"path": str(data), "prompt_field": "instruction", "answer_fields": ["nope"]})
    with pytest.raises(ValueError, match="no prompt field"):
        bad = tmp_path / "b.jsonl"
        bad.write_text('{"a": 1}\n')
        tasks.build("data", {"path": str(bad)})


def test_data_task_needs_a_reward(data):
    with pytest.raises(ValueError, match="no verifier of its own.*--reward"):
        with_rewards(_task(data), [])


def test_weighted_sum_of_two_rewards_and_each_logged(data, rw):
    t = with_rewards(_task(data), [_spec(rw, "contains"), _spec(rw, "short")], [1.0, 0.5])
    p = t.generate("train", 1, 0)[0]
    ref = p.meta["fields"]["ref"]
    comps = [ref, f"it is {ref} ok", "nothing", "eight!"]
    rewards, stats = score_batch(t, [p] * 4, comps)
    assert rewards == [1.5, 1.0, 0.0, 0.0]  # R = 1·contains + 0.5·short
    assert stats["reward/contains"] == pytest.approx(0.5) and stats["reward/short"] == pytest.approx(0.25)
    assert stats["reward/n_contains"] == 4 and stats["reward/mean"] == pytest.approx(2.5 / 4)


def test_the_pool_scores_custom_rewards_the_same(data, rw):
    t = with_rewards(_task(data), [_spec(rw, "contains"), _spec(rw, "short")], [1.0, 0.5])
    probs = t.generate("train", 6, 0)
    comps = [p.meta["fields"]["ref"] if i % 2 else "no" for i, p in enumerate(probs)]
    serial = score_batch(t, probs, comps, workers=0)
    pooled = score_batch(t, probs, comps, workers=1)  # a spawned worker imports the file itself
    assert serial[0] == pooled[0]
    assert {k: v for k, v in serial[1].items() if k != "time/score_s"} == {
        k: v for k, v in pooled[1].items() if k != "time/score_s"
    }


def test_none_skips_the_term_and_renormalises(data, rw):
    """R = W · Σ_{k∈S} w_k r_k / Σ_{k∈S} w_k: a skipped term keeps R on the same scale."""
    t = with_rewards(_task(data), [_spec(rw, "short"), _spec(rw, "only_even")], [1.0, 1.0])
    pool = t.generate("train", 36, 0)
    odd = next(p for p in pool if p.meta["fields"]["x"] % 2)
    even = next(p for p in pool if p.meta["fields"]["x"] % 2 == 0)
    rewards, stats = score_batch(t, [odd, even], ["ok", "ok"])
    assert rewards == [2.0, 1.5]  # odd: only `short` answered (1.0), rescaled to W = 2; even: 1 + 0.5
    assert stats["reward/n_only_even"] == 1 and stats["reward/only_even"] == 0.5
    never = with_rewards(_task(data), [_spec(rw, "never")])
    r, st = score_batch(never, [odd], ["x"])
    assert r == [0.0] and st["reward/n_unparsable"] == 1 and "reward/never" not in st


def test_the_task_verifier_as_one_term(tmp_path):
    (tmp_path / "pen.py").write_text("def half(prompt, completion, answer):\n    return 0.5\n")
    base = tasks.get("arithmetic")
    t = with_rewards(base, ["task", f"{tmp_path}/pen.py:half"], [1.0, 1.0])
    p = base.generate("train", 1, 0)[0]
    right = str(p.answer)
    rewards, stats = score_batch(t, [p, p], [right, "x"])
    assert rewards == [base.score(p, right) + 0.5, 0.5]
    assert stats["reward/task"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "fn, match",
    [
        ("string_one", r"returned '1' \(a str, not a number\)"),
        ("a_bool", r"returned True \(a bool\)"),
        ("nan", "returned nan; rewards must be finite"),
        ("raises", "KeyError"),
    ],
)
def test_bad_return_values_stop_at_the_probe(data, rw, fn, match):
    t = with_rewards(_task(data), [_spec(rw, fn)])
    with pytest.raises(ValueError, match=match) as e:
        probe_reward(t, t.generate("train", 1, 0), (0.0, 1.0))
    assert fn in str(e.value)


def test_out_of_range_combined_reward_is_an_error_naming_the_range(data, rw):
    t = with_rewards(_task(data), [_spec(rw, "short"), _spec(rw, "short").replace("short", "only_even")])
    with pytest.raises(ValueError, match=r"outside algo.reward_range \[0.0, 1.0\]"):
        probe_reward(t, [p for p in t.generate("train", 36, 0) if p.meta["fields"]["x"] % 2 == 0][:1], (0.0, 1.0))


def test_import_errors_name_the_file_and_function(data, rw, tmp_path):
    probe = _task(data).generate("train", 1, 0)[0]
    for spec, match in [
        (f"{tmp_path}/missing.py:f", "no such file"),
        (_spec(rw, "absent"), r"has no function 'absent'"),
        (_spec(rw, "NOT_A_FUNCTION"), "not a function"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        (_spec(rw, "contains").replace("contains", "short"), None),
    ]:
        if match is None:
            with_rewards(_task(data), [spec], probe=probe)
            continue
        with pytest.raises(ValueError, match=match) as e:
            with_rewards(_task(data), [spec], probe=probe)
        assert spec.rsplit(":", 1)[1] in str(e.value) or "missing.py" in str(e.value)
    broken = tmp_path / "broken.py"
    broken.write_text("import not_installed_pkg_q\n")
    with pytest.raises(ValueError, match=r"importing file .*broken\.py.*ModuleNotFoundError"):
        with_rewards(_task(data), [f"{broken}:f"])


def test_a_missing_field_is_named_before_the_run(data, rw, tmp_path):
    (tmp_path / "needs.py").write_text("def f(prompt, completion, answer):\n    return 1.0\n")
    with pytest.raises(
        ValueError, match=r"needs field\(s\) \['answer'\] but the problems have \['instruction', 'ref', 'x'\]"
    ):
        with_rewards(_task(data), [f"{tmp_path}/needs.py:f"], probe=_task(data).generate("train", 1, 0)[0])


def test_module_from_the_start_directory(tmp_path, monkeypatch, data):
    (tmp_path / "cwd_rewards_mod.py").write_text("def f(prompt, completion, **k):\n    return 0.25\n")
    monkeypatch.chdir(tmp_path)
    t = with_rewards(_task(data), ["cwd_rewards_mod:f"])
    assert t.score(t.generate("train", 1, 0)[0], "x") == 0.25


def test_specs_and_values():
    assert parse_spec("a.b:c") == ("a.b", "c", False)
    assert parse_spec("x/y.py:f") == ("x/y.py", "f", True)
    assert parse_spec("task") == ("task", None, False)
    for bad in ["nocolon", "a:", ":f", "a b:f", "m:1x"]:
        with pytest.raises(ValueError, match="expected module.path:function|neither a module"):
            parse_spec(bad)
    assert absolute_spec("r.py:f").endswith("/r.py:f") and absolute_spec("r.py:f").startswith("/")
    assert check_value("s", 1) == 1.0 and check_value("s", None) is None
    assert check_value("s", torch.tensor(0.5)) == 0.5
    np = pytest.importorskip("numpy")
    assert check_value("s", np.float32(0.25)) == 0.25
    for bad in ["1", b"1", [1.0], np.bool_(True), torch.tensor([1.0, 2.0]), float("inf")]:
        with pytest.raises(ValueError):
            check_value("s", bad)


def test_config_keys_are_validated(tmp_path):
    (tmp_path / "c.py").write_text("def g(prompt, completion):\n    return 0.0\n")
    cfg = load_config(None, [f'reward.funcs=["a.b:f", "{tmp_path}/c.py:g"]', "reward.weights=[1, 0.5]"])
    assert cfg.reward.funcs == ["a.b:f", f"{tmp_path}/c.py:g"] and cfg.reward.weights == [1.0, 0.5]
    for over, match in [
        (["reward.funcs=[a:f]", "reward.weights=[1, 2]"], "2 weight.*for 1 reward"),
        (["reward.funcs=[a:f]", "reward.weights=[-1]"], "finite number >= 0"),
        (["reward.funcs=[a:f]", "reward.weights=[0]"], "at least one weight must be > 0"),
        (["reward.weights=[1]"], "there are no rewards"),
        (["reward.funcs=[a:f, b:f]"], "two rewards named 'f'"),
        (["reward.funcs=[a:mean]"], "reward/mean"),
        (["reward.funcs=[nocolon]"], "expected module.path:function"),
        (["reward.weights=[1, x]"], "reward.weights"),
    ]:
        with pytest.raises(ValueError, match=match):
            load_config(None, over)


def test_per_term_means_merge_by_their_own_counts():
    a = {"reward/n": 4.0, "reward/mean": 1.0, "reward/f": 1.0, "reward/n_f": 1.0}
    b = {"reward/n": 4.0, "reward/mean": 0.0, "reward/f": 0.0, "reward/n_f": 3.0}
    m = merge_stats([(4, a), (4, b)])
    assert m["reward/f"] == pytest.approx(0.25) and m["reward/n_f"] == 4 and m["reward/mean"] == 0.5


def test_reward_task_pickles_without_the_function(data, rw):
    import pickle

    t = with_rewards(_task(data), [_spec(rw, "contains")])
    t.score(t.generate("train", 1, 0)[0], "x")
    back = pickle.loads(pickle.dumps(t))
    assert isinstance(back, RewardTask) and back.terms[0]._fn is None
    assert back.score(t.generate("train", 1, 0)[0], t.generate("train", 1, 0)[0].meta["fields"]["ref"]) == 1.0


@pytest.mark.parametrize("workers", [0, 1])
def test_a_slow_reward_times_out_like_a_verifier(data, tmp_path, workers):
    """The verifiers' timeouts apply: serially the soft alarm, in the pool the worker's alarm (and
    the parent's hard kill behind it); the completion gets reward 0, status timeout."""
    (tmp_path / "slow.py").write_text(
        "import time\ndef slow(prompt, completion, **f):\n"
        "    if completion == 'hang':\n        time.sleep(60)\n    return 1.0\n"
    )
    t = with_rewards(_task(data), [f"{tmp_path}/slow.py:slow"])
    p = t.generate("train", 1, 0)[0]
    rewards, stats = score_batch(t, [p, p], ["hang", "ok"], workers=workers, timeout_s=1.0)
    assert rewards == [0.0, 1.0] and stats["reward/n_timeout"] == 1
    assert stats["reward/n_slow"] == 1 and stats["reward/slow"] == 1.0


def test_config_time_checks_need_no_model(tmp_path):
    with pytest.raises(ValueError, match=r"reward.funcs: reward '.*nowhere.py:f': no such file"):
        load_config(None, [f"reward.funcs=[{tmp_path}/nowhere.py:f]"])
    with pytest.raises(ValueError, match="task 'data' has no verifier of its own"):
        load_config(None, ["task.name=data", f"task.params.path={tmp_path}"])
    with pytest.raises(ValueError, match="does not exist for it"):
        load_config(None, ["task.name=data", "reward.funcs=[task]"])
