"""The commands the tests start, forked from a process that has already imported the library.

A command's process spends some 0.15 s of CPU starting (Python, NumPy and the package imported)
before it does anything, and the tests start some 400: more than a third of the suite's CPU
time. :func:`run` and :class:`Popen` take the arguments of :mod:`subprocess`'s, and start
``python SCRIPT ...``, ``python -m MODULE ...`` and ``python -c CODE ...`` as a fork of a server
of this test process's own (one a pytest worker, started on first use, ended with it), which
imported the commands' modules once. The command is still a process of its own, with its pid,
its pipes, its working folder, its environment, its signals and its exit status; it runs its
script as ``__main__`` as Python would and ends as Python ends (non-daemon threads joined, exit
handlers run, the streams flushed; an uncaught KeyboardInterrupt ends it by SIGINT).

What a fork cannot give is a start from nothing, so a command is started as a real process
where that matters: where its environment differs from the server's in what is read as Python,
NumPy or OpenBLAS load (``PYTHON*`` but the path, the locale, ``OPENBLAS_*``, ``NPY_*``, ...),
where the interpreter gets options, where a ``PYTHONPATH`` entry holds a module the server
imported, where ``pass_fds``, ``preexec_fn``, a user or a group are asked for, and wherever a
test starts ``subprocess``'s own. The tests of the process itself (its start, its imports,
its locale, the exit statuses of every command) start real processes.

One difference is kept in mind: the forks share the server's hash seed, where real processes
draw each their own; a test of what must not depend on it starts real processes.

    python tests/forkserver.py SOCKET     # the server (started by this module)
"""

from __future__ import annotations

import atexit
import inspect
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["Popen", "run", "served"]

# The modules the commands import (each command imports its own share of them at start)
PRELOAD = ("minitfm.commands.train_toy", "minitfm.commands.train_wmt",
           "minitfm.commands.train_lm", "minitfm.translate", "minitfm.average",
           "minitfm.export.source", "minitfm.learn.workshop", "minitfm.cli.reporting")

# Read when Python, NumPy or OpenBLAS start, not when a command runs: a command whose
# environment differs from the server's in one of these is started as a real process.
READ_AT_START = ("PYTHON", "LC_", "LANG", "OPENBLAS_", "GOTO", "OMP_", "MKL_", "NPY_", "NUMPY_",
                 "TZ", "SOURCE_DATE_EPOCH")
PATH_VARIABLE = "PYTHONPATH"


# --- the server -------------------------------------------------------------------------------

def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass                            # the test that asked has gone: nothing to tell


def serve(path: str) -> None:
    """Import :data:`PRELOAD`, then fork a command for each request on the socket at ``path``
    until standard input (a pipe from the test process) ends."""
    import warnings
    # Python 3.12 and later warn at each fork of a process with threads (OpenBLAS's): the forks
    # start no thread of the server's and take no lock of it
    warnings.filterwarnings("ignore", ".*multi-threaded", DeprecationWarning)
    for name in PRELOAD:
        __import__(name)
    own_path = python_path(os.environ, os.getcwd())
    base_path = sys.path[1 + len(own_path):]           # the interpreter's and the site's
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "request")
    selector.register(wake_read, selectors.EVENT_READ, "child")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "end")
    own = [listener, selector, wake_read, wake_write]
    import minitfm
    sys.stdout.write(json.dumps({
        "modules": sorted({name.split(".")[0] for name in sys.modules}),
        "package": package_root(minitfm.__file__)}) + "\n")
    sys.stdout.flush()
    while True:
        for key, _ in selector.select():
            if key.data == "end":
                return
            if key.data == "child":
                try:
                    while os.read(wake_read, 4096):
                        pass
                except BlockingIOError:
                    pass
                _reap(children)
                continue
            conn, _ = listener.accept()
            try:
                data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
                while not data.endswith(b"\n"):           # a request of many parts
                    more = conn.recv(1 << 16)
                    if not more:
                        raise ValueError("the request was cut short")
                    data += more
                request = json.loads(data)
            except (OSError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                for other in children.values():
                    other.close()
                _child(request, fds, conn, own, base_path)      # never returns
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            _send(conn, {"pid": pid})
        _reap(children)


def python_path(env, cwd: str) -> list[str]:
    """The folders ``PYTHONPATH`` puts on the path, as Python does (relative to ``cwd``)."""
    text = env.get(PATH_VARIABLE, "")
    return [os.path.join(cwd, p) if p else cwd for p in text.split(os.pathsep)] if text else []


def package_root(init: str) -> str:
    """The folder that holds the package whose ``__init__.py`` is ``init``."""
    return os.path.dirname(os.path.dirname(os.path.abspath(init)))


def _reap(children: dict) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            _send(conn, {"status": status})
            conn.close()


def _child(request: dict, fds: list, conn, own: list, base_path: list) -> None:
    """In the fork: become the command, run it, and end as Python ends."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        listener, selector, *pipe = own
        selector.close()
        listener.close()
        conn.close()
        for fd in pipe:
            os.close(fd)
        if request["new_session"]:
            os.setsid()
        elif request["process_group"] is not None and request["process_group"] >= 0:
            os.setpgid(0, request["process_group"])
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None
        sys.path[:] = [request["path0"], *python_path(request["env"], request["cwd"]),
                       *base_path]
        sys.argv[:] = request["argv"]
        _standard_streams()
        import numpy
        numpy.random.seed()             # a fresh process's draw, not the server's
        status = _run(request["kind"], request["target"])
    except BaseException:              # noqa: BLE001 (the fork must never return to the server)
        try:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(1)
    os._exit(status)


def _standard_streams() -> None:
    """Standard streams on the command's 0, 1 and 2, made as Python makes them: its encoding and
    error handlers (the same environment gives the same), line-buffered where a terminal."""
    import io
    made = []
    unbuffered = sys.__stdout__.write_through          # -u or PYTHONUNBUFFERED
    for fd, old, mode in ((0, sys.__stdin__, "rb"), (1, sys.__stdout__, "wb"),
                          (2, sys.__stderr__, "wb")):
        raw = io.open(fd, mode, buffering=0, closefd=False)
        buffered = io.BufferedReader(raw) if mode == "rb" else io.BufferedWriter(raw)
        made.append(io.TextIOWrapper(
            buffered, encoding=old.encoding, errors=old.errors, newline="\n",
            line_buffering=fd != 0 and not unbuffered and (fd == 2 or raw.isatty()),
            write_through=fd != 0 and unbuffered))
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = made


def _run(kind: str, target: str) -> int:
    import atexit as exits
    import runpy
    killed_by = None
    try:
        if kind == "script":
            runpy.run_path(target, run_name="__main__")
        elif kind == "module":
            for name in (target, target + ".__main__"):     # as in a process of its own, where
                sys.modules.pop(name, None)                 # it is __main__ alone (runpy warns)
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            import types
            main = sys.modules["__main__"] = types.ModuleType("__main__")
            exec(compile(target, "<string>", "exec"), main.__dict__)
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except KeyboardInterrupt:
        _uncaught()
        killed_by, status = signal.SIGINT, 1
    except BaseException:              # noqa: BLE001
        _uncaught()
        status = 1
    try:
        threading._shutdown()          # as Python at its end: non-daemon threads joined
    except BaseException:              # noqa: BLE001
        pass
    exits._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:              # noqa: BLE001
            status = 120               # what Python returns where its streams cannot be flushed
    if killed_by is not None:
        signal.signal(killed_by, signal.SIG_DFL)
        os.kill(os.getpid(), killed_by)
    return status


def _uncaught() -> None:
    """The traceback Python prints, from the command's first frame (not this module's or
    runpy's)."""
    kind, value, tb = sys.exc_info()
    while tb is not None and (tb.tb_frame.f_code.co_filename == __file__
                              or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    sys.excepthook(kind, value.with_traceback(tb), tb)


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:                  # noqa: BLE001
        pass
    return 1


# --- the test process's side ------------------------------------------------------------------

class _Server:
    """This process's server: started on first use, ended when this process ends."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="minitfm-forks-")
        self.path = os.path.join(self.folder, "socket")
        self.env = dict(os.environ)
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), self.path], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=self.env, cwd=self.folder)
        ready = self.process.stdout.readline()
        try:
            ready = json.loads(ready)
        except ValueError:
            raise RuntimeError(f"the test commands' fork server did not start ({ready!r})")
        self.modules = set(ready["modules"]) - {"minitfm"}     # the top-level modules it imported
        self.package = ready["package"]                       # where its minitfm is
        self.own_path = python_path(self.env, self.folder)
        # where the installation points: the server's own, where its path held no minitfm
        self.installed = None if _package_from(self.own_path) else self.package
        atexit.register(self.close)

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        try:
            os.unlink(self.path)
            os.rmdir(self.folder)
        except OSError:
            pass


_server: _Server | None = None
_server_lock = threading.Lock()


def _the_server() -> _Server:
    global _server
    with _server_lock:
        if _server is None or _server.process.poll() is not None:
            _server = _Server()
        return _server


def _request(args, env, cwd) -> dict | None:
    """What the server is asked to run, or None where only a real process will do."""
    if isinstance(args, (str, bytes, os.PathLike)) or not args:
        return None
    args = [os.fsdecode(a) for a in args]
    if args[0] != sys.executable or len(args) < 2:
        return None
    env = dict(os.environ if env is None else {os.fsdecode(k): os.fsdecode(v)
                                               for k, v in env.items()})
    cwd = os.path.abspath(os.fsdecode(cwd) if cwd is not None else os.getcwd())
    first = args[1]
    if first == "-m" and len(args) > 2:
        kind, target, argv, path0 = "module", args[2], [args[2], *args[3:]], cwd
    elif first == "-c" and len(args) > 2:
        kind, target, argv, path0 = "code", args[2], ["-c", *args[3:]], ""
    elif not first.startswith("-"):
        script = os.path.join(cwd, first)
        if not os.path.isfile(script):
            return None                 # Python's own message for a missing script
        kind, target, argv, path0 = "script", script, [first, *args[2:]], \
            os.path.dirname(os.path.abspath(script))
    else:
        return None                     # options of the interpreter
    server = _the_server()
    for name in set(env) | set(server.env):
        if name != PATH_VARIABLE and env.get(name) != server.env.get(name) and \
                name.startswith(READ_AT_START):
            return None
    folders = [path0 or cwd, *python_path(env, cwd)]
    if _package_from(folders, default=server.installed) != server.package:
        return None                     # the command's minitfm is another than the server's
    if any(os.path.exists(os.path.join(folder, name)) or
           os.path.exists(os.path.join(folder, name + ".py"))
           for folder in folders[1:] if folder not in server.own_path for name in server.modules):
        return None                     # another copy of a module the server imported
    return {"kind": kind, "target": target, "argv": argv, "path0": path0, "cwd": cwd,
            "env": env}


def _package_from(folders: list[str], default: str | None = None) -> str | None:
    """Where a process whose path starts with ``folders`` finds minitfm: the first that holds
    it, else ``default`` (where the installation points, None where unknown)."""
    for folder in folders:
        if os.path.isfile(os.path.join(folder, "minitfm", "__init__.py")):
            return os.path.abspath(folder)
    return default


_EXECUTE = list(inspect.signature(subprocess.Popen._execute_child).parameters)[1:]


class Popen(subprocess.Popen):
    """:class:`subprocess.Popen`, its command forked from the server where it can be."""

    _fork = None

    def _execute_child(self, *arguments):
        given = dict(zip(_EXECUTE, arguments))
        request = None
        if (given["executable"] is None and given["preexec_fn"] is None
                and not given["pass_fds"] and not given["shell"]
                and given.get("uid") is None and given.get("gid") is None
                and given.get("gids") is None and given.get("umask", -1) == -1):
            request = _request(given["args"], given["env"], given["cwd"])
        if request is None:
            return super()._execute_child(*arguments)
        request.update(new_session=bool(given["start_new_session"]),
                       process_group=given.get("process_group", -1))
        fds = [given["p2cread"], given["c2pwrite"], given["errwrite"]]
        fds = [own if fd == -1 else fd for own, fd in zip((0, 1, 2), fds)]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(_the_server().path)
        message = json.dumps(request).encode() + b"\n"
        sent = socket.send_fds(sock, [message], fds)
        sock.sendall(message[sent:])
        self._fork, self._buffer = sock, b""
        self.pid = self._message(None)["pid"]
        self._child_created = True
        self._close_pipe_fds(*(given[name] for name in (
            "p2cread", "p2cwrite", "c2pread", "c2pwrite", "errread", "errwrite")))

    def _message(self, timeout):
        """The server's next line about this command, waiting at most ``timeout`` seconds
        (None: for ever; 0: not at all, None returned if none has come)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._fork.settimeout(left)
            try:
                chunk = self._fork.recv(4096)
            except (TimeoutError, BlockingIOError, socket.timeout):
                return None
            if not chunk:
                raise RuntimeError("the test commands' fork server ended before the command")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _ended(self, timeout):
        message = self._message(timeout)
        if message is not None:
            self.returncode = os.waitstatus_to_exitcode(message["status"])
            self._fork.close()
        return self.returncode

    def _internal_poll(self, _deadstate=None, **_):
        if self._fork is None:
            return super()._internal_poll(_deadstate=_deadstate)
        if self.returncode is None:
            try:
                self._ended(0)
            except (OSError, RuntimeError):
                if _deadstate is not None:
                    self.returncode = _deadstate
        return self.returncode

    def _wait(self, timeout):
        if self._fork is None:
            return super()._wait(timeout)
        if self.returncode is None and self._ended(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


def served(popen: subprocess.Popen) -> bool:
    """Whether ``popen``'s command was forked from the server (False: a real process)."""
    return getattr(popen, "_fork", None) is not None


def run(*popenargs, input=None, capture_output=False, timeout=None, check=False, **kwargs):
    """:func:`subprocess.run`, with :class:`Popen`."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with Popen(*popenargs, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            exc.stdout, exc.stderr = process.communicate()
            raise
        except BaseException:
            process.kill()
            raise
        status = process.poll()
        if check and status:
            raise subprocess.CalledProcessError(status, process.args, output=stdout,
                                                stderr=stderr)
    return subprocess.CompletedProcess(process.args, status, stdout, stderr)


if __name__ == "__main__":
    serve(sys.argv[1])
