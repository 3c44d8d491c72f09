"""ReasoningGymTask: scoring with each dataset's own verifier, extraction, disjoint splits."""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("reasoning_gym")

from gapo.tasks import get  # noqa: E402
from gapo.tasks.rg import ReasoningGymTask, RGScoring, extract_rg_answer  # noqa: E402

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # 2 one-digit terms


@pytest.fixture(scope="module")
def chain():
    return ReasoningGymTask("chain_sum", size=2000, seed=0)


@pytest.mark.parametrize("name", ["basic_arithmetic", "chain_sum", "gcd", "spell_backward", "word_sorting"])
def test_own_answers_score_one_wrong_answers_zero(name):
    task = ReasoningGymTask(name, size=500, seed=1)
    problems = task.generate("train", 8, 0) + task.generate("eval", 4, 0)
    for p in problems:
        assert task.score(p, "Thinking...\n" + task.demonstration(p)) == 1.0, (p.prompt, p.answer)
        assert task.score(p, "<answer>definitely wrong 123456789</answer>") == 0.0
        assert p.prompt.endswith("<answer> and </answer> tags.")
        assert p.meta["entry"]["answer"] == p.answer


def test_whitespace_and_partial_credit():
    # gcd uses reasoning-gym's default scorer: exact match, else len(oracle)/len(answer) when
    # the answer contains the oracle.
    gcd = ReasoningGymTask("gcd", size=2000, seed=0)
    p = gcd.generate("train", 1, 0)[0]
    gold = str(p.answer)
    assert gcd.dataset.score_answer(f" {gold}\n", p.meta["entry"]) < 1.0  # padding penalised
    assert gcd.score_detailed(p, f"<answer>\n  {gold} \n</answer>") == (1.0, "ok")
    assert gcd.score(p, f"<answer>{gold} 0</answer>") == 0.0  # substring: no credit by default
    partial = ReasoningGymTask("gcd", size=2000, seed=0, scoring=RGScoring(partial_credit=True))
    r = partial.score(p, f"<answer>{gold}xx</answer>")
    assert 0.0 < r < 1.0 and r == pytest.approx(len(gold) / (len(gold) + 2))
    # two numbers for a one-number oracle are two answers: no credit, partial or not
    assert partial.score_detailed(p, f"<answer>{gold} 0</answer>") == (0.0, "ambiguous")
    assert partial.score(p, partial.demonstration(p)) == 1.0


def test_extraction():
    assert extract_rg_answer("a <answer>1</answer> b <answer> 2 </answer>") == "2"
    assert extract_rg_answer("reasoning\nso:\n  17  \n\n") == "17"
    assert extract_rg_answer("reasoning\n17", last_line=False) is None
    assert extract_rg_answer("<answer>  </answer>") is None
    assert extract_rg_answer("") is None and extract_rg_answer(None) is None  # type: ignore[arg-type]


def test_unparsable_counted_not_raised(chain):
    p = chain.generate("train", 1, 0)[0]
    assert chain.score_detailed(p, "") == (0.0, "unparsable")
    assert not chain.parse_ok("   \n") and chain.parse_ok("<answer>3</answer>")
    assert chain.first_move("<answer>3</answer>") is None


def test_splits_disjoint_even_when_seeds_overlap():
    # reasoning-gym's item i under seed s is item i-1 under seed s+1: seeds alone overlap.
    task = ReasoningGymTask("chain_sum", SMALL, size=5000, seed=0, eval_fraction=0.3)
    train = task.generate("train", 40, seed=0)
    ev = task.generate("eval", 20, seed=1)
    assert not {p.prompt for p in train} & {p.prompt for p in ev}
    assert len({p.prompt for p in train}) == 40  # distinct within a call
    assert task.generate("train", 10, 5) == task.generate("train", 20, 5)[:10]  # deterministic, prefix-stable
    other_seed = ReasoningGymTask("chain_sum", SMALL, size=5000, seed=1, eval_fraction=0.3)
    assert not {p.prompt for p in other_seed.generate("train", 40, 0)} & {p.prompt for p in ev}


def test_small_space_repeats_with_warning():
    # "a + b" / "a - b" with one-digit a, b: a few hundred questions, fewer in eval.
    task = ReasoningGymTask("chain_sum", SMALL, size=5000, seed=0, eval_fraction=0.05)
    with pytest.warns(UserWarning, match="repeating"):
        ev = task.generate("eval", 100, 0)
    assert len(ev) == 100 and len({p.prompt for p in ev}) < 100


def test_config_kwargs_registry_and_errors():
    task = get("rg", dataset="chain_sum", min_terms=3, max_terms=3, size=100)
    assert task.name == "rg:chain_sum" and task.alphabet is None
    p = task.generate("train", 1, 0)[0]
    assert p.meta["entry"]["metadata"]["num_terms"] == 3
    for call in (ReasoningGymTask, lambda: ReasoningGymTask(name="chain_sum")):  # 0.2 took name= too
        with pytest.raises(TypeError, match="missing 1 required positional argument: 'dataset'"):
            call()
    with pytest.raises(ValueError, match="Did you mean"):
        ReasoningGymTask("chain_sums")
    with pytest.raises(ValueError, match="rejected config"):
        ReasoningGymTask("chain_sum", {"no_such_option": 1})
    with pytest.raises(ValueError, match="rejected config"):
        ReasoningGymTask("chain_sum", {"min_terms": 5, "max_terms": 2})
    with pytest.raises(ValueError, match="seed="):
        ReasoningGymTask("chain_sum", {"seed": 3})


def test_pickle_round_trip_scores(chain):
    p = chain.generate("eval", 1, 0)[0]
    clone = pickle.loads(pickle.dumps(chain))
    assert clone._ds is None
    assert clone.score(p, chain.demonstration(p)) == 1.0


# ----------------------------------------------------------------------------- one answer

# Hedges built from the oracle G and a distractor D: each commits to more than one answer.
RG_HEDGES = [
    "<answer>{g} or {d}</answer>",
    "<answer>{d} or {g}</answer>",
    "<answer>{g}, {d}</answer>",
    "<answer>{g}; {d}</answer>",
    "<answer>{g}\n{d}</answer>",
    "<answer>{g} {d}</answer>",
    "<answer>{g} \\lor {d}</answer>",
    "<answer>\\pm {g}</answer>",
    "<answer>±{g}</answer>",
    "<answer>{g}</answer> <answer>{d}</answer>",
    "<answer>{d}</answer> <answer>{g}</answer>",
    "<answer>either {g} or {d}</answer>",
    "<answer>{g} (or maybe {d})</answer>",
    "<answer>{g} apples and {d} pears</answer>",
    "reasoning\n{g} or {d}",
    "reasoning\n{g}, {d}",
]


@pytest.mark.parametrize("name", ["gsm_symbolic", "chain_sum", "gcd", "basic_arithmetic"])
def test_hedges_score_zero_for_number_oracles(name):
    # gsm_symbolic's own scorer reads the first number of the answer: "<answer>5 or 7</answer>"
    # scored 1.0 for 5 before the one-answer rule.
    task = ReasoningGymTask(name, size=200, seed=0)
    for p in task.generate("train", 3, 0):
        gold = str(p.answer)
        distractor = str(int(float(gold.replace(",", ""))) + 7)
        assert task.score(p, f"<answer>{gold}</answer>") == 1.0
        for hedge in RG_HEDGES:
            for g, d in ((gold, distractor), (distractor, gold)):
                completion = hedge.format(g=g, d=d)
                assert task.score_detailed(p, completion) == (0.0, "ambiguous"), (name, completion)


def test_first_number_scorer_was_gameable_and_agreeing_answers_still_count():
    task = ReasoningGymTask("gsm_symbolic", size=50, seed=0)
    p = task.generate("train", 1, 0)[0]
    gold = str(p.answer)
    assert task.dataset.score_answer(f"{gold} or 1", p.meta["entry"]) == 1.0  # the scorer alone
    assert task.score(p, f"<answer>{gold} or 1</answer>") == 0.0
    assert task.score(p, f"<answer>{gold}</answer> ... <answer> {gold} </answer>") == 1.0  # the same twice


def test_list_oracles_keep_their_own_rules():
    task = ReasoningGymTask("word_sorting", size=50, seed=0)
    p = task.generate("train", 1, 0)[0]
    assert "," in p.answer
    assert task.score(p, task.demonstration(p)) == 1.0
    assert task.score_detailed(p, f"<answer>{p.answer} or {p.answer[::-1]}</answer>") == (0.0, "ambiguous")
    spell = ReasoningGymTask("spell_backward", size=50, seed=0)
    q = spell.generate("train", 1, 0)[0]
    assert spell.score(q, f"<answer>{q.answer}</answer>") == 1.0
    assert spell.score_detailed(q, f"<answer>{q.answer}, {q.answer}x</answer>") == (0.0, "ambiguous")


def test_the_flat_keywords_build_the_task_the_groups_build():
    """``partial_credit``/``last_line`` and ``template``/``max_completion_len`` as keys of their
    own (the task.params spelling, through the registry) build what an RGScoring and a
    PromptFormat build; the dataset's own config keywords still reach the dataset, the groups'
    never do: given to the constructor itself they are a TypeError naming the group."""
    from gapo.tasks.base import PromptFormat

    tpl = "Sum: {question}"
    flags = {"partial_credit": True, "last_line": False}
    flat = get("rg", dataset="chain_sum", size=300, seed=2, template=tpl, max_completion_len=50, **flags, **SMALL)
    grouped = ReasoningGymTask(
        "chain_sum",
        SMALL,
        size=300,
        seed=2,
        scoring=RGScoring(partial_credit=True, last_line=False),
        prompt_format=PromptFormat(tpl, max_completion_len=50),
    )

    def state(t):  # the dataset object has no ==
        return {k: v for k, v in vars(t).items() if k != "_ds"}

    assert state(flat) == state(grouped)
    assert flat.config == SMALL  # the groups' fields are not dataset config
    assert (flat.partial_credit, flat.last_line, flat.template, flat.max_completion_len) == (True, False, tpl, 50)
    a, b = flat.generate("train", 6, 0), grouped.generate("train", 6, 0)
    assert [(p.prompt, p.answer, p.meta) for p in a] == [(p.prompt, p.answer, p.meta) for p in b]
    assert a[0].prompt.startswith("Sum: ")
    p = a[0]
    assert flat.score(p, str(p.answer)) == 0.0  # last_line=False: an untagged answer is no answer
    assert ReasoningGymTask("chain_sum", size=300, seed=2, **SMALL).score(p, str(p.answer)) == 1.0  # the default
    d = ReasoningGymTask("chain_sum", size=300)
    assert (d.partial_credit, d.last_line, d.max_completion_len) == (False, True, 1024)
    for make, field in (
        (lambda: RGScoring(partial_credit="yes"), "partial_credit"),
        (lambda: get("rg", dataset="chain_sum", size=300, last_line=1), "last_line"),
        (lambda: get("rg", dataset="chain_sum", size=300, max_completion_len=-1), "max_completion_len"),
    ):
        with pytest.raises(ValueError, match=field):
            make()
    for kw, group in (("partial_credit", "scoring=RGScoring"), ("template", "prompt_format=PromptFormat")):
        with pytest.raises(TypeError, match=rf"'{kw}' is a field of {group}"):
            ReasoningGymTask("chain_sum", size=300, **{kw: flags.get(kw, tpl)})
