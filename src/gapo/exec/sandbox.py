"""Run untrusted Python programs (code written by a policy under RL) with limits and isolation.

    res = gapo.exec.sandbox.run(program, Limits(timeout_s=5, memory_mb=256))
    res.passed, res.status, res.stdout, res.stderr, res.isolation

Code written by a policy under RL is hostile input by default. The program never runs in the
calling process: each call starts a fresh interpreter in its own session/process group, and a
small trusted bootstrap (``_BOOT`` below) applies the isolation *inside the child* before it
compiles and executes the program. Layers, strongest first (what is in force is detected once,
cached, and reported per run in ``SandboxResult.isolation``; see docs/sandbox.md):

- Linux namespaces via util-linux ``unshare``: a new **network** namespace (no interfaces but a
  down loopback: no connection anywhere, not even to 127.0.0.1), a new **PID** namespace with its
  own ``/proc`` (the trainer's processes and their ``environ`` are invisible; killing the
  namespace's init kills everything in it) and a new **mount** namespace in which the whole
  file system is made read-only (``mount_setattr(AT_RECURSIVE, MOUNT_ATTR_RDONLY)``) and fresh
  size-limited tmpfs mounts cover ``/tmp``, ``/var/tmp``, ``/dev/shm`` and the working directory.
  As non-root a user namespace is added (where the kernel allows it).
- As root: the child drops to an unprivileged user (``nobody``, 65534) with no supplementary
  groups and ``no_new_privs`` - root ignores ``RLIMIT_NPROC`` and file permissions, nobody
  does not.
- rlimits: address space (``memory_mb``), CPU seconds, file size, open files, no core files, and
  ``RLIMIT_NPROC = 0`` (no fork, no threads).
- Kernel keyrings (per uid, not per namespace: a key left in uid 65534's user keyring would be
  read by the next run): a private session keyring, and a seccomp filter that denies
  ``add_key``, ``request_key`` and ``keyctl`` (Linux x86_64/aarch64/riscv64).
- Only the interpreter's own directories (stdlib, site-packages: :func:`_python_paths`) are
  re-exposed where the mount namespace hides their ancestors; never other ``sys.path`` entries.
- The sandbox dies with the thread that started it (``PR_SET_PDEATHSIG``), and scoring pool
  workers with the trainer (:mod:`gapo.exec.scoring_pool`).
- Without a network namespace: a socket guard (``socket.socket`` and friends raise). This only
  stops well-behaved code (``ctypes`` gets around it) and is reported as ``socket-guard``.
- Always: an environment with nothing but ``PATH``/``LANG``/``HOME``/``TMPDIR``; ``python -I``;
  stdout and stderr capped (the process is killed once a cap is exceeded); the wall-clock
  timeout is enforced by the parent, which kills the whole process group; a fresh temporary
  working directory, removed afterwards.

With ``peer=`` a second program runs in a second process of the same sandbox, connected to the
first by two pipes; the first is made non-dumpable before the peer runs anything, so the peer
(same user) cannot ptrace it or read its memory or file descriptors (see :func:`run`).

Concurrency is bounded by the usable cores: at most that many sandboxes run at once however
many threads call :func:`run`; :func:`run_many` runs a list of programs on a bounded pool.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from gapo.exec import sandbox_ns, sandbox_proc
from gapo.exec.sandbox_boot import BOOT

__all__ = [
    "Limits",
    "SandboxResult",
    "Isolation",
    "run",
    "run_many",
    "capabilities",
    "max_concurrency",
    "STATUSES",
]

NOBODY_UID = 65534
NOBODY_GID = 65534

#: Every value ``SandboxResult.status`` can take.
STATUSES = (
    "ok",  # exit status 0
    "failed",  # non-zero exit status (an exception, a failed assert, sys.exit(1))
    "timeout",  # wall clock (parent) or CPU time (SIGXCPU) exceeded
    "memory",  # MemoryError under the address-space limit
    "killed",  # died from a signal the sandbox did not send for a timeout (SIGSEGV, ...)
    "output_limit",  # wrote more than the stdout/stderr cap; killed
    "sandbox_error",  # the sandbox itself could not set up (bootstrap failed)
)


@dataclasses.dataclass(frozen=True)
class Isolation:
    """What the sandbox can apply on this machine (detected once, see :func:`capabilities`)."""

    platform: str
    root: bool
    namespaces: tuple[str, ...]  # subset of ("user", "net", "ipc", "mount", "pid")
    drop_to_uid: int | None  # the unprivileged uid the child switches to (root only)
    unshare: str | None  # path of util-linux unshare, when namespaces are used
    cgroups: tuple[str, ...] = ()  # ("cgroup-kill", "cgroup-memory") where usable
    layers: tuple[str, ...] = ()  # what the detection run reported (e.g. "seccomp-keyring")

    @property
    def network(self) -> str:
        return "netns" if "net" in self.namespaces else "socket-guard"

    @property
    def pdeathsig(self) -> bool:
        """Whether a sandbox dies with the thread that started it (Linux ``PR_SET_PDEATHSIG``)."""
        return self.platform.startswith("linux")

    @property
    def keyring(self) -> str:
        """How the kernel keyrings (per uid, not per namespace) are kept from the program."""
        if "seccomp-keyring" in self.layers:
            return "keyctl/add_key/request_key denied (seccomp)" + (
                ", private session keyring" if "session-keyring" in self.layers else ""
            )
        if "session-keyring" in self.layers:
            return "private session keyring only: the uid's user keyring is shared"
        return "shared with every process of the uid" if self.platform.startswith("linux") else "not applicable"

    def features(self) -> dict[str, str]:
        """Each guarantee and how it holds here (the isolation table of docs/sandbox.md)."""
        ns, cg = self.namespaces, self.cgroups
        mem = (
            "cgroup (all processes, tmpfs, shared memory, memfds)"
            if "cgroup-memory" in cg
            else "RLIMIT_AS per process; tmpfs sizes, IPC limits and RLIMIT_FSIZE x RLIMIT_NOFILE bound the rest"
        )
        ends = " + ".join(
            x
            for x, on in (
                ("process group", True),
                ("pid namespace", "pid" in ns),
                ("cgroup.kill", "cgroup-kill" in cg),
                ("pdeathsig", self.pdeathsig),
            )
            if on
        )
        return {
            "network": "network namespace" if "net" in ns else "socket guard (Python-level)",
            "ipc": (
                "private IPC namespace (SysV shm/msg, POSIX mq), limits bounded"
                if "ipc" in ns
                else "shared with the host"
            ),
            "unix_sockets": (
                "host socket files hidden (private /run, /tmp, /dev/shm; others covered)"
                if "mount" in ns and "net" in ns
                else "host socket files reachable (file permissions only)"
            ),
            "filesystem": (
                "read-only tree, private tmpfs, minimal /dev; under hidden folders "
                "only the interpreter's own directories (stdlib, site-packages)"
                if "mount" in ns
                else "host file system, file permissions only"
            ),
            "keyring": self.keyring,
            "processes": "private pid namespace" if "pid" in ns else "host pid namespace",
            "memory": mem,
            "cleanup": ends,
            "user": (f"uid {self.drop_to_uid}" if self.drop_to_uid is not None else "the calling user"),
        }

    def describe(self) -> str:
        ns = "+".join(self.namespaces) or "none"
        uid = f"uid {self.drop_to_uid}" if self.drop_to_uid is not None else "same uid"
        cg = "+".join(self.cgroups) or "no cgroups"
        keys = "keyctl denied" if "seccomp-keyring" in self.layers else "keyring shared"
        return (
            f"{self.platform}: namespaces {ns}, {uid}, network {self.network}, {cg}, "
            f"pdeathsig {'yes' if self.pdeathsig else 'no'}, {keys}, rlimits"
        )


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one sandbox run may use.

    ``timeout_s`` is wall clock (the parent kills the process group when it passes);
    ``memory_mb`` caps the address space (and the run's cgroup, where there is one); ``cpu_s``
    (default ``timeout_s``) is the CPU-time rlimit, rounded up; ``file_size_mb`` caps any file
    written; ``tmpfs_mb`` sizes each scratch tmpfs (namespaced runs); stdout and stderr are each
    capped at ``output_limit_bytes`` (exceeding it kills the run: status ``output_limit``).
    A bad value is a ``ValueError`` naming the field.
    """

    timeout_s: float
    memory_mb: int
    cpu_s: float | None = None
    file_size_mb: int = 16
    tmpfs_mb: int = 64
    output_limit_bytes: int = 1 << 20

    def __post_init__(self):
        def number(name: str, value, *, integer: bool, low: float, strict: bool) -> None:
            kinds = (int,) if integer else (int, float)
            ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or (value <= low if strict else value < low):
                what = "an integer" if integer else "a finite number"
                raise ValueError(f"sandbox limit {name} must be {what} {'>' if strict else '>='} {low}, got {value!r}")

        number("timeout_s", self.timeout_s, integer=False, low=0, strict=True)
        number("memory_mb", self.memory_mb, integer=True, low=0, strict=True)
        if self.cpu_s is not None:
            number("cpu_s", self.cpu_s, integer=False, low=0, strict=True)
        number("file_size_mb", self.file_size_mb, integer=True, low=0, strict=False)
        # tmpfs size=0 means no limit at all, so 0 is refused rather than passed on
        number("tmpfs_mb", self.tmpfs_mb, integer=True, low=0, strict=True)
        number("output_limit_bytes", self.output_limit_bytes, integer=True, low=0, strict=False)


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    passed: bool  # exit status 0 and not killed
    status: str  # one of STATUSES
    returncode: int | None  # negative: killed by that signal
    stdout: str
    stderr: str
    duration_s: float
    isolation: tuple[str, ...]  # the layers in force for this run, e.g. ("netns", "uid=65534")
    stdout_truncated: bool = False
    stderr_truncated: bool = False


# The bootstrap (runs in the child, still privileged): see gapo.exec.sandbox_boot.
_BOOT = BOOT


# Loaded before the uid switch when the stdlib may be unreadable afterwards (no mount namespace).
_PREIMPORT = (
    "typing",
    "math",
    "re",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "string",
    "random",
    "hashlib",
    "copy",
    "fractions",
    "decimal",
    "statistics",
    "json",
    "datetime",
    "operator",
    "traceback",
    "types",
    "threading",
    "signal",
    "socket",
)


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")


@functools.lru_cache(maxsize=1)
def _python_paths() -> list[str]:
    """The interpreter's own directories, the only ones the bootstrap re-exposes (read-only) where
    the sandbox would hide them: the standard library (``sysconfig`` ``stdlib``, and
    ``platstdlib`` of the base interpreter, which holds ``lib-dynload``) and the site-packages
    directories (``purelib``, ``platlib``, ``site.getsitepackages()``).

    Deliberately *not* ``sys.path``: that holds the working directory or the script's folder
    (``python -m gapo`` in a project), ``PYTHONPATH`` entries and an editable install's source
    folder (``pip install -e``: a ``.pth`` in site-packages) -- binding those re-exposed a
    project folder, ``.env`` included, even under a ``0700`` parent the sandbox user cannot read
    on the host. Nothing inside the sandbox imports ``gapo`` (the bootstrap and the judge are
    source text run with the standard library only), so none of that is needed there; a
    ``.pth`` entry pointing outside these directories is simply absent in the sandbox.
    """
    import site
    import sysconfig

    cur = sysconfig.get_paths()
    base = sysconfig.get_paths(
        vars={
            "base": sys.base_prefix,
            "platbase": sys.base_exec_prefix,
            "installed_base": sys.base_prefix,
            "installed_platbase": sys.base_exec_prefix,
        }
    )
    paths = [cur["stdlib"], base["stdlib"], base["platstdlib"], cur["purelib"], cur["platlib"]]
    if hasattr(site, "getsitepackages"):  # absent in some old virtualenv site.py copies
        paths += site.getsitepackages()
    out = set()
    for p in paths:
        p = os.path.realpath(p)
        if os.path.isdir(p) and p != "/":
            out.add(p)
    # Keep only the outermost of nested directories (a bind of the parent covers the child).
    keep = [p for p in sorted(out) if not any(p != q and p.startswith(q + "/") for q in out)]
    return keep


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@functools.lru_cache(maxsize=1)
def capabilities() -> Isolation:
    """Detect the strongest isolation this machine allows (once; cached).

    Linux: tries ``unshare`` with net+mount+pid (root) or user+net+mount+pid (non-root), then
    smaller sets, by running the real bootstrap on a trivial program; the first set under which
    that program runs and reports is used. Elsewhere (macOS, BSD): no namespaces.
    """
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    drop = NOBODY_UID if root and hasattr(os, "setuid") else None
    unshare = _which("unshare") if sys.platform.startswith("linux") else None
    if os.environ.get("GAPO_SANDBOX_NO_NAMESPACES") == "1":
        unshare = None
    candidates: list[tuple[str, ...]] = []
    if unshare:
        if root:
            candidates = [("net", "ipc", "mount", "pid"), ("net", "mount", "pid"), ("net", "mount"), ("net",)]
        else:
            candidates = [
                ("user", "net", "ipc", "mount", "pid"),
                ("user", "net", "mount", "pid"),
                ("user", "net", "mount"),
                ("user", "net"),
            ]
    cgroups = _cgroup_layers()
    # A probe that cannot work fails at once (unshare: EPERM); the generous wall clock is for a
    # busy machine, where a 10 s probe could time out and silently pick a weaker set.
    for ns in [*candidates, ()]:
        iso = Isolation(sys.platform, root, ns, drop, unshare if ns else None, cgroups)
        try:
            res = _run(iso, "print('ok')", Limits(timeout_s=60.0, memory_mb=256), probe=True)
        except OSError:
            continue
        if res.passed and res.stdout.strip() == "ok":
            return dataclasses.replace(iso, layers=res.isolation)
    return Isolation(sys.platform, root, (), drop, None, cgroups)


def _cgroup_layers() -> tuple[str, ...]:
    if not sys.platform.startswith("linux"):
        return ()
    sup = sandbox_ns.cgroup_support()
    return tuple(n for n, k in (("cgroup-kill", "kill"), ("cgroup-memory", "memory")) if k in sup)


def reap_orphans() -> int:
    """Kill what is left of sandboxes whose starting process died (a scoring worker killed on
    timeout): kill their cgroups' processes, remove the cgroups and scratch directories; returns
    how many were found. Linux only (``PR_SET_PDEATHSIG`` has already taken the processes down;
    this is the second line and the clean-up)."""
    if not sys.platform.startswith("linux"):
        return 0
    return sandbox_ns.reap_orphans()


def max_concurrency() -> int:
    """How many sandboxes may run at once (the usable cores; ``GAPO_SANDBOX_WORKERS`` overrides)."""
    env = os.environ.get("GAPO_SANDBOX_WORKERS")
    return max(1, int(env)) if env else _usable_cores()


# Process-wide on purpose: every sandbox of the process (any trainer, pool thread or test) shares
# the machine's cores, so one cap holds for all; sized once, at import (GAPO_SANDBOX_WORKERS set
# later does not resize it). The only other state the runtime keeps is owned by
# sandbox_ns.FREE_CGROUPS and scoring.SHARED (docs/design.md §3.1).
_SLOTS = threading.BoundedSemaphore(max_concurrency())


def _prefix(iso: Isolation) -> list[str]:
    if not iso.namespaces:
        return []
    flags = []
    if "user" in iso.namespaces:
        flags += ["--user", "--map-root-user"]
    if "net" in iso.namespaces:
        flags.append("--net")
    if "ipc" in iso.namespaces:
        flags.append("--ipc")
    if "mount" in iso.namespaces:
        flags.append("--mount")
    if "pid" in iso.namespaces:
        # no --fork: unshare execs the bootstrap, which stays our direct child (so it can die
        # with us, PR_SET_PDEATHSIG, and be moved into a cgroup by us) and forks PID 1 itself
        flags.append("--pid")
    return [iso.unshare, *flags, "--"]


def run(program: str, limits: Limits, *, stdin: bytes | None = None, peer: str | None = None) -> SandboxResult:
    """Run the Python ``program`` in a fresh sandboxed interpreter under ``limits`` (a
    :class:`Limits`, the one spelling of the limits) and return what happened.

    ``stdin`` is fed to the program (``None``: empty). Never raises for anything the program
    does; a ``limits`` that is not a :class:`Limits` is a ``TypeError`` before anything runs.

    ``peer``: a second Python program, run in a second process of the same sandbox (same
    limits, each process its own; same user) and connected to ``program`` by two pipes: each
    sees a global ``__gapo_peer__ = (read_fd, write_fd, other_pid)``. The peer's stdin is
    empty; stdout and stderr are shared. ``program``'s process is made non-dumpable
    before the peer runs anything, so the peer cannot ptrace it, read its memory or open its
    file descriptors; the peer is killed when ``program``'s process ends. The result
    (status, exit code) is ``program``'s. Used by :mod:`gapo.tasks.code` to keep the judge of
    a completion out of the completion's reach.
    """
    _check_limits(limits, "run")
    with _SLOTS:
        return _run(capabilities(), program, limits, stdin=stdin, peer=peer)


def run_many(
    programs: Sequence[str] | Iterable[str],
    limits: Limits,
    *,
    workers: int | None = None,
    stdins: Sequence[bytes | None] | None = None,
    peers: Sequence[str | None] | None = None,
) -> list[SandboxResult]:
    """:func:`run` each program under the same ``limits`` (``stdins`` and ``peers`` one entry
    per program) on a pool of at most ``workers`` (default :func:`max_concurrency`) threads;
    results in input order."""
    _check_limits(limits, "run_many")
    programs = list(programs)
    stdins = [None] * len(programs) if stdins is None else list(stdins)
    peers = [None] * len(programs) if peers is None else list(peers)
    if len(stdins) != len(programs) or len(peers) != len(programs):
        raise ValueError("stdins and peers must have one entry per program")
    if not programs:
        return []
    n = min(workers or max_concurrency(), len(programs))
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="gapo-sandbox") as pool:
        futs = [pool.submit(run, p, limits, stdin=s, peer=q) for p, s, q in zip(programs, stdins, peers)]
        return [f.result() for f in futs]


def _check_limits(limits: Limits, where: str) -> None:
    # Checked before any work: inside _run a dict or None would fail as an AttributeError after
    # the scratch directory was made (and leave it behind), and run_many would raise it from a
    # pool thread after the other programs had run.
    if not isinstance(limits, Limits):
        raise TypeError(f"{where}(): limits must be a sandbox.Limits, got {type(limits).__name__}")


def _ipc_limits(memory_mb: int) -> dict[str, int]:
    """Limits of the sandbox's own IPC namespace (``/proc/sys`` keys): SysV shared memory at
    most ``memory_mb`` in all, few segments, message queues and POSIX queues."""
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    return {
        "kernel/shmmax": memory_mb << 20,
        "kernel/shmall": (memory_mb << 20) // page,
        "kernel/shmmni": 64,
        "kernel/msgmni": 16,
        "kernel/msgmnb": 16384,
        "fs/mqueue/queues_max": 16,
    }


def _run(
    iso: Isolation,
    program: str,
    limits: Limits,
    *,
    stdin: bytes | None = None,
    peer: str | None = None,
    probe: bool = False,
) -> SandboxResult:
    t0 = time.monotonic()
    workdir = tempfile.mkdtemp(prefix=f"gapo-sbx-{os.getpid()}-")
    cap = limits.output_limit_bytes
    cgroup = sandbox_ns.acquire(limits.memory_mb << 20) if iso.cgroups else None
    try:
        _write_programs(iso, workdir, program, peer)
        cfg = _boot_config(iso, workdir, limits, peer=peer is not None, cgroup=cgroup)
        argv = [*_prefix(iso), sys.executable, "-I", "-B", "-c", _BOOT]
        out, err, report, limit_hit, timed_out, rc = sandbox_proc.execute(
            argv, cfg, workdir=workdir, stdin=stdin, cgroup=cgroup, deadline=t0 + limits.timeout_s, cap=cap
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        oom = cgroup is not None and cgroup.oom_killed()
        if cgroup is not None:
            cgroup.release()  # kills anything left (another session, a setsid'd peer)
    duration = time.monotonic() - t0
    try:
        applied = tuple(json.loads(report.decode())) if report else ()
    except ValueError:
        applied = ()
    stdout = bytes(out[:cap]).decode("utf-8", "replace")
    stderr = bytes(err[:cap]).decode("utf-8", "replace")
    status = _status(limit_hit=limit_hit, timed_out=timed_out, applied=applied, rc=rc, oom=oom, stderr=stderr)
    if probe and status != "ok" and not applied:
        raise OSError(f"sandbox probe failed: {stderr[-500:]}")
    return SandboxResult(
        passed=status == "ok",
        status=status,
        returncode=rc,
        stdout=stdout,
        stderr=stderr,
        duration_s=duration,
        isolation=tuple(f"{n}ns" for n in iso.namespaces) + applied,
        stdout_truncated=len(out) > cap,
        stderr_truncated=len(err) > cap,
    )


def _write_programs(iso: Isolation, workdir: str, program: str, peer: str | None) -> None:
    for name, text in (("main.py", program), ("peer.py", peer)):
        if text is not None:
            with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
                f.write(text)
    if iso.drop_to_uid is not None and "mount" not in iso.namespaces:
        # No private tmpfs: the host directory itself becomes nobody's scratch space.
        os.chown(workdir, iso.drop_to_uid, NOBODY_GID)
        os.chmod(workdir, 0o700)


def _boot_config(iso: Isolation, workdir: str, limits: Limits, *, peer: bool, cgroup) -> dict:
    """What the bootstrap applies (gapo.exec.sandbox_boot); ``report_fd`` and ``go_fd`` are
    filled in by :func:`gapo.exec.sandbox_proc.execute`, which makes those pipes."""
    memory_mb = limits.memory_mb
    # the CPU rlimit: cpu_s (default timeout_s) rounded up, plus one second of slack
    cpu = int(-(-(limits.cpu_s if limits.cpu_s is not None else limits.timeout_s) // 1)) + 1
    mount = "mount" in iso.namespaces
    uid = iso.drop_to_uid
    rlimits = {
        "RLIMIT_AS": memory_mb << 20,
        "RLIMIT_CPU": [cpu, cpu + 1],  # SIGXCPU at the soft limit, SIGKILL a second later
        "RLIMIT_FSIZE": limits.file_size_mb << 20,
        "RLIMIT_NOFILE": 64,
        "RLIMIT_CORE": 0,
        "RLIMIT_NPROC": 0,
    }
    return {
        "workdir": workdir,
        "uid": uid,
        "gid": NOBODY_GID if uid is not None else None,
        "mount": mount,
        "tmpfs_mb": limits.tmpfs_mb,
        "rlimits": rlimits,
        "socket_guard": "net" not in iso.namespaces,
        "python_paths": _python_paths(),
        "reaper": "pid" in iso.namespaces,
        "preimport": [] if mount or uid is None else list(_PREIMPORT),
        "report_fd": None,
        "peer": peer,
        # die with this thread (the bootstrap is always our direct child)
        "parent_pid": os.getpid() if sys.platform.startswith("linux") else None,
        "go_fd": None,
        "cgroup_layers": cgroup.layers if cgroup else [],
        "ipc_limits": _ipc_limits(memory_mb) if "ipc" in iso.namespaces else {},
        "covered": list(sandbox_ns.COVERED_DIRS),
        "sockets": sandbox_ns.host_unix_sockets(keep_under=_python_paths()) if mount else [],
    }


def _status(*, limit_hit: bool, timed_out: bool, applied: tuple, rc: int | None, oom: bool, stderr: str) -> str:
    """One of ``STATUSES`` for a finished run."""
    if limit_hit:
        return "output_limit"
    if timed_out:
        return "timeout"
    if not applied:
        return "sandbox_error"  # the bootstrap died before the program started
    if rc == 0:
        return "ok"
    if rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "timeout"
    if oom:
        return "memory"  # the cgroup's OOM killer (tmpfs, shared memory, memfds count)
    if rc is not None and (rc < 0 or rc > 128):
        return "killed"
    if "MemoryError" in stderr[-2000:]:
        return "memory"
    return "failed"
