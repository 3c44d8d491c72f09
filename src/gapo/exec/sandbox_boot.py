"""The sandbox's trusted bootstrap (:data:`BOOT`), run in the child as ``python -I -B -c BOOT cfg``.

It runs still privileged, inside the namespaces :mod:`gapo.exec.sandbox` asked ``unshare`` for, and
applies the isolation *from the inside* before the program runs: set ``PR_SET_PDEATHSIG``
(die with the parent), wait until the parent has moved it into the sandbox's cgroups, start
PID 1 of the new PID namespace with its own ``/proc``, bound the fresh IPC namespace's SysV/POSIX
limits, make the mount tree read-only, cover ``/tmp``, ``/var/tmp``, ``/run`` (``/var/run``) and
``/dev/shm`` with private tmpfs, replace ``/dev`` by a minimal read-only one (null, zero, full,
random, urandom), cover the host's other listening Unix socket files, re-expose the interpreter
when needed (the stdlib and site-packages only), fork the peer, set rlimits and
``no_new_privs``, join a private session keyring and deny the keyring syscalls (seccomp), drop
to ``nobody``, report the applied layers on a pipe and ``exec`` the program in-process (no
``execve`` after the uid switch: ``RLIMIT_NPROC=0`` would refuse it, which is intended). Kept
in its own module because it is source text for another interpreter, not code of this one.
"""

# flake8: noqa
BOOT = r"""
import json, os, sys
cfg = json.loads(sys.argv[1])
applied = []


def fork_and_mirror():
    # Fork; the parent waits for the child and exits with its status, the child returns.
    child = os.fork()
    if child:
        os.close(cfg["report_fd"])
        while True:
            try:
                _, st = os.waitpid(child, 0)
                break
            except InterruptedError:
                continue
        code = os.waitstatus_to_exitcode(st)
        os._exit(code if code >= 0 else 128 - code)


import ctypes
try:
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
except (OSError, AttributeError):  # not Linux
    prctl = lambda *a: -1
if cfg["parent_pid"] is not None:
    # Die with the parent (a scoring worker killed on timeout takes its sandboxes along).
    prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL
    if os.getppid() != cfg["parent_pid"]:
        os._exit(125)
if cfg["go_fd"] is not None:
    # The parent moves this process into the sandbox's cgroups while this interpreter starts
    # (a move costs the kernel an RCU grace period, ~6 ms here); wait for it before any fork.
    go = os.read(cfg["go_fd"], 1)
    os.close(cfg["go_fd"])
    if go == b"1":
        applied.extend(cfg["cgroup_layers"])
if cfg["reaper"]:
    # unshare --pid without --fork: our first child is PID 1 of the new PID namespace. Start
    # it, mirror its exit; it dies with us, and everything in the namespace dies with it.
    fork_and_mirror()
    prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL
    if cfg["mount"] and libc.mount(b"proc", b"/proc", b"proc", 2 | 4 | 8, None) != 0:
        os._exit(125)  # the namespace's own /proc (unshare's --mount-proc)
wd = cfg["workdir"]
files = {}
for name in ("main.py", "peer.py") if cfg["peer"] else ("main.py",):
    with open(os.path.join(wd, name), "rb") as f:
        files[name] = f.read()
uid, gid = cfg["uid"], cfg["gid"]
if cfg["ipc_limits"]:
    # A fresh IPC namespace has the host's defaults (shmall of petabytes, 32000 message queues):
    # bound them to this sandbox's memory. Written before the tree becomes read-only.
    n = 0
    for key, value in cfg["ipc_limits"].items():
        try:
            with open("/proc/sys/" + key, "w") as f:
                f.write(str(value))
            n += 1
        except OSError:
            pass
    if n == len(cfg["ipc_limits"]):
        applied.append("ipc-limits")
if cfg["mount"]:
    def _err(what):
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), what)
    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]
    # mount_setattr(AT_FDCWD, "/", AT_RECURSIVE, {RDONLY|NOSUID|NODEV}): whole tree read-only.
    attr = MountAttr(0x1 | 0x2 | 0x4, 0, 0, 0)
    SYS_mount_setattr = {"x86_64": 442, "aarch64": 442}.get(os.uname().machine)
    if SYS_mount_setattr is not None and libc.syscall(SYS_mount_setattr, -100, b"/", 0x8000,
                                                      ctypes.byref(attr),
                                                      ctypes.sizeof(attr)) == 0:
        applied.append("ro-root")
    opts_tmp = "size=%dm,mode=1777" % cfg["tmpfs_mb"]
    owner = "uid=%d,gid=%d," % (uid, gid) if uid is not None else ""
    # The interpreter may live under a covered directory (a virtual environment in /tmp): keep a
    # handle on each such Python directory, and bind it back, read-only, onto the fresh tmpfs.
    under = {}
    for p in cfg["python_paths"]:
        if any(p == d or p.startswith(d.rstrip("/") + "/") for d in cfg["covered"]):
            try:
                under[p] = os.open(p, os.O_PATH)
            except OSError:
                pass
    for d in cfg["covered"]:
        if os.path.isdir(d) and not os.path.islink(d) and d != "/dev/shm":
            if libc.mount(b"tmpfs", d.encode(), b"tmpfs", 2 | 4, opts_tmp.encode()) != 0:
                _err(d)
    for p, fd in sorted(under.items()):
        os.makedirs(p, mode=0o755, exist_ok=True)
        if libc.mount(("/proc/self/fd/%d" % fd).encode(), p.encode(), None, 4096 | 16384, None) != 0:
            _err(p)  # MS_BIND | MS_REC
        os.close(fd)
        if SYS_mount_setattr is not None:
            ro = MountAttr(0x1 | 0x2 | 0x4, 0, 0, 0)
            libc.syscall(SYS_mount_setattr, -100, p.encode(), 0x8000, ctypes.byref(ro), ctypes.sizeof(ro))
    applied.append("private-run-tmp")
    # A minimal /dev: the tree above is nodev, so the host's /dev/null would be unusable; bind
    # the harmless character devices onto a fresh read-only tmpfs (no disks, no tty, no fuse).
    devs = {}
    for n in ("null", "zero", "full", "random", "urandom"):
        try:
            devs[n] = os.open("/dev/" + n, os.O_PATH)
        except OSError:
            pass
    if libc.mount(b"tmpfs", b"/dev", b"tmpfs", 2, b"size=64k,mode=0755") != 0:
        _err("/dev")
    for n, fd in devs.items():
        target = "/dev/" + n
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o666))
        if libc.mount(("/proc/self/fd/%d" % fd).encode(), target.encode(), None, 4096,
                      None) != 0:  # MS_BIND
            _err(target)
        os.close(fd)
        clr = MountAttr(0, 0x4, 0, 0)  # clear MOUNT_ATTR_NODEV on this node only
        if SYS_mount_setattr is not None:
            libc.syscall(SYS_mount_setattr, -100, target.encode(), 0, ctypes.byref(clr),
                         ctypes.sizeof(clr))
    for n, t in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                 ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(t, "/dev/" + n)
    os.mkdir("/dev/shm")
    if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 2 | 4, opts_tmp.encode()) != 0:
        _err("/dev/shm")
    if SYS_mount_setattr is not None:
        ro = MountAttr(0x1, 0, 0, 0)
        libc.syscall(SYS_mount_setattr, -100, b"/dev", 0, ctypes.byref(ro), ctypes.sizeof(ro))
    applied.append("dev-minimal")
    # Listening socket files of the host elsewhere: cover each with an empty file.
    if cfg["sockets"]:
        blank = "/tmp/.gapo-no-socket"
        os.close(os.open(blank, os.O_CREAT | os.O_WRONLY, 0o444))
        for p in cfg["sockets"]:
            libc.mount(blank.encode(), p.encode(), None, 4096, None)
        os.unlink(blank)
    # The interpreter's own files must stay importable after the uid switch (e.g. a pyenv
    # Python under /root, mode 0700): cover each such non-searchable ancestor with a read-only
    # tmpfs that holds nothing but read-only bind mounts of the directories Python needs.
    blocked = {}
    for p in cfg["python_paths"]:
        parts = p.split("/")
        for i in range(2, len(parts)):
            anc = "/".join(parts[:i])
            try:
                if not os.stat(anc).st_mode & 0o001:
                    blocked.setdefault(anc, set()).add(p)
                    break
            except OSError:
                break
    for k, (anc, paths) in enumerate(sorted(blocked.items())):
        stages = []
        for j, p in enumerate(sorted(paths)):
            st = "/tmp/.gapo-stage-%d-%d" % (k, j)
            os.mkdir(st)
            if libc.mount(p.encode(), st.encode(), None, 4096 | 16384, None) != 0:  # BIND|REC
                _err(p)
            stages.append((st, p))
        if libc.mount(b"tmpfs", anc.encode(), b"tmpfs", 2 | 4, b"size=1m,mode=0755") != 0:
            _err(anc)
        for st, p in stages:
            os.makedirs(p, mode=0o755, exist_ok=True)
            if libc.mount(st.encode(), p.encode(), None, 8192, None) != 0:  # MS_MOVE
                _err(p)
            os.rmdir(st)
        ro = MountAttr(0x1, 0, 0, 0)
        if SYS_mount_setattr is not None:
            libc.syscall(SYS_mount_setattr, -100, anc.encode(), 0, ctypes.byref(ro),
                         ctypes.sizeof(ro))
        applied.append("python-bind")
    if not os.path.isdir(wd):
        os.makedirs(wd, mode=0o700)
    o = ("size=%dm,mode=0700," % cfg["tmpfs_mb"]) + owner.rstrip(",")
    if libc.mount(b"tmpfs", wd.encode(), b"tmpfs", 2 | 4, o.rstrip(",").encode()) != 0:
        _err(wd)
    for name, data in files.items():
        with open(os.path.join(wd, name), "wb") as f:
            f.write(data)
        if uid is not None:
            os.chown(os.path.join(wd, name), uid, gid)
    applied.append("tmpfs")
if cfg["reaper"]:
    # We are PID 1 of a new PID namespace, and PID 1 ignores signals without a handler (even
    # SIGKILL/SIGSEGV sent by itself): run the program in a child and mirror its exit.
    fork_and_mirror()
me, peer = "main.py", None
if cfg["peer"]:
    # Two processes: this one runs main.py, a child runs peer.py; they talk over two pipes.
    # Non-dumpable (before the fork, again after the uid switch): the peer cannot ptrace this
    # process nor open its /proc/<pid>/{mem,fd,environ}, so what main.py holds stays private.
    prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    main_r, peer_w = os.pipe()
    peer_r, main_w = os.pipe()
    main_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        me, peer = "peer.py", (peer_r, peer_w, main_pid)
        for fd in (main_r, main_w, cfg["report_fd"]):
            os.close(fd)
        fd, w = os.pipe()  # stdin (e.g. a secret for main.py) is not ours: an empty pipe
        os.close(w)
        os.dup2(fd, 0)
        os.close(fd)
    else:
        peer = (main_r, main_w, pid)
        os.close(peer_r)
        os.close(peer_w)
src = files.pop(me)
files.clear()
path = os.path.join(wd, me)
import resource
for name, value in cfg["rlimits"].items():
    try:
        soft, hard = value if isinstance(value, list) else (value, value)
        resource.setrlimit(getattr(resource, name), (soft, hard))
        applied.append(name)
    except (ValueError, OSError, AttributeError):
        pass
if prctl(38, 1, 0, 0, 0) == 0:  # PR_SET_NO_NEW_PRIVS
    applied.append("no_new_privs")
if sys.platform.startswith("linux"):
    # Kernel keyrings belong to the uid, not to a namespace: a key one run adds to uid 65534's
    # user keyring (@u, @us, the persistent keyring) outlives it and is read by the next run.
    # A private anonymous session keyring (@s) first, then a seccomp filter that denies
    # add_key, request_key and keyctl outright (the robust part: @u cannot be made private).
    SECCOMP = {"x86_64": (0xC000003E, (248, 249, 250)), "aarch64": (0xC00000B7, (217, 218, 219)),
               "riscv64": (0xC00000F3, (217, 218, 219))}.get(os.uname().machine)
    if SECCOMP is not None:
        audit_arch, (nr_add_key, nr_request_key, nr_keyctl) = SECCOMP
        if libc.syscall(nr_keyctl, 1, None, 0, 0, 0) >= 0:  # KEYCTL_JOIN_SESSION_KEYRING(NULL)
            applied.append("session-keyring")
        class SockFilter(ctypes.Structure):
            _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                        ("k", ctypes.c_uint32)]
        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]
        LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ..|JGE|K, BPF_RET|K
        ALLOW, DENY = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
        # seccomp_data: nr at offset 0, arch at 4. Another ABI (i386 via int 0x80, x32 numbers
        # with bit 30) would have other numbers: every call of such an ABI is denied.
        checks = [(JGE, 0x40000000)] if audit_arch == 0xC000003E else []
        checks += [(JEQ, nr) for nr in (nr_add_key, nr_request_key, nr_keyctl)]
        prog = [(LD, 0, 0, 4), (JEQ, 1, 0, audit_arch), (RET, 0, 0, DENY), (LD, 0, 0, 0)]
        n_after = len(checks) + 1  # the checks, then ALLOW, then DENY
        for i, (op, k) in enumerate(checks):
            prog.append((op, n_after - 1 - i, 0, k))
        prog += [(RET, 0, 0, ALLOW), (RET, 0, 0, DENY)]
        insns = (SockFilter * len(prog))(*[SockFilter(*x) for x in prog])
        fprog = SockFprog(len(prog), insns)
        if prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
            applied.append("seccomp-keyring")
if cfg["socket_guard"]:
    import socket, _socket
    class _NoSocket:
        def __init__(self, *a, **k):
            raise PermissionError("network access is disabled in the gapo sandbox")
    for mod in (socket, _socket):
        for attr_name in ("socket", "socketpair", "create_connection", "create_server",
                          "fromfd", "getaddrinfo"):
            if hasattr(mod, attr_name):
                setattr(mod, attr_name, _NoSocket)
    applied.append("socket-guard")
for name in cfg["preimport"]:
    # Without a mount namespace, an interpreter under a directory nobody cannot search (e.g.
    # /root/.pyenv) cannot import after the uid switch: load the common modules now.
    try:
        __import__(name)
    except Exception:
        pass
if uid is not None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    applied.append("uid=%d" % uid)
    if cfg["parent_pid"] is not None and not cfg["reaper"] and me == "main.py":
        prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG again: the uid switch reset it
        if os.getppid() != cfg["parent_pid"]:
            os._exit(125)
os.chdir(wd)
if me == "peer.py":
    prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL (reset by the uid switch: set now)
    if os.geteuid() == 0:
        # Root inside a user namespace (no uid to switch to): drop every capability, or this
        # process could ptrace main.py's despite it being non-dumpable.
        cap = 0
        while prctl(24, cap, 0, 0, 0) == 0:  # PR_CAPBSET_DROP
            cap += 1
        if libc.capset((ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()) != 0:
            os.write(2, b"gapo sandbox: cannot drop capabilities of the peer process\n")
            os._exit(125)
    # Wait for main.py's process to be private (and alive) before running anything.
    if os.read(peer[0], 1) != b"\x00" or os.getppid() != peer[2]:
        os._exit(125)
else:
    if peer is not None:
        prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE (the uid switch may have reset it)
        os.write(peer[1], b"\x00")
        applied.append("peer-process")
    os.write(cfg["report_fd"], json.dumps(applied).encode())
    os.close(cfg["report_fd"])
if peer is None or me == "peer.py":
    sys.path[0:0] = [wd]  # main.py of a pair imports nothing from the shared, writable dir
sys.argv = [path]
code = compile(src, path, "exec")
del src
g = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
if peer is not None:
    g["__gapo_peer__"] = peer
exec(code, g)
"""
