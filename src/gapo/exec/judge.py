"""The programs that score a code completion: the judge, the candidate and their value codec.

Kept apart from :mod:`gapo.tasks.code` (datasets, batching, verdicts) because everything here
runs *inside* the sandbox, as source text: the judge holds the nonce and the tests, the
candidate executes the completion and answers calls (see docs/sandbox.md, "Reward integrity").
Everything untrusted reaches these programs as a ``str`` argument; nothing is pasted into code.

The judge trusts nothing the candidate can touch:

- it imports a module the candidate named only when the module is on :data:`SAFE_MODULES`
  (standard-library modules whose import has no side effect; ``unittest.__main__`` would start
  test discovery, ``this`` prints, ``antigravity`` opens a browser, ``idlelib.idle`` starts IDLE);
- it works in ``/`` (read-only in the sandbox, never writable by ``nobody``) and drops every
  ``sys.path`` entry that is relative or writable, so no import and no ``linecache`` lookup
  reads a file the candidate could have written into the shared scratch directory;
- an exception the candidate raises is re-raised in the tests as the same builtin type, except
  ``StopIteration``/``StopAsyncIteration``, which become ``RuntimeError`` at the call boundary
  (as PEP 479 does for generators): otherwise ``all(map(f, xs))`` would stop early and pass.
"""

from __future__ import annotations

MARKER = "__GAPO_TESTS_PASSED__"
# written by the judge when a test passes an argument that cannot cross to the candidate
UNSUPPORTED = "__GAPO_UNSUPPORTED_ARGUMENT__"

# Everything untrusted reaches the programs below as a str argument; nothing is pasted into code.

# The value format of the pipe, run in both processes: JSON with tagged lists, exact builtin
# types only; decode accepts nothing else (any malformed input raises).
CODEC = r"""
def __gapo_codec():
    import collections
    deque, defaultdict = collections.deque, collections.defaultdict
    seq_tags = {list: "l", tuple: "t", set: "s", frozenset: "F"}
    map_tags = {dict: "d", collections.OrderedDict: "o", collections.Counter: "C"}
    seq_types = {v: k for k, v in seq_tags.items()}
    map_types = {v: k for k, v in map_tags.items()}
    factories = {t.__name__: t for t in (int, float, complex, str, bytes, bool, list, tuple,
                                         dict, set, frozenset)}
    factory_names = {v: k for k, v in factories.items()}

    def enc(x):
        t = type(x)
        if x is None or t is str or t is bool or t is float:
            return x
        if t is int:
            return x if -(1 << 53) < x < (1 << 53) else ["I", format(x, "x")]
        if t in seq_tags:
            return [seq_tags[t]] + [enc(y) for y in x]
        if t in map_tags or t is defaultdict:
            pairs = [e for k, v in dict.items(x) for e in (enc(k), enc(v))]
            if t is defaultdict:
                return ["D", factory_names.get(x.default_factory)] + pairs
            return [map_tags[t]] + pairs
        if t is deque:
            return ["q", x.maxlen] + [enc(y) for y in x]
        if t is bytes or t is bytearray:
            return ["b" if t is bytes else "B", x.hex()]
        if t is complex:
            return ["j", x.real, x.imag]
        if t is range:
            return ["r", enc(x.start), enc(x.stop), enc(x.step)]
        raise TypeError("gapo: only plain data (builtin types) crosses between the tests and "
                        "the candidate, got an object of type %r" % (t.__name__,))

    def pairs(items):
        if len(items) % 2:
            raise ValueError("gapo: malformed mapping")
        d = {}
        for i in range(0, len(items), 2):
            d[dec(items[i])] = dec(items[i + 1])
        return d

    def dec(o):
        t = type(o)
        if o is None or t is str or t is bool or t is int or t is float:
            return o
        if t is not list or not o or type(o[0]) is not str:
            raise ValueError("gapo: malformed value")
        tag, rest = o[0], o[1:]
        if tag in seq_types:
            return seq_types[tag](dec(y) for y in rest)
        if tag in map_types:
            d = pairs(rest)
            return d if tag == "d" else map_types[tag](d)
        if tag == "D" and rest and (rest[0] is None or type(rest[0]) is str):
            return defaultdict(factories[rest[0]] if rest[0] is not None else None,
                               pairs(rest[1:]))
        if tag == "q" and rest and (rest[0] is None or type(rest[0]) is int):
            return deque([dec(y) for y in rest[1:]], rest[0])
        if tag in ("b", "B", "I") and len(rest) == 1 and type(rest[0]) is str:
            if tag == "I":
                return int(rest[0], 16)
            return bytes.fromhex(rest[0]) if tag == "b" else bytearray.fromhex(rest[0])
        if tag == "j" and len(rest) == 2 and all(type(v) in (int, float) for v in rest):
            return complex(rest[0], rest[1])
        if tag == "r" and len(rest) == 3:
            return range(*[dec(v) for v in rest])
        raise ValueError("gapo: malformed value")

    return enc, dec
"""

# The candidate process: runs the solution, then answers calls until the pipe closes.
CANDIDATE = r"""
def __gapo_candidate(solution):
    import json, os, sys
    enc, dec = __gapo_codec()
    r, w, _ = __gapo_peer__
    inbox = os.fdopen(r, "rb")

    def send(msg):
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        data = (json.dumps(msg) + "\n").encode()
        while data:
            data = data[os.write(w, data):]

    ns = {"__name__": "__gapo_solution__"}
    try:
        exec(compile(solution, "solution.py", "exec"), ns)
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    items = [(k, v) for k, v in list(ns.items()) if type(k) is str]
    send(["ready", [k for k, v in items if callable(v)],
          {k: v.__name__ for k, v in items if type(v) is type(os)}])
    while True:
        line = inbox.readline()
        if not line:
            os._exit(0)
        try:
            _, name, args, kwargs = json.loads(line)
            reply = ["ret", enc(ns[name](*dec(args), **dec(kwargs)))]
        except BaseException as e:
            try:
                import traceback
                traceback.print_exc()
                reply = ["exc", type(e).__name__, str(e)[:2000]]
            except BaseException:
                reply = ["exc", "Exception", ""]
        send(reply)
"""

#: Modules the judge imports when the candidate imported them (MBPP tests may use the solution's
#: ``math``/``re``/...): standard-library modules whose import only defines names. Anything else
#: (``unittest.__main__``, ``this``, ``antigravity``, ``idlelib.*``, third-party packages, a file
#: the candidate wrote) is never imported because the candidate named it.
SAFE_MODULES = frozenset(
    """
    abc array base64 binascii bisect calendar cmath collections collections.abc colorsys
    contextlib copy dataclasses datetime decimal difflib enum fnmatch fractions functools
    hashlib heapq itertools json keyword math numbers operator os os.path random re statistics
    string struct sys textwrap time types typing unicodedata zlib
""".split()
)

# The judge process: trusted code only. Candidate output reaches it as decoded plain data.
JUDGE = r"""
def __gapo_judge(trusted, tests, entry_point, marker, unsupported):
    import builtins, json, os, sys, time
    # Nothing the candidate can write is read from here on: "/" is read-only in the sandbox (and
    # never writable by nobody), and sys.path keeps only absolute, non-writable directories.
    os.chdir("/")
    sys.path[:] = [p for p in sys.path if p.startswith("/") and not os.access(p, os.W_OK)]
    sys.path_importer_cache.clear()
    safe_modules = frozenset(__SAFE_MODULES__)
    nonce = b""
    while True:
        chunk = os.read(0, 256)
        if not chunk:
            break
        nonce += chunk
    nonce = nonce.strip()
    enc, dec = __gapo_codec()
    r, w, pid = __gapo_peer__
    inbox = os.fdopen(r, "rb")
    builtin_names = vars(builtins)
    eof = []

    class CandidateError(Exception):
        pass

    def recv():
        line = inbox.readline(64 << 20)
        if not line.endswith(b"\n"):
            eof.append(not line)
            raise CandidateError("the candidate process ended" if not line
                                 else "the candidate sent an oversized message")
        return json.loads(line)

    def send(msg):
        data = (json.dumps(msg) + "\n").encode()
        while data:
            data = data[os.write(w, data):]

    def proxy(name):
        def candidate(*args, **kwargs):
            try:
                msg = ["call", name, enc(list(args)), enc(kwargs)]
            except TypeError as e:  # the dataset's fault, not the candidate's: say so (see _verdict)
                sys.stderr.write("%s %s\n" % (unsupported, e))
                raise
            send(msg)
            reply = recv()
            if type(reply) is list and len(reply) == 2 and reply[0] == "ret":
                return dec(reply[1])
            if type(reply) is list and len(reply) == 3 and reply[0] == "exc":
                if reply[1] == "TypeError" and str(reply[2]).startswith("gapo: only plain data"):
                    sys.stderr.write("%s %s\n" % (unsupported, reply[2]))
                exc = builtin_names.get(reply[1]) if type(reply[1]) is str else None
                if exc is StopIteration or exc is StopAsyncIteration:
                    # PEP 479 at the call boundary: a StopIteration out of a call must not end
                    # the tests' iteration early (all(map(f, xs)) would be True).
                    raise RuntimeError("the candidate raised %s: %s" % (reply[1], reply[2]))
                if type(exc) is type and issubclass(exc, Exception):
                    raise exc(str(reply[2]))
                raise CandidateError("%s: %s" % (reply[1], reply[2]))
            raise CandidateError("malformed reply from the candidate")
        candidate.__name__ = name
        return candidate

    ok = False
    try:
        helpers = {}
        if trusted:  # while the candidate starts
            tns = {"__name__": "__gapo_prompt__"}
            exec(compile(trusted, "prompt.py", "exec"), tns)
            helpers = {k: v for k, v in tns.items() if k != entry_point and k[:2] != "__"}
        hello = recv()
        if type(hello) is not list or len(hello) != 3 or hello[0] != "ready" or \
                type(hello[1]) is not list or type(hello[2]) is not dict:
            raise CandidateError("malformed handshake from the candidate")
        names = [n for n in hello[1] if type(n) is str]

        def visible(n):
            return n.isidentifier() and not n.startswith("__") and n not in builtin_names

        test_ns = {}
        if entry_point is not None:
            if entry_point in names:
                test_ns[entry_point] = proxy(entry_point)
        else:
            test_ns.update((n, proxy(n)) for n in names if visible(n))
            # Modules the solution imported, for tests that rely on them: the judge's own
            # import of the same module, only for standard-library modules whose import has
            # no side effect (unittest.__main__ would run test discovery, in the judge).
            for alias, mod in hello[2].items():
                if visible(alias) and type(mod) is str and mod in safe_modules:
                    __import__(mod)
                    test_ns[alias] = sys.modules[mod]
        test_ns.update(helpers)
        test_ns["__name__"] = "__gapo_tests__"
        exec(compile(tests, "tests.py", "exec"), test_ns)
        if entry_point is not None:
            test_ns["check"](test_ns[entry_point])
        ok = True
    except BaseException:
        try:
            import traceback
            traceback.print_exc()
        except BaseException:
            pass
    # Stop the candidate; when it ended on its own (e.g. SIGXCPU), exit the way it did.
    status = None
    try:
        for _ in range(50 if eof and eof[0] else 0):
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
            time.sleep(0.01)
        if status is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    except OSError:
        pass
    if ok:
        sys.stdout.flush()
        os.write(1, b"\n" + marker.encode() + b" " + nonce + b"\n")
        os._exit(0)
    if status is not None and os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(1)
"""

JUDGE = JUDGE.replace("__SAFE_MODULES__", repr(sorted(SAFE_MODULES)))

# strict_returns=False: the older single-process harness (the candidate's objects reach the
# tests as they are, so no plain-data check is possible; see the module docstring).
HARNESS = r"""
def __gapo_harness(solution, trusted, tests, entry_point, marker):
    import os, sys, builtins
    read, write, _exit, _exec, _compile = os.read, os.write, os._exit, exec, compile
    gettrace, getprofile, BaseExc = sys.gettrace, sys.getprofile, BaseException
    nonce = b""
    while True:
        chunk = read(0, 256)
        if not chunk:
            break
        nonce += chunk
    nonce = nonce.strip()
    builtins_snapshot = dict(vars(builtins))
    ok = False
    try:
        ns = {"__name__": "__gapo_solution__"}
        _exec(_compile(solution, "solution.py", "exec"), ns)
        test_ns = dict(ns)
        if trusted:
            tns = {"__name__": "__gapo_prompt__", "__builtins__": builtins_snapshot}
            _exec(_compile(trusted, "prompt.py", "exec"), tns)
            for k, v in tns.items():
                if k != entry_point and not k.startswith("__"):
                    test_ns[k] = v
        test_ns["__name__"] = "__gapo_tests__"
        test_ns["__builtins__"] = builtins_snapshot
        _exec(_compile(tests, "tests.py", "exec"), test_ns)
        if entry_point is not None:
            test_ns["check"](test_ns[entry_point])
        ok = gettrace() is None and getprofile() is None
    except BaseExc:
        try:
            import traceback
            traceback.print_exc()
        except BaseExc:
            pass
    if ok:
        try:
            sys.stdout.flush()
        except BaseExc:
            pass
        write(1, b"\n" + marker.encode() + b" " + nonce + b"\n")
        _exit(0)
    _exit(1)
"""
