"""A prewarmed start for a local swarm's processes: a fork server that imported torch and hivemind
once, from which the launcher forks each coordinator and peer instead of exec'ing a fresh Python.

WHY: a fresh `python -m peer.cli.main` spends ~4 CPU-seconds importing torch (2.4 s) and hivemind
(0.6 s, scipy through hivemind.averaging) on this project's 2-core machines before it does
anything, and a peer's first optimizer step ~1.5 more importing torch._dynamo (with sympy): a
3-peer, 3-round test swarm spent ~16 of its ~17 CPU-seconds there. A forked child starts with
those modules in memory and imports only this project's modules. The memory is shared too: a
fresh `import torch` holds ~143 MB of its own (relocated library data) and torch._dynamo ~70 MB;
forked, a running demo peer holds ~104 MB of its own instead of ~230 MB (its DHT process 21 MB
instead of 67), which is what lets 48 demo peers fit in 24 GB (benchmarks/scale.md, the storm rows).
The server freezes its preloads out of the collector so that a child's collections never write
their pages (which would copy them).

Each child is still a process of its own, as Popen(start_new_session=True) makes one: it starts a
session (its own process group: a signal to it reaches it and its DHT process, nothing else),
arms the parent-death signal (it dies with the server, which dies with the launcher: the chain of
protocol/lifetime.py holds), reads /dev/null and writes the launcher's pipe on stdout and stderr,
takes the requested environment and working directory, and runs its module as `python -m` does
(runpy, as __main__), then the exit handlers, then ends with the module's exit status.

What differs from an exec'd process, and why it does not matter where this is used:
- Only third-party modules are preloaded (PRELOAD); this project's own are imported fresh in every
  child, so none of our import-time code runs in the server. gRPC is not preloaded: it is not
  fork-safe, and the CLI sets gRPC's log level in the environment before importing it.
- Every child has the server's hash seed (PYTHONHASHSEED cannot change after start) and its
  /proc/PID/cmdline (`ps` shows `python -m peer.cli.prewarmed N` for each). Tests that check that
  separate processes agree bit for bit whatever their hash seeds, or that read command lines, start
  exec'd processes (Swarm(prewarmed=False), the launcher's default; `swarmloco demo
  --exec-processes` does the same, where a demo should show different hash seeds agreeing or
  readable command lines: the demo's peers forked share one seed, a fresh one each demo).
- `random` reseeds itself in a forked child; numpy's global generator (seeded from the OS once,
  at import) is reseeded here; torch's default generator starts from its fixed default seed in
  both cases (nothing draws from it while importing).

The server is single-threaded (forking a process with running threads is unsafe): one selector
over its request socket and a SIGCHLD wake-up pipe. A spawn request carries the child's command
and two descriptors (SCM_RIGHTS): the child's output pipe and a socket of the child's own, on
which the server answers with the child's pid and, once it reaped it, its exit status. The server
ends when the launcher closes its end (or dies), and its children die with it.

Linux only (fork, SCM_RIGHTS, PR_SET_PDEATHSIG): elsewhere `available()` is False and the
launcher uses subprocess.Popen.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import traceback

from protocol import lifetime

# torch._dynamo: what a process's first torch.optim step imports (~820 modules, sympy among them:
# ~1.5 CPU-seconds and ~70 MB of its own in every peer that trains, when not preloaded here).
PRELOAD = ("torch", "torch._dynamo", "hivemind", "numpy", "cryptography.hazmat.primitives.asymmetric.ed25519")
START_TIMEOUT_S = 180.0  # the server's imports: ~4 s quiet, much more on a loaded 2-core machine
REQUEST_MAX_BYTES = 1 << 20  # a request: the command, the environment and the working directory


def available() -> bool:
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds")


class PrewarmedProcess:
    """The launcher's handle on a forked child, with the part of subprocess.Popen the launcher and
    its callers use: pid, returncode, stdout, poll(), wait(timeout), send_signal(), kill(),
    terminate(). The exit status comes from the server, which is the child's parent."""

    def __init__(self, args: list[str], pid: int, status: socket.socket, stdout) -> None:
        self.args = args
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._status = status
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self._read_status(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read_status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def _read_status(self, timeout: float | None) -> int | None:
        """The exit status once the server sent it; waits up to `timeout` (None: for ever) without
        holding the lock, so that another thread's poll() never waits behind this wait()."""
        if self.returncode is None:
            select.select([self._status], [], [], timeout)
        with self._lock:
            if self.returncode is None:
                try:
                    message = self._status.recv(64)
                except (BlockingIOError, InterruptedError):
                    return None
                except OSError:
                    message = b""
                # b"": the server died before reaping it, and the child died with it (parent-death signal)
                self.returncode = int(message.split()[1]) if message.startswith(b"exit ") else -signal.SIGKILL
            return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never signal a pid that may have been reused
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class PrewarmedServer:
    """The launcher's side: starts the server process and asks it for children."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._socket = ours
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno())], pass_fds=[theirs.fileno()], env=env,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=lifetime.preexec_for_child())
        theirs.close()
        ours.settimeout(START_TIMEOUT_S)
        try:
            ready = ours.recv(64)
        except OSError:
            ready = b""
        ours.settimeout(None)
        if ready != b"ready":
            self.close()
            raise RuntimeError(f"the prewarmed server did not start (it said {ready!r}; exit {self.process.poll()})")

    def spawn(self, module: str, args: list[str], env: dict[str, str]) -> PrewarmedProcess:
        """Fork `python -m module *args` with `env` in the launcher's working directory; its
        stdout and stderr are one pipe, read as text from the returned handle's stdout."""
        read_end, write_end = os.pipe()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = json.dumps({"module": module, "args": args, "env": env, "cwd": os.getcwd()}).encode()
        try:
            with self._lock:
                socket.send_fds(self._socket, [request], [theirs.fileno(), write_end])
            ours.settimeout(START_TIMEOUT_S)
            answer = ours.recv(64)
            if not answer.startswith(b"pid "):
                raise RuntimeError(f"the prewarmed server did not start {module} (it said {answer!r})")
        except BaseException:
            os.close(read_end)
            ours.close()
            raise
        finally:
            os.close(write_end)
            theirs.close()
        ours.setblocking(False)  # PrewarmedProcess waits with select, then reads what is there
        stdout = open(read_end, "r")  # text, universal newlines: what Popen(text=True) gives
        return PrewarmedProcess([sys.executable, "-m", module, *args], int(answer.split()[1]), ours, stdout)

    def close(self) -> None:
        """The server ends when its request socket closes; its children die with it."""
        self._socket.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_server: PrewarmedServer | None = None
_server_lock = threading.Lock()


def shared_server(env: dict[str, str]) -> PrewarmedServer | None:
    """The process's one server, started at the first call (from the main thread: the server's
    parent-death signal is tied to the thread that starts it); None where it cannot run here."""
    global _server
    with _server_lock:
        if _server is None or _server.process.poll() is not None:
            if not available() or threading.current_thread() is not threading.main_thread():
                return None
            _server = PrewarmedServer(env)
            atexit.register(_server.close)
        return _server


def server_pids() -> set[int]:
    """The pid of this process's server, if one runs (the tests' end-of-session check leaves it
    out: it ends with the process)."""
    return {_server.process.pid} if _server is not None and _server.process.poll() is None else set()


# ----------------------------------------------------------------------------------------------
# The server process.


def _serve(requests: socket.socket) -> None:
    # The preloaded objects stay shared with every child only while nothing writes to their pages:
    # no collection here while they are made (it would leave freed holes among them), and frozen
    # once made, so that a child's collections (re-enabled in it) never write their gc headers.
    gc.disable()
    for name in PRELOAD:
        __import__(name)
    gc.freeze()
    gc.enable()  # the server's own garbage from here on is collected; the frozen preloads are never walked
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wake-up fd is written
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops the server, not a terminal
    signal.set_wakeup_fd(wake_write)
    status_of: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    tie_to_server = lifetime.preexec_for_child()  # made here (the server's main thread), run in each child
    requests.send(b"ready")
    while True:
        for key, _ in selector.select():
            if key.fileobj is requests:
                try:
                    message, fds, _, _ = socket.recv_fds(requests, REQUEST_MAX_BYTES, 2)
                except OSError:
                    message, fds = b"", []
                if not message:
                    return  # the launcher is gone: so are we, and our children after us
                status = socket.socket(fileno=fds[0])
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:  # the child keeps none of the server's descriptors but its output pipe

                    def close_server() -> None:
                        selector.close()
                        for owned in (requests, status, *status_of.values()):
                            owned.close()
                        os.close(wake_read)
                        os.close(wake_write)

                    _become_child(json.loads(message), fds[1], tie_to_server, close_server)
                os.close(fds[1])
                try:
                    status.send(b"pid %d" % pid)
                except OSError:
                    pass
                status_of[pid] = status
            else:
                os.read(wake_read, 4096)
                _reap(status_of)


def _reap(status_of: dict[int, socket.socket]) -> None:
    while status_of:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status = status_of.pop(pid, None)
        if status is not None:
            try:
                status.send(b"exit %d" % os.waitstatus_to_exitcode(wait_status))
            except OSError:
                pass  # nobody waits for it any more
            status.close()


def _become_child(request: dict, output_fd: int, tie_to_server, close_server) -> None:
    """In the forked child: become the process Popen(start_new_session=True) would have started,
    run the module, and end. Never returns."""
    code = 1
    try:
        gc.enable()  # as a fresh Python runs (the server's preloads stay frozen: see _serve)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a fresh Python's handlers
        os.setsid()
        if tie_to_server is not None:  # SIGKILL when the server dies; exit now if it already has
            tie_to_server()
        close_server()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.close(null)
        os.close(output_fd)
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = request["cwd"]  # what `python -m` puts first, then PYTHONPATH
        sys.path[1:1] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.argv = [request["module"], *request["args"]]
        code = _run_module(request["module"])
    except BaseException:
        traceback.print_exc()
    try:
        atexit._run_exitfuncs()  # what interpreter shutdown would run (the CLI's handlers end in os._exit)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _run_module(module: str) -> int:
    import runpy

    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:  # any other exception: the caller prints it and exits 1
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
    os._exit(0)
