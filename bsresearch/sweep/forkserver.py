"""Worker processes forked from one server process that has already imported torch and the training code.

A worker started as `python -m bsresearch.sweep` spends about 3.5 s importing before its run starts: torch
(~2 s), torch._dynamo (~1.2 s, which torch.optim loads with the first optimizer) and bsresearch. A sweep
starts one worker per task, hundreds in `make reproduce`. So the supervisor starts one server per sweep
process (`serve`, in the environment a worker would get), the server imports all that once, and each worker
is a fork of it: the same process a fresh worker would be, minus the imports.

The child does what `python -m bsresearch.sweep` does (worker.main) with what Popen gave that process: its
own session, the task's folder as working directory, its log as stdout and stderr, the task's environment
(worker_env). Its parent is the server, and it asks Linux to kill it when the server dies (die_with_parent);
the server exits when its stdin closes, i.e. when the sweep's process ends or is killed, so `kill -9` of a
sweep still stops its workers.

Protocol, one JSON object per line: the supervisor writes {"id", "task", "folder", "env", "log"} on the
server's stdin; the server answers {"id", "pid"} once forked and {"pid", "exit"} when that child ends (its
exit status as subprocess gives it: the code, or minus the signal that killed it). `start` returns a
`Forked` handle with Popen's pid, wait, poll, terminate and kill, so supervise.py treats both alike.

The server forks only while the package's files on disk are the ones it imported (`_source_files`): after an
edit or a checkout it forks no more (it exits once its running workers have ended), and the next worker comes
from a new server, so a run's code is the commit its provenance names.

Used on Linux (pidfd_open, 5.3 and later) for CPU workers; a sweep that hands out GPUs starts its workers as
fresh processes (nothing initialises CUDA in the server, but a forked CUDA worker has not been tested), and
BSRESEARCH_FORK_WORKERS=0 turns it off (`available`). In `ps`, a forked worker shows the server's command.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

# What the server imports before it forks: everything a library worker imports to train a run or a group.
PRELOAD = ("torch", "torch._dynamo", "bsresearch.sweep.worker", "bsresearch.train", "bsresearch.fused.trainer")
SWITCH = "BSRESEARCH_FORK_WORKERS"  # "0": every worker is a fresh process
START_TIMEOUT = 120.0  # seconds to wait for a fork (the server's imports on its first); past it, a fresh process
SERVER = "from bsresearch.sweep.forkserver import serve; serve()"  # the server process's program


def available(gpus: Sequence[str] = ()) -> bool:
    """Whether workers are forked from the server: Linux with pidfd_open, no GPUs handed out, not switched off."""
    return (sys.platform == "linux" and hasattr(os, "pidfd_open") and not gpus
            and os.environ.get(SWITCH, "1") != "0")


class Forked:
    """A worker forked by the server: the part of subprocess.Popen's interface that supervise.py uses."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired("forked worker", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # not yet reaped, so the pid is still this worker's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Client:
    """The supervisor's side: the server process, a thread reading its answers, the live children."""

    def __init__(self, env: dict[str, str]):
        # cwd "/": its sys.path[0] must not put another bsresearch before the PYTHONPATH worker_env chose
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, cwd="/", start_new_session=True)
        self.lock = threading.Lock()     # started, children, alive, stale
        self.writing = threading.Lock()  # one request at a time on the server's stdin
        self.ids = itertools.count()
        self.started: dict[int, Future[Forked]] = {}  # requests not yet answered
        self.children: dict[int, Forked] = {}
        self.alive = True
        self.stale = False
        threading.Thread(target=self._read, name="bsresearch-forkserver", daemon=True).start()

    def start(self, task_json: str, folder: Path, env: dict[str, str], log: Path) -> Forked:
        started: Future[Forked] = Future()
        with self.lock:
            if not self.alive:
                raise OSError("the worker fork server has exited")
            request_id = next(self.ids)
            self.started[request_id] = started
        line = json.dumps({"id": request_id, "task": task_json, "folder": str(folder), "env": env,
                           "log": str(log)}) + "\n"
        with self.writing:  # not under self.lock: the reader must be free to take answers meanwhile
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        try:
            return started.result(START_TIMEOUT)
        except TimeoutError:
            with self.lock:
                self.started.pop(request_id, None)  # an answer after this kills that child (_read)
            if started.done():  # answered meanwhile after all: that answer stands
                return started.result()
            raise OSError(f"the worker fork server did not start the worker within {START_TIMEOUT:g} s") from None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                message = json.loads(raw)
            except ValueError:  # not an answer (the server prints nothing else there); skip it
                continue
            with self.lock:
                if "pid" in message and "id" not in message:  # a child has ended
                    if (child := self.children.pop(message["pid"], None)) is not None:
                        child._end(message["exit"])
                    continue
                started = self.started.pop(message["id"], None)
                if started is None:  # its start gave up waiting (START_TIMEOUT) and started a fresh process
                    if "pid" in message:  # so this one must not run
                        os.kill(message["pid"], signal.SIGKILL)
                elif message.get("stale"):  # the server exits once its children have; a new one loads the code
                    self.stale = True
                    started.set_exception(Stale("the library's source changed since the worker fork server started"))
                elif "error" in message:
                    started.set_exception(OSError(f"the worker fork server could not fork: {message['error']}"))
                else:
                    child = Forked(message["pid"])  # the server answers a fork before that child's exit
                    self.children[child.pid] = child
                    started.set_result(child)
        with self.lock:  # the server is gone; Linux killed its children (die_with_parent)
            self.alive = False
            for child in self.children.values():
                child._end(-signal.SIGKILL)
            self.children.clear()
            for started in self.started.values():
                started.set_exception(OSError("the worker fork server exited before it started the worker"))
            self.started.clear()
        self.proc.wait()


_client: _Client | None = None
_client_lock = threading.Lock()


class Stale(OSError):
    """The server's code is not the code on disk any more (the package's files changed since it started)."""


def start(task_json: str, folder: Path, env: dict[str, str], log: Path) -> Forked:
    """Fork a worker for one task from this process's server (started on first use, and again when it exited
    or the package's source changed since it started). OSError: no worker was started."""
    global _client
    for _ in range(2):
        with _client_lock:
            if _client is None or not _client.alive or _client.stale:  # a stale one still watches its children
                _client = _Client(env)
            client = _client
        try:
            return client.start(task_json, folder, env, log)
        except Stale:
            continue
    raise OSError("the worker fork server kept finding the package's source changed")


# ---- the server (python -c SERVER) --------------------------------------------------------------------------

def serve() -> None:
    """Import PRELOAD, then fork one child per request line on stdin until stdin closes; answers on stdout."""
    import importlib
    requests, answers = 0, os.dup(1)
    os.dup2(2, 1)  # whatever an import prints goes to stderr, never into the answers
    for name in PRELOAD:
        importlib.import_module(name)
    loaded = _source_files()  # the code this server runs; a child of it must not run other code
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the sweep, which stops the workers itself
    server = os.getpid()
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ, None)
    pending = b""

    def answer(message: dict[str, Any]) -> None:
        os.write(answers, (json.dumps(message) + "\n").encode())

    stale = False  # once the source changed: no more forks; exit when the last child has ended
    children = 0
    while not (stale and children == 0):
        for key, _ in selector.select():
            if key.data is None:
                chunk = os.read(requests, 1 << 16)
                if not chunk:  # the sweep's process has ended; the children die with this process
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    request = json.loads(line)
                    stale = stale or _source_files() != loaded  # edited or checked out since: a new server loads it
                    if stale:
                        answer({"id": request["id"], "stale": True})
                        continue
                    try:
                        pid = os.fork()
                    except OSError as exc:  # out of memory or processes: this worker starts as a fresh process
                        answer({"id": request["id"], "error": str(exc)})
                        continue
                    if pid == 0:
                        _child(request, server)  # never returns
                    try:
                        selector.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
                    except OSError as exc:  # no descriptor left to watch it by: it must not run unwatched
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                        answer({"id": request["id"], "error": str(exc)})
                        continue
                    children += 1
                    answer({"id": request["id"], "pid": pid})
            else:
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(key.data, 0)
                children -= 1
                answer({"pid": key.data, "exit": os.waitstatus_to_exitcode(status)})


def _child(request: dict[str, Any], server: int) -> None:
    """In the forked child: become what Popen made a worker process, run worker.main, exit."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, _max_fd())  # the server's pipes and pidfds
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.chdir(request["folder"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ["BSRESEARCH_SUPERVISOR_PID"] = str(server)  # the parent die_with_parent checks
        _reseed()
        from .worker import main
        code = main(request["task"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - printed into the run's log, as an uncaught error in a worker would be
        import traceback
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _source_files() -> dict[str, tuple[int, int]]:
    """(modification time, size) of every Python file of the bsresearch package: a fresh worker would import
    whatever is on disk now (its provenance names the commit checked out now), so the server forks only while
    that is still the code it imported."""
    package = Path(__file__).resolve().parents[1]
    files = {}
    for path in package.rglob("*.py"):
        try:
            stat = path.stat()
            files[str(path)] = (stat.st_mtime_ns, stat.st_size)
        except OSError:  # removed while listed (a checkout in progress): counted as a change
            files[str(path)] = (-1, -1)
    return files


def _reseed() -> None:
    """Fresh entropy for the generators a fresh process seeds from the OS (random, numpy's global one): forked
    children would otherwise share the server's state, and, e.g., draw the same back-off (kernels.py).
    torch's default generator is the same fixed seed in every fresh process, and so it stays."""
    import random
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _max_fd() -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(os.sysconf("SC_OPEN_MAX"))
    return 1024

