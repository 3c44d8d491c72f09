"""A run folder has one writer and is never lost: the lock, --overwrite's move-aside, the config a
resume is checked against, symlinked --out, a full disk. Each scenario checks the folder's
contents afterwards (tests/rl/test_run_dir.py's snapshot), not only the message."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_run_dir import BASE, snapshot, train

import timing
from gapo.cli import main
from gapo.rl import run_dir as rd
from gapo.rl import run_lock
from gapo.rl.config import load_config
from gapo.rl.run_dir import MARKER, RunFolder
from gapo.rl.run_lock import RunLock, RunLocked
from gapo.rl.trainer import Trainer

ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# holds the lock of the folder argv[1] (through the public API) until its stdin is closed; with
# argv[2] "resume" it takes it as `gapo train --resume` does, by checking the run
HOLD = (
    "import sys\nfrom gapo.rl.run_dir import RunFolder\nf = RunFolder(sys.argv[1])\n"
    "f.check(resume=True, overwrite=False) if sys.argv[2:] == ['resume'] else f.lock.acquire()\n"
    "print('locked', flush=True)\nsys.stdin.read()\n"
)
# tries once to take the lock of the folder argv[1]: exit 0 (taken, then let go), or 3 and the error
TRY_LOCK = (
    "import sys\nfrom gapo.rl.run_lock import RunLock, RunLocked\ntry:\n    RunLock(sys.argv[1]).acquire()\n"
    "except RunLocked as e:\n    print(e)\n    sys.exit(3)\n"
)


@pytest.fixture
def finished(finished_run):
    """The session's finished 2-step run (tests/conftest.py), shared with test_run_dir: read only."""
    return finished_run


@pytest.fixture
def run(finished, tmp_path):
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(finished, dst)
    return dst


def hold(folder: Path, *how: str) -> subprocess.Popen:
    """Another process holding ``folder``'s lock (``.stdin.close()`` lets go)."""
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder), *how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert p.stdout.readline().strip() == "locked", p.stderr.read()
    return p


def let_go(p: subprocess.Popen) -> None:
    p.stdin.close()
    p.wait(timeout=60)


def try_lock(folder: Path) -> tuple[int, str]:
    """Another process's one attempt at ``folder``'s lock: (0, "") if it got it, else (3, its error)."""
    r = timing.run(
        [sys.executable, "-c", TRY_LOCK, str(folder)], timeout=120, quiet_s=2, capture_output=True, text=True, env=ENV
    )
    assert r.returncode in (0, 3), r.stderr
    return r.returncode, r.stdout


def records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


# ------------------------------------------------------------------ one writer
@pytest.mark.parametrize(
    "flags",
    [["--resume", "--allow-change", "train.steps=3"], ["--overwrite", "train.steps=1"]],
    ids=["resume", "overwrite"],
)
def test_a_second_writer_is_refused_naming_the_holder(run, easy_policy, capsys, flags):
    holder = hold(run)
    try:
        before = snapshot(run)
        extra = [] if flags[0] == "--resume" else [f"model.path={easy_policy}", *BASE]
        assert main(["train", "--out", str(run), *flags[:1], *extra, *flags[1:]]) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid}" in err and "in use" in err and "Traceback" not in err
        assert err.count("error:") == 1
        assert snapshot(run) == before  # nothing read-then-written, nothing moved aside
    finally:
        let_go(holder)


def test_a_fresh_run_into_a_locked_empty_folder_writes_nothing(tmp_path, easy_policy, capsys):
    out = tmp_path / "new"
    out.mkdir()
    holder = hold(out)  # e.g. another process that has just made it for its own run
    try:
        assert train(out, easy_policy, "train.steps=1") == 2
        assert f"pid {holder.pid}" in capsys.readouterr().err
        assert [q.name for q in out.iterdir()] == [".gapo-lock"]  # the holder's lock file, nothing else
    finally:
        let_go(holder)
    assert list(out.iterdir()) == []  # the holder let go: its lock file went with it


def test_of_two_processes_creating_one_folder_one_wins(tmp_path):
    """Both validated while the folder did not exist; both then open it: one makes and holds it, the
    other is refused (locked, or exists), never both writing."""
    go = tmp_path / "go"
    code = (
        "import os, sys, time\nfrom gapo.rl.run_dir import RunFolder\nf = RunFolder(sys.argv[1])\n"
        "f.check(resume=False, overwrite=False)\nprint('checked', flush=True)\n"
        "while not os.path.exists(sys.argv[2]):\n    time.sleep(0.01)\n"
        "try:\n    f.open(overwrite=False)\n"
        "except ValueError as e:\n    print('refused', type(e).__name__, flush=True)\n"
        "else:\n    print('won', flush=True)\n    sys.stdin.read()\n"
    )
    ps = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "r"), str(go)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for _ in range(3)
    ]
    try:
        assert [p.stdout.readline().strip() for p in ps] == ["checked"] * 3
        go.write_text("")
        answers = sorted(p.stdout.readline().split()[0] for p in ps)
    finally:
        for p in ps:
            p.stdin.close()
            p.wait(timeout=60)
    assert answers == ["refused", "refused", "won"]
    assert sorted(q.name for q in (tmp_path / "r").iterdir()) == [MARKER]


# Two real trainers, one folder (a running trainer refuses a second --resume and an --overwrite of
# its folder with its PID; stopped, the run resumes, its steps neither repeated nor lagging the
# checkpoint): tests/rl/test_trainer.py::test_sigterm_checkpoints_and_exits_cleanly, which already
# starts and stops a real trainer process (a second one would add ~10 s of CPU, mostly imports).


def test_a_killed_holders_lock_is_taken_over(run, capsys):
    holder = hold(run)
    holder.kill()  # SIGKILL: its lock file stays, with its pid, but the kernel dropped the lock
    holder.wait()
    lock = run / ".gapo-lock"
    assert json.loads(lock.read_text())["pid"] == holder.pid
    assert main(["train", "--out", str(run), "--resume", "--allow-change", "train.steps=3"]) == 0
    assert not lock.exists()
    assert max(r["step"] for r in records(run)) == 3


def test_lock_takeover_has_no_race(tmp_path, monkeypatch):
    """A process that locks the file just as its holder lets go (and deletes it) must not think it
    holds the lock: the path now names another file, which a third process could lock."""
    (tmp_path / "r").mkdir()
    a, b = RunLock(tmp_path / "r"), RunLock(tmp_path / "r")
    a.acquire()
    with pytest.raises(RunLocked, match=f"pid {os.getpid()}"):
        b.acquire()
    real_flock = run_lock.fcntl.flock
    calls = []

    def flock_after_release(fd, op):
        if not calls:  # b opened the old file; a lets go (and deletes it) before b locks it
            calls.append(fd)
            a.release()
        return real_flock(fd, op)

    monkeypatch.setattr(run_lock.fcntl, "flock", flock_after_release)
    b.acquire()
    assert b.held and len(calls) == 1
    assert os.path.samestat(os.fstat(b._fd), os.stat(b.path))  # b holds the file that is at the path now
    c = RunLock(tmp_path / "r")
    monkeypatch.setattr(run_lock.fcntl, "flock", real_flock)
    with pytest.raises(RunLocked):
        c.acquire()
    b.release()
    c.acquire()
    c.release()
    assert not b.path.exists()


def test_many_processes_racing_for_one_lock_one_wins(tmp_path):
    flag = tmp_path / "hold"
    flag.write_text("")
    (tmp_path / "r").mkdir()
    code = (
        "import sys, os, time\nfrom gapo.rl.run_lock import RunLock, RunLocked\nl = RunLock(sys.argv[1])\n"
        "try:\n    l.acquire()\nexcept RunLocked:\n    print('busy', flush=True)\n    sys.exit(0)\n"
        "print('got', flush=True)\nwhile os.path.exists(sys.argv[2]):\n    time.sleep(0.05)\n"
    )
    ps = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "r"), str(flag)], stdout=subprocess.PIPE, text=True, env=ENV
        )
        for _ in range(4)
    ]
    answers = [p.stdout.readline().strip() for p in ps]
    flag.unlink()
    for p in ps:
        p.wait(timeout=60)
    assert sorted(answers) == ["busy", "busy", "busy", "got"]


def test_a_trainer_refits_only_a_folder_nobody_else_wrote(easy_policy, tmp_path):
    cfg = lambda: load_config(None, [f"model.path={easy_policy}", *BASE, "train.steps=4"])  # noqa: E731
    tr = Trainer(cfg(), tmp_path / "r")
    tr.fit(stop_after=1)
    tr.fit(stop_after=1)  # nobody else wrote it: fine
    Trainer(cfg(), tmp_path / "r", resume=True).fit(stop_after=1)  # another writer, in between
    with pytest.raises(ValueError, match="written by another process"):
        tr.fit(stop_after=1)
    assert torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=False)["step"] == 3


def test_a_busy_compare_cell_writes_nothing(tmp_path):
    from gapo.experiments.cell import BUSY, _run_cell

    cdir = tmp_path / "low" / "gapo" / "seed0"
    cdir.mkdir(parents=True)
    (cdir / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    holder = hold(cdir)
    try:
        before = snapshot(cdir)
        assert _run_cell(cdir) == BUSY
        assert snapshot(cdir) == before and not (cdir / "failed.json").exists()
    finally:
        let_go(holder)


def test_a_second_compare_on_one_grid_folder_is_refused(tmp_path):
    from gapo.experiments.grid import run_grid
    from gapo.experiments.grid_spec import QUICK_GRID, load_grid

    out = tmp_path / "grid"
    out.mkdir()
    holder = hold(out)
    try:
        with pytest.raises(RunLocked, match=f"grid folder .*pid {holder.pid}"):
            run_grid(load_grid(QUICK_GRID), out, say=lambda s: None)
        assert [q.name for q in out.iterdir()] == [".gapo-lock"]  # the holder's
    finally:
        let_go(holder)


# ------------------------------------------------------------------ one lock per folder, whatever the path
@pytest.mark.parametrize("second", ["moved", "symlinked parent"])
def test_a_second_path_to_a_held_folder_meets_its_lock(run, tmp_path, capsys, second):
    """Two `--resume` of one folder through two paths: the second is refused, naming the first's PID.
    'moved': the folder renamed while it is held (the old lock beside the folder named the path)."""
    holder = hold(run, "resume")
    try:
        if second == "moved":
            other = run.with_name("moved")
            os.rename(run, other)
        else:
            (tmp_path / "link").symlink_to(tmp_path)
            other = tmp_path / "link" / run.name
        before = snapshot(other)
        assert main(["train", "--out", str(other), "--resume", "--allow-change", "train.steps=3"]) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid}" in err and "in use" in err and f"{run} resume" in err, err  # its arguments
        assert snapshot(other) == before
    finally:
        let_go(holder)


def _in_mount_namespace(script: str, *args: str) -> subprocess.CompletedProcess:
    """``script`` in a Python of its own in a private mount namespace (an unprivileged user namespace
    mapped to root, so that it may bind-mount), or a skip saying why that is not possible here."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        probe = ["unshare", "--user", "--map-root-user", "--mount", "mount", "--bind", d, d]
        try:
            ok = subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
    if not ok:
        pytest.skip("no bind mounts here (unshare --user --mount is unavailable or not permitted)")
    cmd = ["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-c", script, *args]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    what = "a run in a mount namespace"
    return timing.run(cmd, timeout=600, quiet_s=15, what=what, capture_output=True, text=True, env=env)


BIND_SECOND_PATH = f"""
import subprocess, sys
run, view = sys.argv[1], sys.argv[2]
subprocess.run(["mount", "--bind", run, view], check=True)  # the same folder, a second path
holder = subprocess.Popen([sys.executable, "-c", {HOLD!r}, run, "resume"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "locked"
print(holder.pid, flush=True)
from gapo.cli import main
code = main(["train", "--out", view, "--resume", "--allow-change", "train.steps=3"])
holder.stdin.close()
holder.wait()
sys.exit(code)
"""


def test_a_bind_mounted_second_path_meets_the_lock(run, tmp_path):
    view = tmp_path / "view"
    view.mkdir()
    before = snapshot(run)
    r = _in_mount_namespace(BIND_SECOND_PATH, str(run), str(view))
    assert r.returncode == 2, r.stderr
    pid = int(r.stdout.split()[0])
    assert f"pid {pid}" in r.stderr and "in use" in r.stderr and r.stderr.count("error:") == 1, r.stderr
    assert snapshot(run) == before


READ_ONLY_PARENT = """
import json, subprocess, sys
from pathlib import Path
run, view, policy, base = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
mount = lambda *a: subprocess.run(["mount", *a], check=True)
mount("--bind", str(run.parent), str(view))
mount("-o", "remount,bind,ro", str(view))  # the run's parent, read-only ...
mount("--bind", str(run), str(view / run.name))  # ... the run in it writable
from gapo.cli import main
codes = [main(["train", "--out", str(view / run.name), "--resume", "--allow-change", "train.steps=3"])]
print("=====", file=sys.stderr, flush=True)
codes.append(main(["train", "--out", str(view / "fresh"), f"model.path={policy}", *base, "train.steps=1"]))
print(json.dumps(codes))
"""


def test_a_read_only_parent_does_not_stop_a_resume(run, tmp_path_factory, easy_policy):
    """The old lock beside the folder could not be made there: the resume failed, with 'cannot
    create .../.run.gapo-lock: Read-only file system'. A fresh run there is an error before any work."""
    view = tmp_path_factory.mktemp("view")
    r = _in_mount_namespace(READ_ONLY_PARENT, str(run), str(view), easy_policy, json.dumps(BASE))
    resumed, fresh = r.stderr.split("=====\n")
    assert json.loads(r.stdout.splitlines()[-1]) == [0, 2], r.stderr
    assert "Traceback" not in resumed and max(x["step"] for x in records(run)) == 3
    assert "is not writable (a read-only file system)" in fresh and fresh.count("error:") == 1, fresh
    assert not (run.parent / "fresh").exists() and not (run / ".gapo-lock").exists()


def test_an_overwrite_keeps_the_old_and_the_new_run_locked(run):
    """From the new folder's creation to the old run's deletion or return, both folders are this
    process's: nobody can take the run moved aside (the old lock beside the folder left it free)."""
    before = snapshot(run)
    f = RunFolder(run)
    f.check(resume=False, overwrite=True)
    f.open(overwrite=True)
    (aside,) = [q for q in run.parent.iterdir() if ".replaced-" in q.name]
    assert (aside / "checkpoint.pt").is_file() and not (run / "checkpoint.pt").exists()
    for folder in (aside, run):
        code, err = try_lock(folder)
        assert code == 3 and f"pid {os.getpid()}" in err, (folder, err)
    f.abort()  # the new run failed before its first checkpoint: the old run is back, still locked
    code, err = try_lock(run)
    assert code == 3 and f"pid {os.getpid()}" in err
    f.release()
    assert snapshot(run) == before
    assert try_lock(run)[0] == 0


# ------------------------------------------------------------------ --overwrite never loses a run
def test_overwrite_killed_before_its_first_checkpoint_is_undone(run, easy_policy, capsys):
    """SIGKILL after the new run's first step (no checkpoint yet: checkpoint_every=0): the old run
    was moved aside under a printed name, and the next gapo command on --out puts it back."""
    before = snapshot(run)
    cmd = [
        sys.executable,
        "-m",
        "gapo.cli",
        "train",
        "--out",
        str(run),
        "--overwrite",
        f"model.path={easy_policy}",
        *BASE,
        "train.steps=100000",
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None:
            moved = [q for q in run.parent.iterdir() if ".replaced-" in q.name]  # the new run's folder is up
            if moved and (run / "metrics.jsonl").is_file() and any(r.get("kind") == "train" for r in records(run)):
                break
            time.sleep(0.1)
    finally:
        p.kill()
        err = p.communicate(timeout=60)[1]
    assert any(r.get("kind") == "train" for r in records(run)), err  # the new run had trained a step
    aside = [q for q in run.parent.iterdir() if ".replaced-" in q.name]
    assert len(aside) == 1 and str(aside[0]) in err  # kept, and its name was said
    assert main(["train", "--out", str(run), "--resume"]) == 2  # the old run is back: it is finished
    err = capsys.readouterr().err
    assert "back in place" in err and "is finished" in err
    assert snapshot(run) == before


def test_overwrite_deletes_the_old_run_only_at_the_new_runs_first_checkpoint(run, easy_policy, monkeypatch):
    seen = []
    real = RunFolder.save_checkpoint

    def spy(self, state, need):
        seen.append([q.name for q in run.parent.iterdir() if ".replaced-" in q.name])
        real(self, state, need)
        seen.append([q.name for q in run.parent.iterdir() if ".replaced-" in q.name])

    monkeypatch.setattr(RunFolder, "save_checkpoint", spy)
    cfg = load_config(None, [f"model.path={easy_policy}", *BASE, "train.steps=3", "train.checkpoint_every=2"])
    Trainer(cfg, run, overwrite=True).fit()
    assert len(seen[0]) == 1 and seen[1] == [] and seen[2:] == [[], []]


def test_recovery_of_a_half_done_overwrite(run, finished):
    """The steps of --overwrite called by hand, the process 'dying' at each point between them
    (``release()``: the kernel drops a dead process's locks)."""
    before = snapshot(run)
    f = RunFolder(run)
    f.check(resume=False, overwrite=True)
    f.open(overwrite=True)  # new folder made and in place, old run aside: dies here
    f.release()
    g = RunFolder(run)
    g.check(resume=False, overwrite=True)
    g.release()
    assert snapshot(run) == before  # put back
    # dies once the new folder is made beside the run, before the run is moved aside
    new = run.with_name(f".{run.name}.new-99999-1")
    new.mkdir()
    (new / MARKER).write_text("{}")
    RunFolder(run).check(resume=True, overwrite=False)
    assert snapshot(run) == before
    # dies right after the move-aside, before the new folder is renamed into place
    new.mkdir()
    (new / MARKER).write_text("{}")
    aside = run.with_name(f".{run.name}.replaced-99999-1")
    os.rename(run, aside)
    RunFolder(run).check(resume=True, overwrite=False)
    assert snapshot(run) == before
    # dies while deleting a replaced run (renamed to .discarded- first): the leftover just goes
    trash = run.with_name(f".{run.name}.discarded-99999-1")
    trash.mkdir()
    (trash / "checkpoint.pt").write_bytes(b"partial")
    RunFolder(run).check(resume=True, overwrite=False)
    assert snapshot(run) == before
    # dies once the new run has checkpointed: the new run stays, the old one's leftover goes
    f = RunFolder(run)
    f.check(resume=False, overwrite=True)
    f.open(overwrite=True)
    (run / "checkpoint.pt").write_bytes((finished / "checkpoint.pt").read_bytes())
    f.release()
    RunFolder(run).check(resume=True, overwrite=False)
    assert not [q for q in run.parent.iterdir() if ".replaced-" in q.name] and (run / MARKER).is_file()
    assert not (run / "metrics.jsonl").exists()  # the new run's folder, not the old one's


def test_the_report_names_a_run_left_aside(run):
    from gapo.rl.run_records import load_run

    f = RunFolder(run)
    f.check(resume=False, overwrite=True)
    f.open(overwrite=True)
    f.release()
    (run / MARKER).unlink()
    with pytest.raises(ValueError, match=r"\.replaced-.*--resume` puts it back"):
        load_run(run)


def test_overwrite_without_room_for_a_checkpoint_changes_nothing(run, easy_policy, monkeypatch, capsys):
    before = snapshot(run)
    real = rd.shutil.disk_usage
    monkeypatch.setattr(rd.shutil, "disk_usage", lambda p: real(p)._replace(free=4096))
    assert train(run, easy_policy, "train.steps=1", flags=["--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "not enough free space" in err and "a checkpoint needs about" in err and "Traceback" not in err
    assert snapshot(run) == before
    assert train(run.parent / "fresh", easy_policy, "train.steps=1") == 2  # a fresh run: not even created
    assert not (run.parent / "fresh").exists()


# ------------------------------------------------------------------ resume checks what the run was
@pytest.mark.parametrize(
    "edit,key",
    [
        ({"train": {"seed": 7}}, "train.seed"),
        ({"task": {"params": {"n_numbers": 3}}}, "task.params"),
        ({"optim": {"lr": 0.01}}, "optim.lr"),
    ],
)
def test_a_hand_edited_config_yaml_is_caught_like_an_override(run, capsys, edit, key):
    import yaml

    saved = yaml.safe_load((run / "config.yaml").read_text())
    for section, vals in edit.items():
        for k, v in vals.items():
            if isinstance(v, dict):
                saved[section][k].update(v)
            else:
                saved[section][k] = v
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    before = snapshot(run)
    fixed = key != "optim.lr"  # the task and the seed cannot change even with --allow-change
    assert main(["train", "--out", str(run), "--resume", *(["--allow-change"] if fixed else []), "train.steps=3"]) == 2
    err = capsys.readouterr().err
    assert key in err and "config.yaml" in err and "edited" in err
    assert snapshot(run) == before
    if key == "optim.lr":  # not a key that defines the run: --allow-change applies it
        assert main(["train", "--out", str(run), "--resume", "--allow-change", "train.steps=3"]) == 0
        assert {r["step"]: r["optim/lr"] for r in records(run) if r["kind"] == "train"}[3] == 0.01


def test_a_checkpoint_without_its_config_falls_back_to_config_yaml(run, capsys):
    state = torch.load(run / "checkpoint.pt", weights_only=False)
    del state["config"]
    torch.save(state, run / "checkpoint.pt")
    assert main(["train", "--out", str(run), "--resume", "--allow-change", "train.steps=3"]) == 0
    assert "does not carry its config" in capsys.readouterr().err


def test_a_lost_config_yaml_falls_back_to_the_checkpoints_config(run, capsys):
    (run / "config.yaml").unlink()
    assert main(["train", "--out", str(run), "--resume", "--allow-change", "train.steps=3"]) == 0
    assert "using the config inside" in capsys.readouterr().err
    assert max(r["step"] for r in records(run)) == 3


def test_a_symlink_planted_at_the_lock_name_is_not_followed(run, tmp_path, capsys):
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious")
    (run / ".gapo-lock").symlink_to(target)
    before = snapshot(run)
    assert main(["train", "--out", str(run), "--resume", "--allow-change", "train.steps=3"]) == 2
    assert "cannot lock" in capsys.readouterr().err
    assert target.read_text() == "precious" and snapshot(run) == before


# ------------------------------------------------------------------ symlinked --out
def test_a_symlinked_out_is_resolved(run, easy_policy, tmp_path, capsys):
    link = tmp_path / "elsewhere" / "link"
    link.parent.mkdir()
    link.symlink_to(run)
    assert train(link, easy_policy, "train.steps=1", flags=["--overwrite"]) == 0
    assert link.is_symlink() and link.resolve() == run.resolve()  # the link stays, the run went where it points
    assert max(r["step"] for r in records(run)) == 1
    assert sorted(q.name for q in link.parent.iterdir()) == ["link"]  # no stale link or folder beside it
    assert not [q for q in run.parent.iterdir() if ".replaced-" in q.name or q.name.endswith(".gapo-lock")]
    holder = hold(run)  # the same folder by its two names: one lock
    try:
        assert main(["train", "--out", str(link), "--resume", "--allow-change", "train.steps=2"]) == 2
        assert f"pid {holder.pid}" in capsys.readouterr().err
    finally:
        let_go(holder)


@pytest.mark.parametrize("where", ["out", "parent"])
def test_a_dangling_symlink_out_is_an_error_before_the_model_loads(tmp_path, easy_policy, monkeypatch, capsys, where):
    import gapo.rl.trainer as trainer_mod

    monkeypatch.setattr(trainer_mod, "load_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    out = link if where == "out" else link / "run"
    for flags in ([], ["--overwrite"], ["--resume"]):
        assert train(out, easy_policy, "train.steps=1", flags=flags) == 2
        err = capsys.readouterr().err
        assert "is a symlink to" in err and "does not exist" in err and "Traceback" not in err
    assert sorted(q.name for q in tmp_path.iterdir()) == ["link"]


# ------------------------------------------------------------------ a full disk at a checkpoint
def _torch_full_disk(monkeypatch):
    """torch.save as on a full disk: part of the file written, then its zip writer's RuntimeError."""
    real = torch.save

    def save(obj, f, *a, **k):
        real({"part": torch.zeros(10)}, f)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", save)
    real_du = rd.shutil.disk_usage
    state = {"full": False}
    monkeypatch.setattr(
        rd.shutil, "disk_usage", lambda p: real_du(p)._replace(free=1000) if state["full"] else real_du(p)
    )
    return state


@pytest.mark.parametrize("mode", ["fresh", "resume"])
def test_a_full_disk_at_a_checkpoint_is_one_error_line(easy_policy, tmp_path, monkeypatch, capsys, mode):
    out = tmp_path / "r"
    if mode == "resume":
        assert train(out, easy_policy, "train.steps=1") == 0
        good = (out / "checkpoint.pt").read_bytes()
    full = _torch_full_disk(monkeypatch)
    real_check = RunFolder.check_space

    def fill_after_check(self, need):  # the disk fills during the run, after the start-up check
        real_check(self, need)
        full["full"] = True

    monkeypatch.setattr(RunFolder, "check_space", fill_after_check)
    flags = ["--resume", "--allow-change"] if mode == "resume" else []
    code = (
        main(["train", "--out", str(out), *flags, "train.steps=2"])
        if mode == "resume"
        else train(out, easy_policy, "train.steps=1")
    )
    assert code == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "No space left on device" in lines[0] and "a checkpoint needs about" in lines[0]
    assert f"free in {str(out.resolve())!r}" in lines[0]
    assert not [q.name for q in out.iterdir() if q.name.endswith(".tmp")]
    if mode == "resume":
        assert (out / "checkpoint.pt").read_bytes() == good


def test_a_full_disk_on_an_overwrite_keeps_the_old_run(run, easy_policy, monkeypatch, capsys):
    before = snapshot(run)
    _torch_full_disk(monkeypatch)
    assert train(run, easy_policy, "train.steps=1", flags=["--overwrite"]) == 2
    assert "cannot write the checkpoint" in capsys.readouterr().err
    assert snapshot(run) == before


@contextlib.contextmanager
def _files_cannot_grow_past(limit: int):
    """This process's files cannot grow past ``limit`` bytes while the block runs (RLIMIT_FSIZE's
    soft limit, SIGXFSZ ignored: a write past it fails with EFBIG, as on a full disk); restored after."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_real_write_failure_at_a_checkpoint(easy_policy, finished, tmp_path, capsys):
    """Files that cannot grow past half a checkpoint (RLIMIT_FSIZE: torch's own failure path, as on
    a full disk; nothing mocked): one error line, exit 2, the previous checkpoint intact. In this
    process (a soft limit, lifted after each call): a fresh interpreter per run added only its
    imports (~10 s of CPU)."""
    limit = (finished / "checkpoint.pt").stat().st_size // 2
    out = tmp_path / "r"
    with _files_cannot_grow_past(limit):
        code = main(["train", "--out", str(out), f"model.path={easy_policy}", *BASE, "train.steps=1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.count("error:") == 1, err
    assert "cannot write the checkpoint" in err and "a checkpoint needs about" in err
    assert not (out / "checkpoint.pt").exists() and not [q for q in out.iterdir() if q.name.endswith(".tmp")]
    assert train(out, easy_policy, "train.steps=1", flags=["--overwrite"]) == 0  # a good checkpoint, then resume
    good = (out / "checkpoint.pt").read_bytes()
    capsys.readouterr()
    with _files_cannot_grow_past(limit):
        code = main(["train", "--out", str(out), "--resume", "--allow-change", "train.steps=2"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "cannot write the checkpoint" in err, err
    assert (out / "checkpoint.pt").read_bytes() == good
