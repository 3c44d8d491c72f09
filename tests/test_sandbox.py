"""Hostile programs against gapo.sandbox: each must fail within its limits, the parent (this
pytest process) must survive, and nothing outside the sandbox's temporary directory may change.

The bombs are bounded in the programs themselves (a fork tree of depth 6, a fixed 2 GB
allocation, 4 GB of output at most) so that a regression fails a test instead of taking the
machine down. Programs are written so that exit status 0 means *the attack worked*.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from gapo import sandbox

LINUX_ROOT = sys.platform.startswith("linux") and os.geteuid() == 0


def run(program: str, **kw):
    kw.setdefault("timeout_s", 5.0)
    kw.setdefault("memory_mb", 256)
    return sandbox.run(program, **kw)


@pytest.fixture
def sentinel_dir():
    """A world-writable directory *outside* /tmp (so the sandbox can see it) with a
    world-writable sentinel file: only the sandbox's isolation (not permissions) protects it."""
    d = tempfile.mkdtemp(prefix="gapo-sentinel-", dir=sys.prefix)
    os.chmod(d, 0o777)
    path = os.path.join(d, "sentinel.txt")
    with open(path, "w") as f:
        f.write("untouched")
    os.chmod(path, 0o666)
    yield d
    for name in os.listdir(d):
        os.remove(os.path.join(d, name))
    os.rmdir(d)


def _snapshot(d):
    return {n: open(os.path.join(d, n)).read() for n in sorted(os.listdir(d))}


def test_ok_and_failed_and_isolation_reported():
    r = run("print('hello')")
    assert r.passed and r.status == "ok" and r.stdout == "hello\n"
    assert r.isolation, "the layers in force must be reported"
    r = run("raise SystemExit(3)")
    assert not r.passed and r.status == "failed" and r.returncode == 3
    r = run("1/0")
    assert r.status == "failed" and "ZeroDivisionError" in r.stderr
    iso = sandbox.capabilities()
    assert iso.describe()
    if LINUX_ROOT and iso.namespaces:
        assert {"netns", "uid=65534", "RLIMIT_NPROC", "RLIMIT_AS"} <= set(r.isolation)


def test_fork_bomb_is_refused():
    prog = (
        "import os\n"
        "def bomb(depth):\n"
        "    if depth == 0:\n"
        "        return\n"
        "    for _ in range(2):\n"
        "        if os.fork() == 0:\n"
        "            bomb(depth - 1)\n"
        "            os._exit(0)\n"
        "bomb(6)\n"  # at most 2**7 - 1 processes even if forking worked
    )
    t0 = time.monotonic()
    r = run(prog, timeout_s=5)
    assert not r.passed, r
    assert time.monotonic() - t0 < 5
    assert "BlockingIOError" in r.stderr or r.status in ("killed", "timeout")


def test_threads_are_refused():
    r = run("import threading; t = threading.Thread(target=print); t.start(); t.join()")
    assert not r.passed and "can't start new thread" in r.stderr


def test_memory_bomb():
    t0 = time.monotonic()
    r = run("x = bytearray(2 * 1024**3)\nprint(len(x))", memory_mb=256)
    assert not r.passed and r.status == "memory", r
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("prog", ["while True:\n    pass\n",
                                  "import time\nwhile True:\n    time.sleep(0.05)\n"])
def test_infinite_and_sleep_loops_time_out(prog):
    t0 = time.monotonic()
    r = run(prog, timeout_s=1.0)
    wall = time.monotonic() - t0
    assert r.status == "timeout" and not r.passed
    assert wall < 3.0, f"timeout took {wall:.1f}s"


def test_cpu_limit_is_separate_from_wall_clock():
    r = run("while True:\n    pass\n", timeout_s=10.0, cpu_s=1.0)
    assert r.status == "timeout" and r.duration_s < 6.0


def test_files_outside_the_sandbox_are_untouched(sentinel_dir):
    before = _snapshot(sentinel_dir)
    target = os.path.join(sentinel_dir, "sentinel.txt")
    attacks = [
        f"open({target!r}, 'w').write('pwned')",
        f"open({target!r}, 'a').write('pwned')",
        f"import os; os.remove({target!r})",
        f"import os; os.rename({target!r}, {target + '.moved'!r})",
        f"open({os.path.join(sentinel_dir, 'new.txt')!r}, 'w').write('x')",
        f"import shutil; shutil.rmtree({sentinel_dir!r})",
    ]
    results = sandbox.run_many(attacks, timeout_s=5.0, memory_mb=256)
    for prog, r in zip(attacks, results):
        assert not r.passed, (prog, r.stderr)
    assert _snapshot(sentinel_dir) == before


def test_writes_inside_the_workdir_work_and_are_removed():
    before = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("gapo-sbx-")}
    r = run("import os\nopen('out.txt', 'w').write('x' * 1000)\nprint(os.getcwd())")
    assert r.passed, r.stderr
    after = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("gapo-sbx-")}
    assert os.path.basename(r.stdout.strip()) not in after
    assert after <= before | set()  # nothing of ours left behind


def test_file_size_limit():
    r = run("open('big', 'wb').write(b'x' * (64 << 20))", file_size_mb=8, memory_mb=512)
    assert not r.passed and "File too large" in r.stderr


def test_no_network_to_this_machine():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    arrived = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                arrived.append(conn)
            except OSError:
                pass

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        prog = ("import socket\n"
                f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "s.sendall(b'leak')\n")
        r = run(prog)
        assert not r.passed
        time.sleep(0.3)
        assert not arrived, "a sandboxed program connected to the host"
    finally:
        stop.set()
        th.join()
        srv.close()
        for c in arrived:
            c.close()


def test_secrets_in_parent_environment_are_not_visible(monkeypatch):
    secret = "gapo-secret-" + secrets.token_hex(8)
    monkeypatch.setenv("GAPO_TEST_SECRET", secret)
    me = os.getpid()
    prog = (
        "import os, glob\n"
        "print(dict(os.environ))\n"
        f"for p in ['/proc/{me}/environ', '/proc/%d/environ' % os.getppid()]"
        " + glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        print(p, open(p, 'rb').read())\n"
        "    except OSError as e:\n"
        "        print(p, 'denied', e)\n"
    )
    r = run(prog)
    assert secret not in r.stdout and secret not in r.stderr
    assert "GAPO_TEST_SECRET" not in r.stdout


def test_killing_the_parent_fails_and_the_parent_survives():
    me = os.getpid()
    prog = ("import os, signal\n"
            f"for pid in (os.getppid(), {me}, 1):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "    except OSError as e:\n"
            "        print(pid, e)\n"
            "import time; time.sleep(0.2)\n"
            "raise SystemExit(1)\n")
    r = run(prog)
    assert not r.passed
    os.kill(me, 0)  # still here


def test_gigabytes_of_stdout_are_cut_off():
    prog = ("import sys\nchunk = 'x' * (1 << 20)\n"
            "for _ in range(4096):\n    sys.stdout.write(chunk)\n")  # 4 GB at most
    t0 = time.monotonic()
    r = run(prog, output_limit_bytes=1 << 20)
    assert r.status == "output_limit" and not r.passed and r.stdout_truncated
    assert len(r.stdout) <= 1 << 20
    assert time.monotonic() - t0 < 5


def test_gigabytes_of_stderr_are_cut_off():
    prog = ("import sys\nchunk = 'x' * (1 << 20)\n"
            "for _ in range(4096):\n    sys.stderr.write(chunk)\n")
    r = run(prog, output_limit_bytes=1 << 20)
    assert r.status == "output_limit" and len(r.stderr) <= 1 << 20


def test_deep_recursion():
    r = run("def f(n):\n    return f(n + 1)\nf(0)\n")
    assert r.status == "failed" and "RecursionError" in r.stderr
    r = run("import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)\n",
            timeout_s=3.0)
    assert not r.passed


def test_signal_to_itself_is_reported_as_killed():
    r = run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert r.status == "killed" and not r.passed


def test_stdin_is_delivered():
    r = run("import sys\nprint(sys.stdin.read()[::-1])", stdin=b"abc")
    assert r.stdout.strip() == "cba"


def test_run_many_keeps_order_and_bounds_concurrency():
    progs = [f"print({i})" for i in range(6)]
    rs = sandbox.run_many(progs, timeout_s=5.0, memory_mb=256, workers=3)
    assert [r.stdout.strip() for r in rs] == [str(i) for i in range(6)]
    assert sandbox.max_concurrency() >= 1


def test_bad_arguments():
    with pytest.raises(ValueError):
        sandbox.run("print(1)", timeout_s=0, memory_mb=256)


# A pair of processes (``peer=``): main.py holds a secret read from stdin; peer.py, running the
# attacks below, must not get at it nor at main's process, and must have the same limits.
PEER_MAIN = r"""
import json, os
r, w, pid = __gapo_peer__
secret = os.read(0, 100)
os.write(w, b"go\n")
report = json.loads(os.fdopen(r, "rb").readline())
print(json.dumps({"report": report, "leaked": secret.decode() in json.dumps(report)}))
"""
PEER_ATTACKS = r"""
import ctypes, gc, json, os, sys, threading
r, w, main = __gapo_peer__
os.fdopen(r, "rb").readline()
libc = ctypes.CDLL(None, use_errno=True)
got = {"stdin": sys.stdin.read()}
for what in ("mem", "environ", "maps", "fd/0", "fd/3", "fd/4"):
    try:
        with open("/proc/%d/%s" % (main, what), "rb") as f:
            got[what] = f.read(1 << 16).decode("latin-1")
    except OSError as e:
        got[what] = None
got["ptrace_attach"] = libc.ptrace(16, main, 0, 0)  # PTRACE_ATTACH
if hasattr(os, "pidfd_open"):
    fd = os.pidfd_open(main)
    got["pidfd_getfd"] = [libc.syscall(438, fd, n, 0) for n in range(6)]  # pidfd_getfd
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
local = IoVec(ctypes.addressof(buf), 64)
remote = IoVec(0x400000, 64)
got["process_vm_readv"] = libc.process_vm_readv(main, ctypes.byref(local), 1,
                                                ctypes.byref(remote), 1, 0)
try:
    got["fork"] = os.fork()
    if got["fork"] == 0:
        os._exit(0)
except OSError:
    got["fork"] = None
try:
    threading.Thread(target=lambda: None).start()
    got["thread"] = True
except RuntimeError:
    got["thread"] = False
try:
    got["alloc"] = len(bytearray(2 << 30))
except MemoryError:
    got["alloc"] = None
got["secret_in_memory"] = any(b"s3cr3t" in o for o in gc.get_objects() if type(o) is bytes)
os.write(w, (json.dumps(got) + "\n").encode())
"""


def _check_peer_report(out: dict) -> None:
    rep = out["report"]
    assert not out["leaked"] and not rep["secret_in_memory"]
    assert rep["stdin"] == ""
    assert all(rep[k] is None for k in ("mem", "environ", "maps", "fd/0", "fd/3", "fd/4")), rep
    assert rep["ptrace_attach"] == -1 and rep["process_vm_readv"] == -1
    assert all(fd == -1 for fd in rep.get("pidfd_getfd", []))
    assert rep["fork"] is None and rep["thread"] is False and rep["alloc"] is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process isolation")
def test_peer_process_cannot_reach_main():
    r = run(PEER_MAIN, peer=PEER_ATTACKS, stdin=b"s3cr3t")
    assert r.status == "ok" and "peer-process" in r.isolation, r.stderr
    _check_peer_report(json.loads(r.stdout.strip().splitlines()[-1]))


def test_peer_dies_with_main_and_main_decides():
    # The peer leaves the session and sleeps: it must not outlive main nor delay the result.
    peer = "import os, time\nos.setsid()\ntime.sleep(60)\n"
    t0 = time.monotonic()
    r = run("import sys\nsys.exit(3)\n", peer=peer, timeout_s=20.0)
    assert r.status == "failed" and r.returncode == 3
    r = run("print('main')\n", peer="print('peer', flush=True)\n" + peer, timeout_s=20.0)
    assert r.status == "ok" and "main" in r.stdout
    assert time.monotonic() - t0 < 10
    # and a peer that never stops is bounded by the wall clock of the run
    r = run("import os\nos.read(__gapo_peer__[0], 1)\n", peer="while True: pass\n",
            timeout_s=1.0)
    assert r.status == "timeout"


@pytest.mark.skipif(not LINUX_ROOT, reason="exercises the root fallback path")
def test_fallback_without_namespaces():
    """Without namespaces (another OS, a locked-down container) the sandbox still drops to
    nobody, applies rlimits and guards sockets, and says so."""
    code = (
        "import json, sys, gapo.sandbox as s\n"
        "iso = s.capabilities()\n"
        "a = s.run('import socket; socket.socket()', timeout_s=5, memory_mb=256)\n"
        "b = s.run('import os; os.fork()', timeout_s=5, memory_mb=256)\n"
        "c = s.run('import os; print(os.getuid())', timeout_s=5, memory_mb=256)\n"
        "d = s.run(sys.argv[1], peer=sys.argv[2], stdin=b's3cr3t', timeout_s=5, memory_mb=256)\n"
        "print(json.dumps([iso.namespaces, iso.network, a.passed, b.passed, c.stdout,"
        " c.isolation, d.stdout.strip().splitlines()[-1:]]))\n"
    )
    env = dict(os.environ, GAPO_SANDBOX_NO_NAMESPACES="1")
    out = subprocess.run([sys.executable, "-c", code, PEER_MAIN, PEER_ATTACKS], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    ns, network, sock_ok, fork_ok, uid, isolation, peer = json.loads(
        out.stdout.strip().splitlines()[-1])
    assert ns == [] and network == "socket-guard"
    assert not sock_ok and not fork_ok
    assert uid.strip() == "65534" and "socket-guard" in isolation
    assert peer, "the pair of processes did not run"
    _check_peer_report(json.loads(peer[0]))
