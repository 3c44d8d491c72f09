"""Host-side helpers of :mod:`gapo.exec.sandbox`: per-sandbox cgroups and the host's Unix sockets.

Kept apart from ``sandbox.py`` (the API) and ``sandbox_proc.py`` (the process pump) because
this is Linux plumbing with its own failure modes; every function degrades to "not available"
instead of raising, and :func:`gapo.exec.sandbox.capabilities` reports what holds on this
machine.

**Cgroups.** Each sandbox gets its own cgroup, *nested under the calling process's own cgroup*
(so whatever limits the caller lives under still apply, and nothing is moved out of them):

- cgroup v2 (the unified hierarchy, controllers or not): ``cgroup.kill`` kills every process of
  the sandbox, wherever it moved to (another session, another process group) when the call ends;
  with the ``memory`` controller delegated to the caller's cgroup, also ``memory.max``.
- cgroup v1 ``memory`` (hybrid hosts such as this one): ``memory.limit_in_bytes``.

The memory limit covers what ``RLIMIT_AS`` does not see: tmpfs files (``/dev/shm``, ``/tmp``),
SysV/POSIX shared memory and memfds written with ``write()``, page tables, pipe buffers.
The parent moves the sandbox's bootstrap into the cgroups while its interpreter starts, and
the bootstrap waits for that before it forks anything, so every process of the sandbox is
inside. Cgroups are reused while clean (see :class:`Cgroup`). A cgroup's name carries the
creating process's pid, so :func:`reap_orphans` can find and kill the sandboxes of a process
that died (a scoring worker killed on timeout) and remove their cgroups.

**Host Unix sockets.** A network namespace hides abstract Unix sockets, but a socket *file* is
reachable through the file system (``connect`` works on a read-only mount). The sandbox covers
``/run``, ``/var/run``, ``/tmp``, ``/var/tmp`` and ``/dev/shm`` with private tmpfs, and
:func:`host_unix_sockets` lists the listening socket files elsewhere (from ``/proc/net/unix``) so
the bootstrap can bind an empty file over each.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import shutil
import stat
import tempfile
import threading
import time

__all__ = [
    "Cgroup",
    "FreeCgroups",
    "FREE_CGROUPS",
    "acquire",
    "cgroup_support",
    "host_unix_sockets",
    "reap_orphans",
    "COVERED_DIRS",
]

#: Directories the sandbox covers with a private tmpfs (nothing of the host shows through).
COVERED_DIRS = ("/tmp", "/var/tmp", "/run", "/var/run", "/dev/shm")

_PREFIX = "gapo-sbx-"
_counter = itertools.count()


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, options) of this process's mount table."""
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            return [(p[1], p[2], p[3]) for p in (line.split() for line in f) if len(p) >= 4]
    except OSError:
        return []


def _own_cgroups() -> dict[str, str]:
    """``{"v2": path, "memory": path}`` of this process (``/proc/self/cgroup``)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            for line in f:
                hid, ctrls, path = line.rstrip("\n").split(":", 2)
                if hid == "0" and ctrls == "":
                    out["v2"] = path
                elif "memory" in ctrls.split(","):
                    out["memory"] = path
    except (OSError, ValueError):
        pass
    return out


@functools.lru_cache(maxsize=1)
def cgroup_support() -> dict[str, str]:
    """Parent directories for sandbox cgroups on this machine (detected once, by creating and
    removing a test cgroup): ``{"kill": dir}`` for cgroup v2 ``cgroup.kill``, ``{"memory":
    dir, "memory_kind": "v2"|"v1"}`` for a memory limit. Empty where nothing is usable (not
    Linux, not root and nothing delegated, a container without cgroupfs)."""
    if os.environ.get("GAPO_SANDBOX_NO_CGROUPS") == "1":
        return {}
    own = _own_cgroups()
    out: dict[str, str] = {}
    for mnt, fstype, _ in _mounts():
        if fstype == "cgroup2" and "v2" in own and "kill" not in out:
            base = os.path.normpath(mnt + own["v2"])
            if _probe(base, "cgroup.kill"):
                out["kill"] = base
                try:
                    with open(os.path.join(base, "cgroup.subtree_control")) as f:
                        if "memory" in f.read().split():
                            out["memory"], out["memory_kind"] = base, "v2"
                except OSError:
                    pass
    if "memory" not in out and "memory" in own:
        for mnt, fstype, opts in _mounts():
            if fstype == "cgroup" and "memory" in opts.split(","):
                base = os.path.normpath(mnt + own["memory"])
                if _probe(base, "memory.limit_in_bytes"):
                    out["memory"], out["memory_kind"] = base, "v1"
                break
    if out:
        _reap(out)  # leftovers of processes killed before they could clean up
    return out


def _probe(base: str, needed: str) -> bool:
    path = os.path.join(base, f"{_PREFIX}probe-{os.getpid()}")
    try:
        os.mkdir(path)
    except OSError:
        return False
    try:
        return os.path.exists(os.path.join(path, needed))
    finally:
        _rmdir(path)


def _write(path: str, value: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(value)
        return True
    except OSError:
        return False


def _rmdir(path: str, tries: int = 50) -> None:
    for _ in range(tries):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY: the last process is still exiting
            time.sleep(0.002)


class Cgroup:
    """The cgroup(s) of one sandbox. Get one with :func:`acquire`, give it back with
    :meth:`release`.

    Cgroups are *reused* (a free list per process): the first process to enter a new cgroup
    costs the kernel 6-9 ms here (measured: 0.25 ms into an existing one), which was 20 % of
    the code tasks' scoring throughput. A cgroup goes back on the list only when it is empty
    and holds no memory that cannot be reclaimed (page cache can be; a file left on a host
    tmpfs by a run without a mount namespace cannot): otherwise it is removed and the next run
    gets a fresh one. The memory limit is set for each run.
    """

    def __init__(self):
        sup = cgroup_support()
        name = f"{_PREFIX}{os.getpid()}-{next(_counter)}"
        self.dirs: list[str] = []
        self.kill_dir = self.mem_dir = None
        self.mem_v1 = False
        self.layers: list[str] = []
        self._ooms = 0
        if "kill" in sup and _mkdir(os.path.join(sup["kill"], name)):
            self.kill_dir = os.path.join(sup["kill"], name)
            self.dirs.append(self.kill_dir)
            self.layers.append("cgroup-kill")
        if "memory" in sup:
            d = os.path.join(sup["memory"], name)
            if d == self.kill_dir or _mkdir(d):
                if d != self.kill_dir:
                    self.dirs.append(d)
                self.mem_dir, self.mem_v1 = d, sup["memory_kind"] == "v1"
                # No swap either: tmpfs pages must not move to swap out of the limit's sight.
                for f, v in (("memory.swap.max", "0"), ("memory.swappiness", "0")):
                    if os.path.exists(os.path.join(d, f)):
                        _write(os.path.join(d, f), v)

    def _set_limit(self, memory_bytes: int) -> bool:
        d, v = self.mem_dir, str(memory_bytes)
        if not self.mem_v1:
            return _write(os.path.join(d, "memory.max"), v)
        mem, memsw = (os.path.join(d, f) for f in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"))
        if not os.path.exists(memsw):
            return _write(mem, v)
        # memsw must stay >= the memory limit: the order depends on the direction
        return (_write(mem, v) and _write(memsw, v)) or (_write(memsw, v) and _write(mem, v))

    def _arm(self, memory_bytes: int) -> None:
        self.layers = [x for x in self.layers if x != "cgroup-memory"]
        if self.mem_dir is not None and self._set_limit(memory_bytes):
            self.layers.append("cgroup-memory")
            self._ooms = self._oom_count()

    def add(self, pid: int) -> bool:
        """Move process ``pid`` (the sandbox's bootstrap, before it forks) into every cgroup."""
        return bool(self.dirs) and all(_write(os.path.join(d, "cgroup.procs"), str(pid)) for d in self.dirs)

    def _oom_count(self) -> int:
        name = "memory.oom_control" if self.mem_v1 else "memory.events"
        try:
            with open(os.path.join(self.mem_dir, name)) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == "oom_kill":
                        return int(v)
        except (OSError, ValueError, TypeError):
            pass
        return 0

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer killed a process of this run (memory limit)."""
        return self.mem_dir is not None and self._oom_count() > self._ooms

    def _usage(self) -> int:
        name = "memory.usage_in_bytes" if self.mem_v1 else "memory.current"
        try:
            with open(os.path.join(self.mem_dir, name)) as f:
                return int(f.read())
        except (OSError, ValueError, TypeError):
            return 0

    def release(self) -> None:
        """Kill whatever is still inside; back on the free list if clean, else removed."""
        for d in self.dirs:
            if not _write(os.path.join(d, "cgroup.kill"), "1"):
                _kill_listed(os.path.join(d, "cgroup.procs"))
        clean = all(_empty(os.path.join(d, "cgroup.procs")) for d in self.dirs)
        if clean and self.mem_dir is not None and self._usage() > (8 << 20):
            # page cache is reclaimable; anything else (a host tmpfs file) is not: try once
            if self.mem_v1:
                _write(os.path.join(self.mem_dir, "memory.force_empty"), "0")
            clean = self._usage() <= (8 << 20)
        if not (clean and self.dirs and FREE_CGROUPS.put(self)):
            self.destroy()

    def destroy(self) -> None:
        """Kill whatever is still inside and remove the cgroups."""
        _kill_and_remove(self.dirs)
        self.dirs = []


class FreeCgroups:
    """The one owner of the process's clean, reusable cgroups (a first move into a new cgroup
    costs 6-9 ms, into an existing one 0.25 ms; docs/sandbox.md). At most ``cap`` are kept; a
    forked child starts with none (it must not reuse its parent's); :meth:`clear` removes them
    all (at exit, or between tests). The module-level instance is :data:`FREE_CGROUPS`."""

    def __init__(self, cap: int = 64):
        self.cap = cap
        self._lock = threading.Lock()
        self._free: list[Cgroup] = []
        self._pid = os.getpid()

    def _mine(self) -> None:  # under the lock
        if self._pid != os.getpid():
            self._free, self._pid = [], os.getpid()

    def take(self) -> Cgroup | None:
        with self._lock:
            self._mine()
            return self._free.pop() if self._free else None

    def put(self, cg: Cgroup) -> bool:
        """Keep ``cg`` for reuse; False (the caller removes it) when the cache is full."""
        with self._lock:
            self._mine()
            if len(self._free) >= self.cap:
                return False
            self._free.append(cg)
            return True

    def __len__(self) -> int:
        with self._lock:
            self._mine()
            return len(self._free)

    def clear(self) -> None:
        with self._lock:
            free = self._free if self._pid == os.getpid() else []
            self._free = []
        for cg in free:
            cg.destroy()


FREE_CGROUPS = FreeCgroups()
atexit.register(FREE_CGROUPS.clear)


def acquire(memory_bytes: int) -> Cgroup:
    """A cgroup for one run, with its memory limit set to ``memory_bytes``."""
    cg = FREE_CGROUPS.take()
    if cg is None:
        cg = Cgroup()
    cg._arm(memory_bytes)
    return cg


def _empty(procs_file: str) -> bool:
    for _ in range(100):
        try:
            with open(procs_file) as f:
                if not f.read().strip():
                    return True
        except OSError:
            return False
        time.sleep(0.001)
    return False


def _mkdir(path: str) -> bool:
    try:
        os.mkdir(path)
        return True
    except OSError:
        return False


def _kill_and_remove(dirs: list[str]) -> None:
    for d in dirs:
        if not _write(os.path.join(d, "cgroup.kill"), "1"):
            _kill_listed(os.path.join(d, "cgroup.procs"))
    for d in dirs:
        _rmdir(d)


def _kill_listed(procs_file: str) -> None:
    """Without ``cgroup.kill`` (v1): SIGKILL every pid listed, until none is left."""
    for _ in range(20):
        try:
            with open(procs_file) as f:
                pids = [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        time.sleep(0.005)


def reap_orphans() -> int:
    """Kill the sandboxes whose creating process is gone and remove their cgroups (e.g. after
    a scoring worker was killed on timeout); returns how many cgroups were removed."""
    return _reap(cgroup_support()) + _remove_stale_dirs()


def _reap(sup: dict[str, str]) -> int:
    stale = []
    for base in {sup.get("kill"), sup.get("memory")} - {None}:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for n in names:
            if not n.startswith(_PREFIX):
                continue
            try:
                owner = int(n[len(_PREFIX) :].split("-")[0])
            except ValueError:
                continue
            if not _alive(owner):
                stale.append(os.path.join(base, n))
    _kill_and_remove(stale)
    return len(stale)


def _remove_stale_dirs() -> int:
    """Scratch directories (``$TMPDIR/gapo-sbx-<pid>-*``) of sandbox owners that died before
    their ``finally`` could remove them."""
    base, n = tempfile.gettempdir(), 0
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        try:
            owner = int(name[len(_PREFIX) :].split("-")[0])
        except ValueError:
            continue
        if not _alive(owner):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
            n += 1
    return n


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def host_unix_sockets(limit: int = 4096, keep_under: list[str] = ()) -> list[str]:
    """Listening Unix socket files of the host outside :data:`COVERED_DIRS` (which the sandbox
    hides anyway), from ``/proc/net/unix``: the bootstrap binds an empty file over each. Paths
    under ``keep_under`` count even inside a covered directory: the bootstrap binds those
    directories back (the interpreter's own files, e.g. a virtual environment in /tmp)."""
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return []
    covered = tuple(d + "/" for d in COVERED_DIRS) + ("/dev/",)
    out = []
    for line in lines:
        parts = line.split(None, 7)
        if len(parts) < 8 or not parts[7].startswith("/"):
            continue
        path = parts[7]
        if path in out:
            continue
        if path.startswith(covered) and not any(path.startswith(k.rstrip("/") + "/") for k in keep_under):
            continue
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                out.append(path)
        except OSError:
            continue
        if len(out) >= limit:
            break
    return out
