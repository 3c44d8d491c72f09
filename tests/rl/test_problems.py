"""gapo.rl.problems: the order in which a run visits its training pool (reshuffled passes,
checkpointed), and the prompt-length summary the trainer's context check reads."""

import random
from types import SimpleNamespace

from gapo.rl.problems import ProblemOrder, log_filtered, prompt_lengths


def test_each_pass_visits_every_problem_once_in_a_fresh_order():
    pool = list("abcde")
    order = ProblemOrder(len(pool), seed=3)
    passes = [order.next(pool, 5) for _ in range(4)]
    assert all(sorted(p) == pool for p in passes)  # a permutation each pass
    assert len({tuple(p) for p in passes}) > 1  # reshuffled, not one order repeated


def test_the_order_is_python_randoms_shuffle_of_the_seed():
    # the order checkpoints have always carried: random.Random(seed).shuffle(range(n)), pass after pass
    rng, expected = random.Random(7), []
    for _ in range(2):
        idx = list(range(4))
        rng.shuffle(idx)
        expected += idx
    order = ProblemOrder(4, seed=7)
    assert order.next(list(range(4)), 3) + order.next(list(range(4)), 5) == expected


def test_a_batch_crosses_a_pass_boundary_and_the_state_resumes_exactly():
    pool = list(range(6))
    straight = ProblemOrder(6, seed=0)
    first = straight.next(pool, 4)
    saved = straight.state_dict()
    assert set(saved) == {"pos", "order", "py_rng"} and saved["pos"] == 4
    rest = [straight.next(pool, 4) for _ in range(3)]  # 4 + 4 crosses into the second pass

    resumed = ProblemOrder(6, seed=99)  # another seed: everything comes from the state
    resumed.load_state_dict(saved)
    assert [resumed.next(pool, 4) for _ in range(3)] == rest
    assert sorted(first + rest[0][:2]) == pool  # the first pass ended after 6 problems


def test_a_new_pass_follows_the_pool_it_is_given():
    order = ProblemOrder(2, seed=0)
    order.next(["a", "b"], 2)  # the first pass over a pool of two
    assert sorted(order.next(list("abcd"), 4)) == list("abcd")  # resumed with a larger pool


def test_prompt_lengths_name_the_longest_prompt():
    enc = SimpleNamespace(ids=lambda problem: problem.prompt.split())
    pool = [SimpleNamespace(prompt="a b", meta={"task_id": "t0"}), SimpleNamespace(prompt="a", meta={})]
    evals = [SimpleNamespace(prompt="a b c", meta={"task_id": "e0"})]
    train, ev, longest = prompt_lengths(enc, pool, evals)
    assert (train, ev, longest) == ([2, 1], [3], "problem 'e0'")
    assert prompt_lengths(enc, pool, [])[2] == "problem 't0'"
    assert prompt_lengths(enc, [], []) == ([], [], None)


def test_log_filtered_records_the_filter_once(capsys):
    events = []
    folder = SimpleNamespace(log_event=events.append)
    log_filtered(folder, None, 0)
    assert events == [] and capsys.readouterr().err == ""
    f = {"max_prompt_tokens": 9, "train_dropped": 2, "train_prompts": 5, "eval_dropped": 1, "eval_prompts": 4}
    log_filtered(folder, f, 3)
    assert events == [{"event": "filter_prompts", "step": 3, **f}]
    assert "dropped 2 of 5 training prompts and 1 of 4 evaluation" in capsys.readouterr().err
