"""Fresh-process checks that share one interpreter's third-party imports (tests/integrations).

``python _forked.py SPEC.json`` imports the heavy third-party packages ``SPEC["preload"]`` once
(torch, transformers, …; ~7 s of CPU here), checks that no module of ``SPEC["forbid"]`` (verl,
gapo, ray) came with them, then runs every case of ``SPEC["cases"]`` in a forked child of that
interpreter: for verl and gapo each child is a fresh process (their first import happens there,
under the case's own environment, working folder and ``sys.argv``), but it does not pay torch's
import again. Each case's stdout and stderr go to ``OUT/NAME.out`` / ``OUT/NAME.err``; the last
stdout line is ``{name: exit status}`` as JSON.

A case: ``{"code": str, "env": {...} | None (keep), "env_update": {...}, "env_drop_prefixes": [...],
"cwd": str | None, "argv": [...], "path0": sys.path[0]}``; ``env`` replaces the whole environment. Cases run one after
another (each child is waited for before the next starts), so their outputs do not interleave.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import signal
import sys
import threading
import traceback


def _child(case: dict, out: str, name: str) -> None:
    try:  # die with the parent (a killed test leaves no child behind)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no libc prctl (not Linux): the child may outlive a killed test
        pass
    fo = os.open(os.path.join(out, f"{name}.out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fe = os.open(os.path.join(out, f"{name}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fo, 1)
    os.dup2(fe, 2)
    rc = 0
    try:
        if case.get("env") is not None:
            os.environ.clear()
            os.environ.update(case["env"])
        for key in list(os.environ):
            if key.startswith(tuple(case.get("env_drop_prefixes", ()))):
                del os.environ[key]
        os.environ.update(case.get("env_update", {}))
        if case.get("cwd"):
            os.chdir(case["cwd"])
        sys.argv = list(case.get("argv", ["-c"]))
        sys.path[0] = case.get("path0", "")  # as `python -c` has it (this file's folder otherwise)
        exec(compile(case["code"], f"<case {name}>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the case's failure, whatever it is, is its exit status
        traceback.print_exc()
        rc = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - the case may have replaced or closed the streams
                pass
        os._exit(rc)


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    for module in spec["preload"]:
        importlib.import_module(module)
    forbid = tuple(spec["forbid"])
    early = sorted(m for m in sys.modules if m.split(".")[0] in forbid)
    assert not early, f"preloading {spec['preload']} imported {early[:10]}: the children would not be fresh"
    # fork copies only this thread; a library thread started by the imports would make that unsafe
    assert threading.active_count() == 1, threading.enumerate()
    status = {}
    for name, case in spec["cases"].items():
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(case, spec["out"], name)
        status[name] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print(json.dumps(status))


def run_cases(preload, forbid, cases, tmp_path, *, timeout, quiet_s, what, env=None):
    """Runs ``cases`` as above from the test process: ``{name: (exit status, stdout, stderr)}``."""

    import timing  # tests/timing.py (on sys.path under pytest)

    out = tmp_path / "forked"
    out.mkdir()
    spec = tmp_path / "forked.json"
    spec.write_text(json.dumps({"preload": preload, "forbid": forbid, "cases": cases, "out": str(out)}))
    proc = timing.run(
        [sys.executable, __file__, str(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        quiet_s=quiet_s,
        what=what,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    status = json.loads(proc.stdout.splitlines()[-1])
    assert list(status) == list(cases), status
    return {n: (rc, (out / f"{n}.out").read_text(), (out / f"{n}.err").read_text()) for n, rc in status.items()}


if __name__ == "__main__":
    main(sys.argv[1])
