"""A grid's cells do not outlive it: a `gapo compare` killed with `kill -9` must not leave its cells
training on (holding their folders' locks, so that the rerun finds them busy). A cell stops as if
the grid had sent it SIGTERM (finish the step, checkpoint, exit 130), and a cell that finds its
folder locked waits for the holder before it answers busy. No torch here: the mechanism runs
before a cell imports it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gapo.experiments import cell
from gapo.experiments.grid_spec import cell_file

# the child: follows its parent as a cell does, records the SIGTERM it gets, else sleeps on
CHILD = r"""
import pathlib, signal, sys, time
if sys.argv[2] == "poll":
    sys.platform = "darwin"  # the fallback where there is no PR_SET_PDEATHSIG: a thread polls getppid()
from gapo.experiments.cell import _stop_with_parent
out = pathlib.Path(sys.argv[1])
def on_term(*a):
    out.write_text("SIGTERM")
    sys.exit(130)
signal.signal(signal.SIGTERM, on_term)
assert _stop_with_parent()
print("ready", flush=True)
time.sleep(120)
out.write_text("slept on")
"""

# the grid stand-in: spawns the child with its pid in the environment (as experiments.pool.spawn does)
PARENT = r"""
import os, subprocess, sys
env = dict(os.environ, GAPO_GRID_PID=str(os.getpid()))
p = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]], env=env,
                     stdout=subprocess.PIPE, text=True)
assert p.stdout.readline().strip() == "ready"
print(p.pid, flush=True)
import time; time.sleep(120)
"""


@pytest.mark.parametrize("how", ["pdeathsig", "poll"])
def test_a_cell_gets_sigterm_when_its_grid_is_killed(tmp_path, how):
    if how == "pdeathsig" and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    mark, child = tmp_path / "child.txt", None
    grid = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(mark), how], stdout=subprocess.PIPE, text=True)
    try:
        child = int(grid.stdout.readline())
        assert not mark.exists()
        os.kill(grid.pid, signal.SIGKILL)  # no handler runs: only the child's own watch can notice
        grid.wait()
        deadline = time.monotonic() + 60  # a failure bound only: a child that never gets SIGTERM
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mark.read_text() == "SIGTERM"
    finally:
        if grid.poll() is None:
            grid.kill()
        grid.wait()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_cell_whose_grid_is_gone_does_nothing(tmp_path):
    d = tmp_path / "easy" / "gapo" / "seed0"
    d.parent.mkdir(parents=True)
    cell_file(d, "json").write_text(json.dumps({"config": {}}))
    before = sorted(p.name for p in d.parent.iterdir())
    # pid 1 is never this child's parent here: as if the grid died between spawn and start
    env = dict(os.environ, GAPO_GRID_PID="1")
    p = subprocess.run([sys.executable, "-m", "gapo.experiments.cell", "--cell", str(d)], env=env, timeout=120)
    assert p.returncode == 130
    assert sorted(p.name for p in d.parent.iterdir()) == before  # no lock file, no run folder, no failed.json


def _hold(folder, seconds: float) -> subprocess.Popen:
    code = (
        "import sys, time\nfrom gapo.rl.run_dir import RunFolder\n"
        "f = RunFolder(sys.argv[1]); f.lock.acquire(); print('held', flush=True); time.sleep(float(sys.argv[2]))\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code, str(folder), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def _invalid_cell(tmp_path):
    d = tmp_path / "easy" / "gapo" / "seed0"
    d.mkdir(parents=True)  # made by the process that holds it (a folder's lock is a file in it)
    # fails its checks once it holds the lock (failed.json), before torch: what it does after the wait
    cell_file(d, "json").write_text(json.dumps({"config": {"train": {"steps": -1}}}))
    return d


def _run_while_held(d, hold_s: float, wait_s: float, monkeypatch) -> tuple[int, int]:
    """``cell._run_cell(d)`` while another process holds ``d``'s lock for ``hold_s`` seconds and the
    cell waits at most ``wait_s``; returns its exit code and the holder's pid."""
    holder = _hold(d, hold_s)
    monkeypatch.setattr(cell, "BUSY_WAIT_S", wait_s)
    try:
        return cell._run_cell(d), holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_a_cell_waits_for_a_stopping_holder(tmp_path, monkeypatch):
    d = _invalid_cell(tmp_path)
    rc, _ = _run_while_held(d, 1.5, 60.0, monkeypatch)
    assert rc == 1  # it got the lock once the holder let go, and ran (here: failed its checks)
    assert "train.steps" in json.loads((d / "failed.json").read_text())["error"]


def test_a_cell_still_held_after_the_wait_is_busy(tmp_path, monkeypatch, capsys):
    d = _invalid_cell(tmp_path)
    rc, pid = _run_while_held(d, 120, 1.0, monkeypatch)
    assert rc == cell.BUSY
    assert not (d / "failed.json").exists()  # nothing written: not this cell's failure
    err = capsys.readouterr().err
    assert f"pid {pid}" in err and "waited 1 s" in err


def test_spawn_tells_the_cell_whose_it_is(tmp_path, monkeypatch):
    from gapo.experiments import pool

    seen = {}

    class FakePopen:
        def __init__(self, argv, env, **kw):
            seen.update(env=env, argv=argv)

    monkeypatch.setattr(pool.subprocess, "Popen", FakePopen)
    p = pool.spawn(["--cell", "x"], tmp_path / "x.log")
    p._log.close()
    assert seen["env"][cell.PARENT_ENV] == str(os.getpid())
    assert seen["argv"][1:3] == ["-m", "gapo.experiments.cell"]
