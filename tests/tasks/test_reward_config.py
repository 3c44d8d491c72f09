"""What ``reward.*`` settles before a run (gapo.tasks.custom, checked by ``Config.validate``): R's
range from the terms' weights and ranges, names that would overwrite a scoring statistic, and
module specs recorded so that a saved run finds them from any folder."""

import textwrap

import pytest
import torch

from gapo import tasks
from gapo.exec.scoring import STATUSES, UserCodeError, score_batch
from gapo.rl.config import from_dict, load_config, to_dict
from gapo.rl.resume import resume_changes
from gapo.rl.rollout import check_rewards
from gapo.rl.run_dir import RunFolder
from gapo.tasks.custom import check_reward_config, combined_range, with_rewards

TERMS = textwrap.dedent("""
    def top(prompt, completion, **fields):
        return 0.7

    def one(prompt, completion, **fields):
        return 1.0

    def big(prompt, completion, **fields):
        return 1.5

    def penalty(prompt, completion, **fields):  # -1 for "bad", skips "skip", else 0
        return None if completion == "skip" else -1.0 if completion == "bad" else 0.0
""")


@pytest.fixture()
def terms(tmp_path):
    p = tmp_path / "terms.py"
    p.write_text(TERMS)
    return lambda fn: f"{p}:{fn}"


# ---------------------------------------------------------------------------- R's range
@pytest.mark.parametrize(
    "funcs, weights, ranges, expected",
    [
        # the case: task [0, 1] at 1, a format term [0, 1] at 0.1: W = 1.1, R in [0, 1.1]
        (["task", "m:boxed"], [1, 0.1], None, (0.0, 1.1)),
        # no verifier, f [0, 1] and g [-1, 0] at 1 each, W = 2. Only g answers, at -1: R = 2·(-1)/1 = -2;
        # only f, at 1: R = 2; the weighted sum alone would say [-1, 1]
        (["m:f", "m:g"], [1, 1], [[0, 1], [-1, 0]], (-2.0, 2.0)),
        # task [0, 1] at 1 (never skips), penalty [-1, 0] at 0.5, W = 1.5: task 0 and penalty -1 give
        # 1.5·(0 - 0.5)/1.5 = -0.5; task 1 with the penalty skipped 1.5·1/1 = 1.5 (with it: at most 1)
        (["task", "m:p"], [1, 0.5], [[0, 1], [-1, 0]], (-0.5, 1.5)),
        # one term in [0.5, 1]: it may skip, and then R = 0
        (["m:f"], None, [[0.5, 1]], (0.0, 1.0)),
        # a weight-0 verifier answers but does not count: R = f's, or 0 when f skips
        (["task", "m:f"], [0, 1], [[0, 5], [0.2, 0.4]], (0.0, 0.4)),
        # the same range everywhere: the weighted sum [Σ w lo, Σ w hi] = [1·1 + 3·1, 1·2 + 3·2]; a verifier
        # that never skips keeps 0 out
        (["task", "m:f"], [1, 3], [[1, 2], [1, 2]], (4.0, 8.0)),
    ],
)
def test_combined_range_by_hand(funcs, weights, ranges, expected):
    assert combined_range(funcs, weights, ranges) == pytest.approx(expected, abs=1e-12)


def test_the_range_found_is_reached_and_never_left(terms):
    """task + penalty (the third case above): the extremes occur, and every pattern of answers and
    skips stays in [-0.5, 1.5] (the run-time check of algo.reward_range passes)."""
    base = tasks.get("arithmetic")
    p = base.generate("train", 1, 0)[0]
    funcs, weights, ranges = ["task", terms("penalty")], [1, 0.5], [[0, 1], [-1, 0]]
    rr = combined_range(funcs, weights, ranges)
    t = with_rewards(base, funcs, weights, ranges, reward_range=rr)
    right = str(p.answer)
    # task 0, penalty -1: 1.5·(0 − 0.5)/1.5 | task 0, skipped: 0 | task 1, penalty 0: 1.5·1/1.5 | 0
    rewards, _ = score_batch(t, [p] * 4, ["bad", "skip", right, "x"])
    assert rewards == pytest.approx([-0.5, 0.0, 1.0, 0.0])
    lenient = with_rewards(_Lenient(), funcs, weights, ranges, reward_range=rr)
    assert score_batch(lenient, [p], ["skip"])[0] == [1.5]  # right, penalty skipped: 1.5·1/1
    check_rewards("arithmetic", torch.tensor(rewards + [1.5], dtype=torch.float64), [p] * 5, rr)


class _Lenient:
    """A task whose verifier calls every completion right (so "skip" is right, and the penalty skips)."""

    name = "lenient"

    def score(self, problem, completion):
        return 1.0


def test_weights_beyond_the_set_range_are_an_error_before_the_run():
    """The issue's case: reward.weights=[1, 0.1] with algo.reward_range=[0, 1] passed validation and
    the run died at step 2 with "task 'math' returned reward 1.1"."""
    with pytest.raises(ValueError) as e:
        load_config(None, ["reward.funcs=[task, m:boxed]", "reward.weights=[1, 0.1]", "algo.reward_range=[0, 1]"])
    msg = str(e.value)
    assert msg.startswith("algo.reward_range (command line): [0.0, 1.0] does not hold")
    assert "reward.weights [1, 0.1] over ranges [0, 1], [0, 1]" in msg and "R in [0, 1.1]" in msg
    assert "set algo.reward_range=[0, 1.1]" in msg
    # a range that holds R is kept as it is: the user's choice
    cfg = load_config(None, ["reward.funcs=[task, m:boxed]", "reward.weights=[1, 0.1]", "algo.reward_range=[-1, 2]"])
    assert cfg.algo.reward_range == (-1.0, 2.0)


def test_an_unset_range_is_derived_and_says_so():
    cfg = load_config(None, ["reward.funcs=[task, m:boxed]", "reward.weights=[1, 0.1]"])
    assert cfg.algo.reward_range == pytest.approx((0.0, 1.1))
    assert "derived: reward.weights [1, 0.1]" in cfg._where("algo.reward_range")
    assert to_dict(cfg)["algo"]["reward_range"] == cfg.algo.reward_range  # what config.yaml records
    assert load_config(None, []).algo.reward_range == (0.0, 1.0)  # the verifier's own: as before
    assert load_config(None, ["reward.funcs=[m:f]", "reward.ranges=[[-2, 3]]"]).algo.reward_range == (-2.0, 3.0)
    grp = load_config(None, ["reward.funcs=[task, m:f]", "algo.reward_range=group"])
    assert grp.algo.reward_range == "group"  # any scale: nothing to derive
    # a saved config carries its range: validating it again changes nothing
    again = from_dict(to_dict(cfg)).validate()
    assert again.algo.reward_range == cfg.algo.reward_range


@pytest.mark.parametrize(
    "over, match",
    [
        (["reward.ranges=[[0, 1]]"], "reward.ranges: set but there are no rewards"),
        (["reward.funcs=[task]", "reward.ranges=[[0, 1], [0, 1]]"], r"2 range\(s\) for 1 reward"),
        (["reward.funcs=[task]", "reward.ranges=[[1, 0]]"], "finite lo < hi"),
        (["reward.funcs=[task]", "reward.ranges=[[0, inf]]"], "finite lo < hi"),
        (["reward.funcs=[task]", "reward.ranges=[[0, 1, 2]]"], "reward.ranges"),
    ],
)
def test_bad_ranges_are_named(over, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, over)


def test_a_term_outside_its_range_is_named(terms):
    """Not "task 'arithmetic' returned reward 1.5": the term, its value and its range."""
    base = tasks.get("arithmetic")
    p = base.generate("train", 1, 0)[0]
    t = with_rewards(base, ["task", terms("big")], [1, 1], reward_range=(0.0, 2.0))
    # the user's error (UserCodeError: mid-run the trainer checkpoints, then stops with exit 2)
    with pytest.raises(UserCodeError, match=r"reward 'big' \(.*terms.py:big\) returned 1.5, outside \[0, 1\], a term"):
        score_batch(t, [p], ["x"])
    declared = with_rewards(base, ["task", terms("big")], [1, 1], [[0, 1], [0, 2]], reward_range=(0.0, 3.0))
    assert score_batch(declared, [p], ["x"])[0] == [1.5]
    narrow = with_rewards(base, [terms("one")], None, [[0, 0.5]])  # declared: checked under group too
    with pytest.raises(ValueError, match=r"reward 'one' .* outside its range reward.ranges\[0\] = \[0, 0.5\]"):
        score_batch(narrow, [p], ["x"])
    free = with_rewards(base, [terms("big")], reward_range="group")  # undeclared, any scale: unchecked
    assert score_batch(free, [p], ["x"])[0] == [1.5]


@pytest.mark.parametrize(
    "weights, value, rr",
    [
        # 0.1 + 0.1 at 1 each: 0.2·(0.1 + 0.1)/0.2 = 0.20000000000000004 in floating point, past R_max 0.2
        ([0.1, 0.1], "one", (0.0, 0.2)),
        # 1 and 0.1 at 0.7 each: R_max = 1.1·0.7 = 0.77; the formula gives 0.7699999999999999
        ([1.0, 0.1], "top", None),
    ],
)
def test_a_full_success_is_r_max_exactly(terms, weights, value, rr):
    base = tasks.get("arithmetic")
    p = base.generate("train", 1, 0)[0]
    funcs = [terms(value), _alias(terms, value)]
    ranges = [[0, 0.7], [0, 0.7]] if value == "top" else None
    rr = rr or combined_range(funcs, weights, ranges)
    t = with_rewards(base, funcs, weights, ranges, reward_range=rr)
    r, _ = score_batch(t, [p], ["x"])
    assert r == [rr[1]] and t.success_reward == rr[1]  # evaluation counts it: R >= R_max
    check_rewards("arithmetic", torch.tensor(r, dtype=torch.float64), [p], rr)


def _alias(terms, fn):
    """A second term with the same values under another name (two terms may not share a name)."""
    path = terms(fn).rsplit(":", 1)[0]
    with open(path, "a") as f:
        f.write(f"\n{fn}_again = {fn}\n")
    return f"{path}:{fn}_again"


# ---------------------------------------------------------------------------- names
def _stat_names() -> set[str]:
    """Every name gapo.exec.scoring writes under reward/ for a plain task, whatever the statuses."""
    base = tasks.get("arithmetic")
    p = base.generate("train", 1, 0)[0]
    _, stats = score_batch(base, [p, p], [str(p.answer), "x"])
    return {k.split("/", 1)[1] for k in stats if k.startswith("reward/")}


def test_every_scoring_statistic_is_a_forbidden_reward_name():
    names = _stat_names()
    assert {"mean", "n", "n_ambiguous", "ambiguous_frac"} <= names  # what the run overwrote
    for name in sorted(names):
        with pytest.raises(ValueError, match=rf"reward/{name}\b.* one of gapo's scoring statistics"):
            check_reward_config([f"m:{name}"], None)
        if name.startswith("n_"):  # a term named `ambiguous` writes reward/n_ambiguous
            with pytest.raises(ValueError, match=rf"reward/{name} is one of gapo's scoring statistics"):
                check_reward_config([f"m:{name[2:]}"], None)
    for s in STATUSES:
        if s != "ok":
            with pytest.raises(ValueError, match="scoring statistics"):
                load_config(None, [f"reward.funcs=[m:{s}]"])
    check_reward_config(["m:ok", "m:accuracy", "m:n_words_ok"], None)  # no statistic of these names


def test_a_term_named_n_foo_beside_foo_is_an_error():
    with pytest.raises(ValueError, match=r"'foo' and 'n_foo' would both be logged as reward/n_foo"):
        check_reward_config(["a:foo", "b:n_foo"], None)
    with pytest.raises(ValueError, match="reward/n_foo"):
        check_reward_config(["b:n_foo", "a:foo"], None)


# ---------------------------------------------------------------------------- module specs
def test_a_module_beside_the_run_is_recorded_by_its_path(tmp_path, monkeypatch):
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    (start / "rw_beside_run.py").write_text("def f(prompt, completion, **k):\n    return 0.25\n")
    monkeypatch.chdir(start)
    (start / "rel.py").write_text("def g(prompt, completion):\n    return 0.0\n")
    cfg = load_config(None, ["reward.funcs=[task, rw_beside_run:f, json:dumps, rel.py:g]"])
    # found only here: its file; on sys.path (the standard library): unchanged; a file: absolute
    assert cfg.reward.funcs == ["task", f"{start}/rw_beside_run.py:f", "json:dumps", f"{start}/rel.py:g"]
    monkeypatch.chdir(elsewhere)  # gapo eval RUN from another folder: the saved spec still imports
    base = tasks.get("arithmetic")
    t = with_rewards(base, cfg.reward.funcs[1:2])
    assert t.score(base.generate("train", 1, 0)[0], "x") == 0.25
    again = load_config(None, [], base=to_dict(cfg))  # the saved config validates unchanged anywhere
    assert again.reward.funcs == cfg.reward.funcs


def test_a_shadowed_or_packaged_module_in_the_start_folder(tmp_path, monkeypatch):
    (tmp_path / "textwrap.py").write_text("def f(prompt, completion):\n    return 0.0\n")
    (tmp_path / "rwpkg").mkdir()
    (tmp_path / "rwpkg" / "__init__.py").write_text("")
    (tmp_path / "rwpkg" / "terms.py").write_text("def f(prompt, completion):\n    return 0.0\n")
    monkeypatch.chdir(tmp_path)
    # the standard library's textwrap comes first on sys.path: that is what an import gets
    assert load_config(None, ["reward.funcs=[textwrap:f]"]).reward.funcs == ["textwrap:f"]
    with pytest.raises(
        ValueError, match=r"reward.funcs \(command line\): reward 'rwpkg.terms:f': package 'rwpkg' is found only in"
    ):
        load_config(None, ["reward.funcs=[rwpkg.terms:f]"])


def test_resume_sees_no_change_from_recording_the_path(tmp_path, monkeypatch):
    """A run made before specs were recorded saved ``rw_old_run:f``; resumed from its folder, the
    requested config records the file's path, and that is not a change of the config."""
    (tmp_path / "rw_old_run.py").write_text("def f(prompt, completion, **k):\n    return 0.5\n")
    monkeypatch.chdir(tmp_path)
    old = to_dict(load_config(None, []))
    old["reward"]["funcs"] = ["rw_old_run:f"]
    run = tmp_path / "run"
    run.mkdir()
    folder = RunFolder(run)
    folder.write_config(old)
    requested = load_config(None, [], base=folder.saved_config())
    assert requested.reward.funcs == [f"{tmp_path}/rw_old_run.py:f"]
    assert resume_changes(folder, requested, allow_change=False, state={"config": old}) == {}
    folder.release()
