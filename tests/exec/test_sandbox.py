"""Hostile programs against gapo.exec.sandbox: each must fail within its limits, the parent (this
pytest process) must survive, and nothing outside the sandbox's temporary directory may change.

The bombs are bounded in the programs themselves (a fork tree of depth 6, a fixed 2 GB
allocation, 4 GB of output at most) so that a regression fails a test instead of taking the
machine down. Programs are written so that exit status 0 means *the attack worked*.

No test bounds wall-clock time (a busy machine, a CI runner sharing its cores, would miss any
such bound): what ended a run is read from its status and exit code (the parent's SIGKILL at the
wall clock vs SIGXCPU), CPU time from ``getrusage`` of the waited-for children, and waits for
something to happen are poll loops with a generous deadline. Time-outs of runs that must *not*
time out are generous too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from gapo.exec import sandbox

LINUX_ROOT = sys.platform.startswith("linux") and os.geteuid() == 0


LIMITS = sandbox.Limits(timeout_s=30.0, memory_mb=256)  # generous: only tests of the time-out itself set less


def run(program: str, limits: sandbox.Limits = LIMITS, *, stdin: bytes | None = None, peer: str | None = None):
    return sandbox.run(program, limits, stdin=stdin, peer=peer)


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
    r = run(prog, sandbox.Limits(timeout_s=60, memory_mb=256))
    assert not r.passed, r
    # refused at the first fork, not stopped by the (generous) wall clock
    assert r.status != "timeout" and ("BlockingIOError" in r.stderr or r.status == "killed"), r


def test_threads_are_refused():
    r = run("import threading; t = threading.Thread(target=print); t.start(); t.join()")
    assert not r.passed and "can't start new thread" in r.stderr


def test_memory_bomb():
    r = run("x = bytearray(2 * 1024**3)\nprint(len(x))", sandbox.Limits(timeout_s=60, memory_mb=256))
    assert not r.passed and r.status == "memory", r  # MemoryError at once, not a time-out


# Both loops end by themselves after 120 s (exit 0: "passed"), so a broken wall clock fails the
# test instead of hanging it.
@pytest.mark.parametrize(
    "prog",
    [
        "import time\nt = time.monotonic() + 120\nwhile time.monotonic() < t:\n    pass\n",
        "import time\nfor _ in range(2400):\n    time.sleep(0.05)\n",
    ],
    ids=["busy", "sleep"],
)
def test_infinite_and_sleep_loops_time_out(prog):
    r = run(prog, sandbox.Limits(timeout_s=1.0, memory_mb=256, cpu_s=60.0))
    assert r.status == "timeout" and not r.passed, r
    # the parent's SIGKILL at the wall-clock deadline (not SIGXCPU: cpu_s is far away), and
    # never before that deadline
    assert r.returncode == -signal.SIGKILL and r.duration_s >= 1.0, r


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def test_cpu_limit_is_separate_from_wall_clock():
    """``cpu_s`` bounds CPU time, ``timeout_s`` wall time. Checked through what ended each run
    and the CPU time the sandbox's processes used (``getrusage`` of this process's children:
    the bootstrap waits for PID 1, which waits for the program), never through wall time, which
    a busy machine stretches at will (2 CPU-seconds took 10 s there)."""
    before = _children_cpu_s()
    r = run("while True:\n    pass\n", sandbox.Limits(timeout_s=300.0, memory_mb=256, cpu_s=1.0))
    used = _children_cpu_s() - before
    assert r.status == "timeout", r
    # SIGXCPU (raised by RLIMIT_CPU; 128 + signal when mirrored by the sandbox's PID 1), not the
    # parent's SIGKILL at the wall clock
    assert r.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU), r
    # RLIMIT_CPU = ceil(cpu_s) + 1 s soft, + 1 s hard; the rest is interpreter start-up
    assert 1.0 <= used < 8.0, used
    # and an idle program is not stopped by the CPU limit, although it outlives cpu_s
    before = _children_cpu_s()
    r = run("import time\ntime.sleep(3.0)\nprint('woke')\n", sandbox.Limits(timeout_s=300.0, memory_mb=256, cpu_s=1.0))
    assert r.status == "ok" and r.stdout.strip() == "woke", r
    assert _children_cpu_s() - before < 3.0


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
    results = sandbox.run_many(attacks, sandbox.Limits(timeout_s=5.0, memory_mb=256))
    for prog, r in zip(attacks, results):
        assert not r.passed, (prog, r.stderr)
    assert _snapshot(sentinel_dir) == before


def test_writes_inside_the_workdir_work_and_are_removed():
    # this process's work folders only (gapo-sbx-<pid>-*): other processes (a parallel test worker,
    # another suite) make and remove their own meanwhile
    ours = f"gapo-sbx-{os.getpid()}-"
    before = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(ours)}
    r = run("import os\nopen('out.txt', 'w').write('x' * 1000)\nprint(os.getcwd())")
    assert r.passed, r.stderr
    assert os.path.basename(r.stdout.strip()).startswith(ours)  # the prefix the filter relies on
    after = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(ours)}
    assert os.path.basename(r.stdout.strip()) not in after
    assert after <= before | set()  # nothing of ours left behind


def test_file_size_limit():
    r = run("open('big', 'wb').write(b'x' * (64 << 20))", sandbox.Limits(timeout_s=30.0, memory_mb=512, file_size_mb=8))
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
        prog = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'leak')\n"
        r = run(prog)
        assert not r.passed
        time.sleep(0.3)  # the accept loop's turn (a connection made would be queued already)
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
    prog = (
        "import os, signal\n"
        f"for pid in (os.getppid(), {me}, 1):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError as e:\n"
        "        print(pid, e)\n"
        "import time; time.sleep(0.2)\n"
        "raise SystemExit(1)\n"
    )
    r = run(prog)
    assert not r.passed
    os.kill(me, 0)  # still here


def test_gigabytes_of_stdout_are_cut_off():
    prog = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(4096):\n    sys.stdout.write(chunk)\n"  # 4 GB at most
    r = run(prog, sandbox.Limits(timeout_s=120, memory_mb=256, output_limit_bytes=1 << 20))
    # killed at the cap (a time-out or "ok" would mean the 4 GB were pumped)
    assert r.status == "output_limit" and not r.passed and r.stdout_truncated
    assert len(r.stdout) <= 1 << 20


def test_gigabytes_of_stderr_are_cut_off():
    prog = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(4096):\n    sys.stderr.write(chunk)\n"
    r = run(prog, sandbox.Limits(timeout_s=30.0, memory_mb=256, output_limit_bytes=1 << 20))
    assert r.status == "output_limit" and len(r.stderr) <= 1 << 20


def test_deep_recursion():
    r = run("def f(n):\n    return f(n + 1)\nf(0)\n")
    assert r.status == "failed" and "RecursionError" in r.stderr
    r = run(
        "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)\n",
        sandbox.Limits(timeout_s=3.0, memory_mb=256),
    )
    assert not r.passed


def test_signal_to_itself_is_reported_as_killed():
    r = run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert r.status == "killed" and not r.passed


def test_stdin_is_delivered():
    r = run("import sys\nprint(sys.stdin.read()[::-1])", stdin=b"abc")
    assert r.stdout.strip() == "cba"


def test_run_many_keeps_order_and_bounds_concurrency():
    progs = [f"print({i})" for i in range(6)]
    rs = sandbox.run_many(progs, sandbox.Limits(timeout_s=5.0, memory_mb=256), workers=3)
    assert [r.stdout.strip() for r in rs] == [str(i) for i in range(6)]
    assert sandbox.max_concurrency() >= 1


@pytest.mark.parametrize(
    "field, value",
    [
        ("timeout_s", 0),
        ("timeout_s", -1.0),
        ("timeout_s", float("nan")),
        ("timeout_s", float("inf")),
        ("timeout_s", "5"),
        ("memory_mb", 0),
        ("memory_mb", 256.0),
        ("memory_mb", True),
        ("cpu_s", 0),
        ("file_size_mb", -1),
        ("tmpfs_mb", 0),  # tmpfs size=0 would mean no limit
        ("output_limit_bytes", -1),
    ],
)
def test_a_bad_limit_names_the_field(field, value):
    kw = {"timeout_s": 5.0, "memory_mb": 256, field: value}
    with pytest.raises(ValueError, match=f"sandbox limit {field} "):
        sandbox.Limits(**kw)


def test_the_limits_have_one_spelling(tmp_path, monkeypatch):
    """run and run_many take the limits as one sandbox.Limits: 0.2's keyword spelling
    (``run(program, timeout_s=5, memory_mb=256)``), no limits, or anything that is not a Limits is
    a TypeError naming it, raised before any work (no scratch directory, no sandbox started)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a scratch directory would go
    monkeypatch.setattr(sandbox, "_run", None)  # calling it would be a TypeError of another kind
    for call in (
        lambda: sandbox.run("print(1)", timeout_s=5, memory_mb=256),
        lambda: sandbox.run("print(1)", LIMITS, cpu_s=1),
        lambda: sandbox.run_many(["print(1)"], LIMITS, timeout_s=5),
    ):
        with pytest.raises(TypeError, match="unexpected keyword argument '(timeout_s|cpu_s)'"):
            call()
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'limits'"):
        sandbox.run("print(1)")
    for bad in (None, {"timeout_s": 5, "memory_mb": 256}, (5, 256)):
        with pytest.raises(TypeError, match=f"run\\(\\): limits must be a sandbox.Limits, got {type(bad).__name__}"):
            sandbox.run("print(1)", bad)
        with pytest.raises(
            TypeError, match=f"run_many\\(\\): limits must be a sandbox.Limits, got {type(bad).__name__}"
        ):
            sandbox.run_many(["print(1)"], bad)
    assert os.listdir(tmp_path) == []


def test_the_boot_config_applies_each_limit():
    """What the bootstrap is told, from one Limits: the CPU rlimit is cpu_s (default timeout_s)
    rounded up plus one second, SIGKILL a second later; sizes in MiB."""
    iso = sandbox.Isolation(sys.platform, False, (), None, None)
    limits = sandbox.Limits(2.5, 128, file_size_mb=8, tmpfs_mb=32)
    cfg = sandbox._boot_config(iso, "/w", limits, peer=False, cgroup=None)
    assert cfg["rlimits"]["RLIMIT_CPU"] == [4, 5]
    assert cfg["rlimits"]["RLIMIT_AS"] == 128 << 20 and cfg["rlimits"]["RLIMIT_FSIZE"] == 8 << 20
    assert cfg["tmpfs_mb"] == 32 and cfg["peer"] is False
    cfg = sandbox._boot_config(iso, "/w", sandbox.Limits(300, 256, cpu_s=1), peer=True, cgroup=None)
    assert cfg["rlimits"]["RLIMIT_CPU"] == [2, 3] and cfg["rlimits"]["RLIMIT_FSIZE"] == 16 << 20
    assert cfg["tmpfs_mb"] == 64 and cfg["peer"] is True


def test_a_limits_object_reaches_the_run():
    prog = "import sys\nprint('x' * 5000)\n"
    capped = sandbox.run(prog, sandbox.Limits(timeout_s=30.0, memory_mb=256, output_limit_bytes=1000))
    assert capped.status == "output_limit" and capped.stdout_truncated and len(capped.stdout) <= 1000
    base = sandbox.Limits(timeout_s=30.0, memory_mb=256)
    a, b = sandbox.run_many([prog, "print(2)"], dataclasses.replace(base, output_limit_bytes=1000))
    assert (a.status, b.status, b.stdout) == ("output_limit", "ok", "2\n")
    assert sandbox.run(prog, base).status == "ok"  # the default cap (1 MiB) lets 5000 bytes through


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
    # The peer leaves the session and sleeps: it must not outlive main nor delay the result
    # (a delayed result would be the wall clock's: status "timeout").
    peer = "import os, time\nos.setsid()\ntime.sleep(600)\n"
    r = run("import sys\nsys.exit(3)\n", sandbox.Limits(timeout_s=120.0, memory_mb=256), peer=peer)
    assert r.status == "failed" and r.returncode == 3, r
    r = run(
        "print('main')\n", sandbox.Limits(timeout_s=120.0, memory_mb=256), peer="print('peer', flush=True)\n" + peer
    )
    assert r.status == "ok" and "main" in r.stdout, r
    # and a peer that never stops is bounded by the wall clock of the run
    r = run(
        "import os\nos.read(__gapo_peer__[0], 1)\n",
        sandbox.Limits(timeout_s=1.0, memory_mb=256),
        peer="while True: pass\n",
    )
    assert r.status == "timeout"


@pytest.mark.skipif(not LINUX_ROOT, reason="exercises the root fallback path")
def test_fallback_without_namespaces():
    """Without namespaces (another OS, a locked-down container) the sandbox still drops to
    nobody, applies rlimits and guards sockets, and says so."""
    code = (
        "import json, sys, gapo.exec.sandbox as s\n"
        "iso, lim = s.capabilities(), s.Limits(timeout_s=5, memory_mb=256)\n"
        "a = s.run('import socket; socket.socket()', lim)\n"
        "b = s.run('import os; os.fork()', lim)\n"
        "c = s.run('import os; print(os.getuid())', lim)\n"
        "d = s.run(sys.argv[1], lim, peer=sys.argv[2], stdin=b's3cr3t')\n"
        "print(json.dumps([iso.namespaces, iso.network, a.passed, b.passed, c.stdout,"
        " c.isolation, d.stdout.strip().splitlines()[-1:]]))\n"
    )
    env = dict(os.environ, GAPO_SANDBOX_NO_NAMESPACES="1")
    out = subprocess.run(
        [sys.executable, "-c", code, PEER_MAIN, PEER_ATTACKS], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    ns, network, sock_ok, fork_ok, uid, isolation, peer = json.loads(out.stdout.strip().splitlines()[-1])
    assert ns == [] and network == "socket-guard"
    assert not sock_ok and not fork_ok
    assert uid.strip() == "65534" and "socket-guard" in isolation
    assert peer, "the pair of processes did not run"
    _check_peer_report(json.loads(peer[0]))


# ------------------------------------------------------------------ IPC, sockets, memory, orphans
CAPS = sandbox.capabilities()
NEEDS_IPCNS = pytest.mark.skipif("ipc" not in CAPS.namespaces, reason=f"no IPC namespace here ({CAPS.describe()})")
NEEDS_MOUNT_NET = pytest.mark.skipif(
    not {"mount", "net"} <= set(CAPS.namespaces), reason=f"no mount+net namespaces here ({CAPS.describe()})"
)
NEEDS_CGROUP_MEMORY = pytest.mark.skipif(
    "cgroup-memory" not in CAPS.cgroups, reason=f"no cgroup memory limit here ({CAPS.describe()})"
)

IPC_LIB = r"""
import ctypes, ctypes.util, os
libc = ctypes.CDLL(None, use_errno=True)
try:
    mq_open = libc.mq_open
except AttributeError:
    mq_open = ctypes.CDLL(ctypes.util.find_library("rt"), use_errno=True).mq_open
libc.shmat.restype = ctypes.c_void_p
KEY_SHM, KEY_MSG, MQ = 0x67617031, 0x67617032, b"/gapo-test-mq"
IPC_CREAT, IPC_EXCL, IPC_NOWAIT = 0o1000, 0o2000, 0o4000
class Msg(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 64)]
"""

IPC_LEAVE = (
    IPC_LIB
    + r"""
shm = libc.shmget(KEY_SHM, 4096, IPC_CREAT | 0o666)
addr = libc.shmat(shm, None, 0)
ctypes.memmove(addr, b"left-behind", 11)
q = libc.msgget(KEY_MSG, IPC_CREAT | 0o666)
m = Msg(1, b"left-behind")
libc.msgsnd(q, ctypes.byref(m), 64, IPC_NOWAIT)
mq = mq_open(MQ, os.O_CREAT | os.O_RDWR, 0o666, None)
libc.mq_send(mq, b"left-behind", 11, 0)
print(shm, q, mq)
"""
)

IPC_FIND = (
    IPC_LIB
    + r"""
import json
found = {"shm": libc.shmget(KEY_SHM, 0, 0), "msg": libc.msgget(KEY_MSG, 0),
         "mq": mq_open(MQ, os.O_RDONLY, 0, None), "sysvipc": []}
for name in ("shm", "msg"):
    try:
        found["sysvipc"] += open("/proc/sysvipc/" + name).read().splitlines()[1:]
    except OSError:
        pass
print(json.dumps(found))
"""
)


@NEEDS_IPCNS
def test_ipc_namespace_is_private():
    """SysV shared memory, SysV message queues and POSIX message queues left by one sandbox are
    not visible to the next one, nor to the host; the host's SysV objects are not visible in
    a sandbox."""
    import ctypes

    r = run(IPC_LEAVE)
    assert r.status == "ok" and "ipcns" in r.isolation, r.stderr
    assert all(int(x) >= 0 for x in r.stdout.split()), r.stdout  # it did create them
    r = run(IPC_FIND)
    found = json.loads(r.stdout)
    assert found["shm"] == -1 and found["msg"] == -1 and found["mq"] == -1, found
    assert found["sysvipc"] == []
    host = {}
    exec(IPC_LIB, host)
    libc = host["libc"]
    assert libc.shmget(host["KEY_SHM"], 0, 0) == -1 and libc.msgget(host["KEY_MSG"], 0) == -1
    assert host["mq_open"](host["MQ"], os.O_RDONLY, 0, None) == -1
    # a segment of the host is invisible inside
    shm = libc.shmget(host["KEY_SHM"], 4096, host["IPC_CREAT"] | 0o600)
    assert shm >= 0
    try:
        found = json.loads(run(IPC_FIND).stdout)
        assert found["shm"] == -1 and found["sysvipc"] == []
    finally:
        libc.shmctl(shm, 0, None)  # IPC_RMID
        ctypes.set_errno(0)


def _meminfo_kb(key: str) -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


@NEEDS_IPCNS
def test_sysv_shared_memory_does_not_outlive_the_call():
    prog = (
        IPC_LIB
        + r"""
size = 160 << 20
shm = libc.shmget(0, size, IPC_CREAT | 0o600)   # IPC_PRIVATE, never removed
addr = libc.shmat(shm, None, 0)
ctypes.memset(addr, 1, size)
libc.shmdt(ctypes.c_void_p(addr))
print(shm)
"""
    )
    before = _meminfo_kb("Shmem")
    r = run(prog, sandbox.Limits(timeout_s=30.0, memory_mb=512))
    assert r.status == "ok" and int(r.stdout) >= 0, r.stderr
    deadline = time.monotonic() + 10  # a poll: the kernel frees a dead IPC namespace from a work queue
    while _meminfo_kb("Shmem") - before >= 80 << 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _meminfo_kb("Shmem") - before < 80 << 10  # the 160 MiB went with the namespace


@NEEDS_IPCNS
def test_sysv_shared_memory_is_bounded_by_memory_mb():
    prog = (
        IPC_LIB
        + r"""
total = 0
for _ in range(64):
    if libc.shmget(0, 64 << 20, IPC_CREAT | 0o600) < 0:
        break
    total += 64
print(total)
"""
    )
    r = run(prog, sandbox.Limits(timeout_s=30.0, memory_mb=256))
    assert r.status == "ok", r.stderr
    assert int(r.stdout) <= 256  # shmall of the sandbox's own namespace


SOCKET_PROBE = r"""
import json, socket, sys
out = {}
for path in sys.argv_paths:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        s.sendall(b"hello from the sandbox")
        out[path] = "connected"
    except OSError as e:
        out[path] = type(e).__name__
print(json.dumps(out))
"""


@NEEDS_MOUNT_NET
def test_host_unix_sockets_are_unreachable(sentinel_dir):
    """World-writable listening sockets of the host, under /run and in a directory the sandbox
    can otherwise see (outside the covered ones): connect fails, nothing arrives."""
    paths = [f"/run/gapo-test-{secrets.token_hex(4)}.sock", os.path.join(sentinel_dir, "listener.sock")]
    servers = []
    try:
        for p in paths:
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            srv.bind(p)
            os.chmod(p, 0o777)
            srv.listen(4)
            srv.settimeout(0.2)
            servers.append(srv)
        r = run(SOCKET_PROBE.replace("sys.argv_paths", repr(paths)))
        out = json.loads(r.stdout)
        assert all(v != "connected" for v in out.values()), out
        for srv in servers:
            with pytest.raises(socket.timeout):
                srv.accept()
    finally:
        for srv, p in zip(servers, paths):
            srv.close()
            os.unlink(p)


MEMFD_BOMB = r"""
import os
fds, total = [], 0
chunk = b"x" * (8 << 20)
while total < (600 << 20) and len(fds) < 56:
    fd = os.memfd_create("bomb")
    for _ in range(2):
        os.write(fd, chunk)       # write(), never mapped: invisible to RLIMIT_AS
        total += len(chunk)
    fds.append(fd)
print(total >> 20)
"""

SHM_FILES_BOMB = r"""
import os
chunk = b"x" * (8 << 20)
total = 0
for i in range(75):
    with open("/dev/shm/f%d" % i, "wb") as f:
        f.write(chunk)
    total += 8
print(total)
"""


@NEEDS_CGROUP_MEMORY
@pytest.mark.parametrize("prog", [MEMFD_BOMB, SHM_FILES_BOMB], ids=["memfd", "dev-shm"])
def test_memfd_and_shm_files_count_against_memory_mb(prog):
    """600 MiB in memfds (written, not mapped) or /dev/shm files, with memory_mb=256 and a tmpfs
    big enough not to be the bound: the sandbox's cgroup stops it."""
    r = run(prog, sandbox.Limits(timeout_s=20.0, memory_mb=256, tmpfs_mb=1024))
    assert not r.passed and r.status == "memory", (r.status, r.stdout, r.stderr[-300:])
    assert "cgroup-memory" in r.isolation


@pytest.mark.skipif(
    "mount" not in CAPS.namespaces, reason=f"no private /dev/shm without a mount namespace ({CAPS.describe()})"
)
def test_dev_shm_is_bounded_by_its_tmpfs():
    r = run(SHM_FILES_BOMB, LIMITS)  # memory_mb=256, tmpfs_mb=64: ENOSPC or the cgroup, never 600 MiB
    assert not r.passed


def test_harmless_devices_work():
    prog = (
        "import os\nwith open('/dev/null', 'w') as f:\n    f.write('x')\n"
        "assert len(open('/dev/urandom', 'rb').read(16)) == 16\n"
        "assert open('/dev/zero', 'rb').read(4) == bytes(4)\nassert len(os.urandom(8)) == 8\n"
        "print('ok')\n"
    )
    r = run(prog)
    assert r.status == "ok" and r.stdout.strip() == "ok", r.stderr


def test_disks_and_other_devices_are_not_there():
    r = run("import os\nprint(sorted(os.listdir('/dev')))\n")
    assert r.status == "ok", r.stderr
    if "dev-minimal" in r.isolation:
        names = set(json.loads(r.stdout.replace("'", '"')))
        assert names <= {"null", "zero", "full", "random", "urandom", "fd", "stdin", "stdout", "stderr", "shm"}, names


def _interpreter_readable_by_nobody() -> bool:
    """Whether every ancestor of the stdlib is searchable by others (else, without a mount
    namespace, only the pre-imported modules load after the uid switch)."""
    import sysconfig

    path = sysconfig.get_paths()["stdlib"]
    parts = path.split("/")
    return all(os.stat("/".join(parts[:i]) or "/").st_mode & 0o001 for i in range(2, len(parts)))


@pytest.mark.skipif(
    "mount" not in CAPS.namespaces and os.geteuid() == 0 and not _interpreter_readable_by_nobody(),
    reason="no mount namespace and an interpreter nobody cannot read",
)
def test_installed_third_party_package_imports():
    pytest.importorskip("numpy")
    r = run(
        "import numpy as np\nprint(int(np.arange(10).sum()), np.linalg.inv([[2.0]]))\n",
        sandbox.Limits(timeout_s=20.0, memory_mb=512),
    )
    assert r.status == "ok" and r.stdout.startswith("45"), r.stderr[-500:]


def test_capabilities_report_every_guarantee():
    feats = CAPS.features()
    assert set(feats) == {
        "network",
        "ipc",
        "unix_sockets",
        "filesystem",
        "processes",
        "memory",
        "cleanup",
        "user",
        "keyring",
    }
    assert ("seccomp-keyring" in CAPS.layers) == feats["keyring"].startswith("keyctl/add_key")
    assert ("ipc" in CAPS.namespaces) == feats["ipc"].startswith("private")
    assert ("cgroup-memory" in CAPS.cgroups) == feats["memory"].startswith("cgroup")
    assert CAPS.describe().startswith(sys.platform)


def _sandbox_processes(marker: str) -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


@pytest.mark.skipif(not CAPS.pdeathsig, reason=f"no PR_SET_PDEATHSIG here ({CAPS.describe()})")
def test_sandbox_dies_with_the_process_that_started_it():
    """A process running sandboxes is SIGKILLed mid-run (what a scoring pool does to a worker
    past its deadline): no process of its sandboxes survives."""
    mem = 300 + secrets.randbelow(200)
    marker = f'"RLIMIT_AS": {mem << 20}'
    code = (
        "import sys, gapo.exec.sandbox as s\n"
        "print('start', flush=True)\n"
        f"s.run_many(['import time\\ntime.sleep(60)\\n'] * 2, s.Limits(timeout_s=60, memory_mb={mem}),"
        " peers=[None, 'import time\\ntime.sleep(60)\\n'])\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"start"
        deadline = time.monotonic() + 60
        while len(_sandbox_processes(marker)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _sandbox_processes(marker), "the sandboxes did not start"
        child.kill()
        child.wait()
        deadline = time.monotonic() + 10  # a poll: they go within milliseconds
        while _sandbox_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _sandbox_processes(marker) == []
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    sandbox.reap_orphans()


@pytest.mark.skipif("mount" not in sandbox.capabilities().namespaces, reason="needs a mount namespace")
def test_an_interpreter_under_a_covered_directory_keeps_its_packages(tmp_path):
    """A virtual environment under /tmp (a CI clone, a scratch checkout) must stay importable
    inside the sandbox although the sandbox covers /tmp with a private tmpfs: its Python
    directories are bound back read-only. Before, installed packages vanished (numpy scored 0)."""
    import shutil
    import sysconfig
    from pathlib import Path

    top = Path(tempfile.mkdtemp(dir="/tmp", prefix="gapo-venv-test-"))  # a checkout, with its .venv inside
    venv = top / ".venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        py = venv / "bin" / "python"
        purelib = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        Path(purelib, "gapo_probe_mod.py").write_text("VALUE = 42\n")
        src = Path(__file__).resolve().parents[2] / "src"
        env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{sysconfig.get_paths()['purelib']}")
        code = (
            "from gapo.exec.sandbox import Limits, run\n"
            "r = run('import gapo_probe_mod; print(gapo_probe_mod.VALUE)', Limits(timeout_s=10, memory_mb=256))\n"
            "print(r.stderr[-500:]); print(r.passed, r.stdout.strip())\n"
        )  # the last line is the verdict
        out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert out.stdout.strip().splitlines()[-1] == "True 42", out.stdout + out.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------ keyrings, binds, pool workers
# Kernel keyrings belong to a uid, not to a namespace: every sandbox runs as uid 65534, so a key
# one run adds to "its" user keyring is there for the next run (a channel between completions).
# Rings: @t -1, @p -2, @s -3, @u -4, @us -5. Numbers: x86_64 / aarch64 (asm-generic).
KEYS_LIB = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, REQUEST_KEY, KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219),
                                "riscv64": (217, 218, 219)}[os.uname().machine]
RINGS = (-1, -2, -3, -4, -5)
TOKEN = sys.argv_token
def desc(ring):
    return ("gapo-chan-%s-%d" % (TOKEN, -ring)).encode()
def int80(nr, a, b, c):
    # the i386 ABI from a 64-bit process (int 0x80): other syscall numbers, another filter arch
    if os.uname().machine != "x86_64":
        return None
    import mmap
    code = (b"\x53\xb8" + nr.to_bytes(4, "little") + b"\xbb" + (a & 0xffffffff).to_bytes(4, "little")
            + b"\xb9" + (b & 0xffffffff).to_bytes(4, "little") + b"\xba" + (c & 0xffffffff).to_bytes(4, "little")
            + b"\xcd\x80\x5b\xc3")  # push rbx; mov eax/ebx/ecx/edx; int 0x80; pop rbx; ret
    try:
        m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError):
        return None
    m.write(code)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    return ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
"""
KEYS_ADD = (
    KEYS_LIB
    + r"""
out = {}
for ring in RINGS:
    payload = b"PAYLOAD-" + TOKEN.encode()
    out["add_key %d" % ring] = libc.syscall(ADD_KEY, b"user", desc(ring), payload, len(payload), ring)
# the persistent keyring of the uid (KEYCTL_GET_PERSISTENT): lives for days
p = libc.syscall(KEYCTL, 22, -1, -4)
out["persistent"] = p
if p >= 0:
    payload = b"PAYLOAD-" + TOKEN.encode()
    out["add_key persistent"] = libc.syscall(ADD_KEY, b"user", desc(-9), payload, len(payload), p)
payload = b"PAYLOAD-" + TOKEN.encode()
out["x32 add_key"] = libc.syscall(ADD_KEY | 0x40000000, b"user", desc(-7), payload, len(payload), -4)
out["i386 keyctl get @u"] = int80(288, 0, -4, 0)  # KEYCTL_GET_KEYRING_ID
print(json.dumps(out))
"""
)
KEYS_FIND = (
    KEYS_LIB
    + r"""
found = []
buf = ctypes.create_string_buffer(256)
for ring in RINGS:
    for d in [desc(r) for r in (*RINGS, -7, -9)]:
        k = libc.syscall(KEYCTL, 10, ring, b"user", d, 0)  # KEYCTL_SEARCH
        if k >= 0:
            n = libc.syscall(KEYCTL, 11, k, buf, 256)  # KEYCTL_READ
            found.append([ring, d.decode(), buf.raw[:max(n, 0)].decode("latin-1")])
p = libc.syscall(KEYCTL, 22, -1, 0)
if p >= 0:
    for d in [desc(r) for r in (*RINGS, -9)]:
        k = libc.syscall(KEYCTL, 10, p, b"user", d, 0)
        if k >= 0:
            found.append(["persistent", d.decode()])
for d in [desc(r) for r in RINGS]:
    k = libc.syscall(REQUEST_KEY, b"user", d, None, 0)
    if k >= 0:
        found.append(["request_key", d.decode()])
try:
    found += [line for line in open("/proc/keys").read().splitlines() if TOKEN in line]
except OSError:
    pass
print(json.dumps(found))
"""
)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.uname().machine not in ("x86_64", "aarch64", "riscv64"),
    reason="Linux keyrings (known syscall numbers)",
)
def test_kernel_keyring_is_no_channel_between_runs():
    """One run adds keys to every keyring it can name (thread, process, session, user,
    user-session, the uid's persistent keyring; also through the x32 and i386 ABIs); the next
    run (same uid 65534) looks for them with keyctl(SEARCH), request_key and /proc/keys: nothing.
    Before, the keys in @u and @us were found, payload and all."""
    token = secrets.token_hex(6)
    add = KEYS_ADD.replace("sys.argv_token", repr(token))
    find = KEYS_FIND.replace("sys.argv_token", repr(token))
    r1 = run(add)
    assert r1.status == "ok", r1.stderr
    added = json.loads(r1.stdout)
    r2 = run(find)
    assert r2.status == "ok", r2.stderr
    assert json.loads(r2.stdout) == [], (added, r2.stdout)
    assert token not in r2.stdout
    if "seccomp-keyring" in r1.isolation:
        assert all(v is None or v < 0 for v in added.values()), added  # denied outright
    # and concurrent runs cannot meet there either
    a, b = sandbox.run_many([add, find], LIMITS)
    assert a.status == b.status == "ok" and token not in b.stdout, (a.stdout, b.stdout)


def _hostile_project_reads(proj: str, token: str) -> list[str]:
    """Completions that try to get at a project folder's files (the folder on the trainer's
    sys.path; its parent unreadable by the sandbox user)."""
    env = os.path.join(proj, ".env")
    return [
        f"print(open({env!r}).read())",
        f"import os; print(os.listdir({proj!r}))",
        f"import sys; sys.path.insert(0, {proj!r}); import gapo_project_settings as m; print(m.KEY)",
        f"import os\nfor d, _, fs in os.walk({os.path.dirname(proj)!r}):\n"
        "    for f in fs:\n        print(open(os.path.join(d, f)).read())",
        f"print(open('/proc/self/root' + {env!r}).read())",
        f"import os\nfd = os.open({proj!r}, os.O_PATH)\nprint(open('/proc/self/fd/%d/.env' % fd).read())",
        "import glob\nfor p in glob.glob('/proc/*/cwd/.env') + glob.glob('/proc/*/root" + env + "'):\n"
        "    try:\n        print(open(p).read())\n    except OSError:\n        pass",
    ]


def _make_project(parent: str, token: str) -> str:
    """parent (0700) / proj / {.env, gapo_project_settings.py, gapo_sbx_probe.py}"""
    os.chmod(parent, 0o700)
    proj = os.path.join(parent, "proj")
    os.mkdir(proj)
    os.chmod(proj, 0o755)
    for name, text in ((".env", f"API_KEY={token}\n"), ("gapo_project_settings.py", f"KEY = {token!r}\n")):
        with open(os.path.join(proj, name), "w") as f:
            f.write(text)
        os.chmod(os.path.join(proj, name), 0o644)
    with open(os.path.join(proj, "gapo_sbx_probe.py"), "w") as f:
        f.write(
            "import json, sys\nfrom gapo.exec import sandbox\n"
            "progs = json.loads(sys.stdin.read())\n"
            "rs = sandbox.run_many(progs, sandbox.Limits(timeout_s=30.0, memory_mb=256))\n"
            "print(json.dumps([[r.status, r.stdout, r.stderr[-300:]] for r in rs]))\n"
        )
    return proj


def _home_parent():
    home = os.path.expanduser("~")
    if not os.path.isdir(home) or not os.access(home, os.W_OK) or home.startswith(("/tmp", "/var/tmp")):
        return None
    return home


@pytest.mark.skipif(
    CAPS.drop_to_uid is None, reason="the sandbox runs as the calling user here: it reads what that user reads"
)
@pytest.mark.parametrize("where", ["tmp", "home"])
def test_project_folder_on_sys_path_is_not_exposed(tmp_path, where):
    """``python -m MODULE`` from a project folder puts that folder on ``sys.path``. Before, every
    ``sys.path`` entry was bound back into the sandbox, so a completion read the project's
    ``.env`` even under a 0700 parent (under /tmp: bound back onto the private tmpfs; under a
    0700 home: the tmpfs that hides the home held the project). Now only the interpreter's own
    directories are: every read fails, and the sandbox still runs (stdlib, site-packages)."""
    import shutil

    if where == "home":
        base = _home_parent()
        if base is None:
            pytest.skip("no writable home directory outside /tmp")
        parent = tempfile.mkdtemp(prefix=".gapo-sbx-test-", dir=base)
    else:
        parent = str(tmp_path / "locked")
        os.mkdir(parent)
    try:
        token = "gapo-env-" + secrets.token_hex(8)
        proj = _make_project(parent, token)
        progs = _hostile_project_reads(proj, token) + [
            "import json, numpy, sysconfig; print('fine')" if _has_numpy() else "import json; print('fine')"
        ]
        env = dict(os.environ)
        env.pop("PYTHONSAFEPATH", None)  # which would keep the folder off sys.path
        out = subprocess.run(
            [sys.executable, "-m", "gapo_sbx_probe"],
            cwd=proj,
            input=json.dumps(progs),
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        results = json.loads(out.stdout.strip().splitlines()[-1])
        for prog, (status, stdout, stderr) in zip(progs[:-1], results[:-1]):
            assert token not in stdout and token not in stderr, (prog, status, stdout)
        assert results[-1][:2] == ["ok", "fine\n"], results[-1]
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _has_numpy() -> bool:
    try:
        import numpy  # noqa: F401

        return True
    except ImportError:
        return False


def test_only_interpreter_directories_are_bound(monkeypatch, tmp_path):
    """What the bootstrap re-exposes does not follow ``sys.path`` (cwd, PYTHONPATH, an editable
    install's source folder): only the stdlib and site-packages directories."""
    import sysconfig

    monkeypatch.syspath_prepend(str(tmp_path))
    sandbox._python_paths.cache_clear()
    try:
        paths = sandbox._python_paths()
    finally:
        sandbox._python_paths.cache_clear()
    assert str(tmp_path) not in paths
    assert os.path.realpath(sysconfig.get_paths()["stdlib"]) in paths or any(
        os.path.realpath(sysconfig.get_paths()["stdlib"]).startswith(p + "/") for p in paths
    )
    gapo_src = os.path.dirname(os.path.dirname(os.path.realpath(sandbox.__file__)))  # .../src or site-packages
    sp = {os.path.realpath(p) for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])}
    if gapo_src not in sp:  # an editable install: gapo's source folder is not bound
        assert not any(gapo_src == p or gapo_src.startswith(p + "/") for p in paths), paths


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


POOL_TRAINER = r"""
import json, sys
from gapo.tasks.code import MBPPTask
from gapo.exec.scoring import ScoringPool

if __name__ == "__main__":
    path, mem = sys.argv[1], int(sys.argv[2])
    task = MBPPTask(path, columns={"id_field": None}, scoring={"timeout_s": 300.0, "memory_mb": mem})
    pool = ScoringPool(2, timeout_s=None)
    # one worker's sandbox sleeps; the other busy-loops (a completion that never returns)
    fut = pool.submit(task, task.problems() * 2, ["import time\ntime.sleep(900)\n", "while True:\n    pass\n"])
    print(json.dumps([w.proc.pid for w in pool._workers._workers]), flush=True)
    fut.result()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")
def test_pool_workers_and_their_sandboxes_die_with_the_trainer(tmp_path):
    """``kill -9`` of a trainer scoring code completions in a pool (``task.scoring_workers >= 1``)
    mid-batch: its workers and their sandboxes go too (``PR_SET_PDEATHSIG`` and a pidfd
    watchdog in each worker, ``PR_SET_PDEATHSIG`` in each sandbox), and ``reap_orphans()``
    then removes the sandboxes' leftovers. Before, the workers and 7 sandbox processes ran on
    until the sandbox's deadline."""
    mem = 300 + secrets.randbelow(200)
    marker = f'"RLIMIT_AS": {mem << 20}'
    data = tmp_path / "p.jsonl"
    data.write_text(
        json.dumps(
            {"prompt": "Add.", "code": "def add(a, b):\n    return a + b\n", "test_list": ["assert add(1, 2) == 3"]}
        )
        + "\n"
    )
    script = tmp_path / "trainer.py"
    script.write_text(POOL_TRAINER)
    trainer = subprocess.Popen([sys.executable, str(script), str(data), str(mem)], stdout=subprocess.PIPE)
    try:
        workers = json.loads(trainer.stdout.readline())
        assert len(workers) == 2
        deadline = time.monotonic() + 120  # worker start-up on a busy machine
        while len(_sandbox_processes(marker)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _sandbox_processes(marker), "the sandboxes did not start"
        assert all(_alive(w) for w in workers)
        trainer.kill()
        trainer.wait()
        deadline = time.monotonic() + 10  # a poll: they go within milliseconds
        while (any(map(_alive, workers)) or _sandbox_processes(marker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [w for w in workers if _alive(w)] + _sandbox_processes(marker)
        assert left == [], f"still running after the trainer was killed: {left}"
    finally:
        trainer.kill()
        trainer.wait()
        trainer.stdout.close()
    sandbox.reap_orphans()
    tmp = tempfile.gettempdir()
    assert not [n for n in os.listdir(tmp) if any(n.startswith(f"gapo-sbx-{w}-") for w in workers)]


def test_a_worker_started_from_a_thread_outlives_that_thread():
    """``PR_SET_PDEATHSIG`` fires when the parent *thread* exits: a worker started from a thread
    that then ends (the helper of ``run_with_timeout``, a replacement started by the scoring
    thread) must live on, and still serve calls."""
    from gapo.exec.scoring_pool import Workers

    box = []

    def start():  # start it, and end only once it runs (and has set what it sets)
        box.append(Workers(1))
        box.append(box[0].call(os.getpid, (), 120.0))

    th = threading.Thread(target=start)
    th.start()
    th.join()
    workers = box[0]
    try:
        pid = workers._workers[0].proc.pid
        assert box[1] == ("ok", pid)
        assert workers.call(os.getppid, (), 120.0) == ("ok", os.getpid())
        assert _alive(pid) and workers.n_replaced == 0
    finally:
        workers.close()


def _alarm_while_main_blocks_it():
    """(handled while the main thread blocks SIGALRM, handled after it unblocks it)."""
    got = []
    old = signal.signal(signal.SIGALRM, lambda *a: got.append(1))
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        deadline = time.monotonic() + 10  # a poll: the alarm is due in 50 ms
        while signal.SIGALRM not in signal.sigpending() and not got and time.monotonic() < deadline:
            time.sleep(0.01)
        while_blocked = len(got)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGALRM])  # a pending one runs now
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    signal.signal(signal.SIGALRM, old)
    return while_blocked, len(got)


def test_the_parent_watchdog_of_a_worker_takes_no_signal():
    """A worker's parent watchdog is a thread: a process-directed SIGALRM (the soft timeout)
    that the main thread blocks must stay pending for the main thread, not be taken by the
    watchdog (whose handler run would then interrupt the main thread's Python code anyway)."""
    from gapo.exec.scoring_pool import Workers

    workers = Workers(1)
    try:
        assert workers.call(_alarm_while_main_blocks_it, (), 120.0) == ("ok", (0, 1))
    finally:
        workers.close()
