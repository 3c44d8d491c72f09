"""exec's process-wide scoring state has one owner, ``gapo.exec.scoring.SHARED``: what one user
(a trainer, a test) closes, the next one gets started again instead of tripping on it."""

from gapo.exec.scoring import SHARED, SharedWorkers, run_with_timeout, score_batch, submit_batch
from gapo.tasks.base import Problem


class ToyTask:
    """Reward = float(completion). Module-level so that spawn workers can unpickle it."""

    name = "toy"

    def parse_ok(self, completion):
        return True

    def score(self, problem, completion):
        return float(completion)


P = Problem(prompt="toy prompt", answer=None)


def _double(x):
    return 2 * x


def test_closing_the_shared_workers_does_not_break_the_next_user():
    task = ToyTask()
    for _ in range(2):  # two "trainers" one after the other, the first closing everything it used
        assert score_batch(task, [P] * 3, ["1", "0", "0.5"], workers=1)[0] == [1.0, 0.0, 0.5]
        assert submit_batch(task, [P] * 2, ["1", "0"], workers=1).result()[0] == [1.0, 0.0]
        assert submit_batch(task, [P] * 2, ["0", "1"], workers=0).result()[0] == [0.0, 1.0]
        assert run_with_timeout(_double, 21, timeout_s=30.0, mode="process") == 42
        pool = SHARED.pool(1)
        SHARED.close()
        assert pool._workers.closed and SHARED._pools == {} and SHARED._helper is None
    # a pool closed behind the owner's back (ScoringPool.close) is replaced on the next use
    SHARED.pool(1).close()
    assert score_batch(task, [P], ["1"], workers=1)[0] == [1.0]
    SHARED.close()


def test_owners_are_independent():
    a, b = SharedWorkers(), SharedWorkers()
    try:
        assert a.pool(1) is a.pool(1) and a.pool(1) is not b.pool(1)
    finally:
        a.close()
        b.close()


class _FakeCgroup:
    def __init__(self):
        self.destroyed = False

    def destroy(self):
        self.destroyed = True


def test_free_cgroups_cap_reuse_clear_and_fork():
    from gapo.exec.sandbox_ns import FREE_CGROUPS, FreeCgroups

    assert isinstance(FREE_CGROUPS, FreeCgroups)
    free = FreeCgroups(cap=2)
    a, b, c = _FakeCgroup(), _FakeCgroup(), _FakeCgroup()
    assert free.put(a) and free.put(b) and not free.put(c) and len(free) == 2  # full: the caller removes c
    assert free.take() is b and free.take() is a and free.take() is None
    free.put(a)
    free._pid = -1  # as seen from a forked child: the parent's cgroups are not reused, nor removed
    assert free.take() is None and not a.destroyed
    free.put(b)
    free.clear()
    assert b.destroyed and len(free) == 0
