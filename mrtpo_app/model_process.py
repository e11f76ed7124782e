"""The model in a process of its own: ``mrtpo app`` loads the sidebar's model there and runs every session's model
work there (sampling, the replay, the top-k, estimates, tuning), so that the model's imports and load — seconds of
Python holding its interpreter's lock (torch, transformers' modules) — run beside the server's start and its first
page instead of taking turns with them in one interpreter (figures: docs/benchmarks.md, App).

The server's side (:class:`ModelProcess`) sends a job: a module-level function, the model's name and device, its
arguments. The worker (:func:`serve`: ``python -m mrtpo_app.model_process FD``, FD its end of a socket pair) loads
each model once (:func:`mrtpo_app.model_load.load_model`), calls the function with the model as its first argument
and sends back its result, or its error (the same exception type, message and fields). Callbacks named in
:data:`CALLBACKS` stay in the server: the worker sends each call and the waiting thread makes it there (they draw on
the page); when one raises there (Streamlit stopping the script: a Cancel, another click), the worker is told and
the job's next callback raises :class:`Cancelled` in it, as on the model's thread of one process.

Two lanes: ``model`` jobs run one at a time on the worker's main thread (where the model was loaded, with its OpenMP
team); ``quick`` jobs (an estimate, the model's facts, tokenizing) on a thread of their own, so that a session's
estimate does not wait for another session's replay. The worker exits when the server's end of the socket closes (the
server stopped, or died); a server whose worker died starts a new one at its next job.

Neither side imports streamlit; the server's side imports no torch.
"""
from __future__ import annotations

import itertools
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

CALLBACKS = ("progress", "on_part", "on_stage")  # keyword arguments that are called back in the server
LANES = ("model", "quick")
PROGRESS_S = 0.05  # the worker sends a progress call at most this often (the page redraws at most every 0.25 s)


class Cancelled(Exception):
    """Raised in the model's work at its next callback once the session that asked for it has stopped."""


def _error_state(e: BaseException) -> tuple:
    """What rebuilds ``e`` on the other side (:func:`_rebuilt`): its class, args and fields; a class or field that
    does not pickle degrades to the message as a plain exception of the nearest picklable kind."""
    import pickle

    from mrtpo.errors import MrtpoError

    state = (type(e), e.args, dict(getattr(e, "__dict__", {})))
    try:
        pickle.loads(pickle.dumps(state))
        return state
    except Exception:  # noqa: BLE001 - a class or field that does not pickle: its message is kept
        kind = MrtpoError if isinstance(e, MrtpoError) else RuntimeError
        return kind, (f"{type(e).__name__}: {e}",), {}


def _rebuilt(state: tuple) -> BaseException:
    cls, args, fields = state
    e = cls.__new__(cls)
    e.args = args
    e.__dict__.update(fields)
    return e


# ------------------------------------------------------------------------------------------------ the worker

def serve(fd: int) -> None:
    """The worker's loop: jobs from the socket ``fd`` run on their lane until the other end closes."""
    w = _Worker(Connection(fd))
    threading.Thread(target=w.read, name="mrtpo-model-reader", daemon=True).start()
    threading.Thread(target=w.lane_loop, args=("quick",), name="mrtpo-model-quick", daemon=True).start()
    w.lane_loop("model")


class _Worker:
    """The worker's state: its connection, a queue per lane, the jobs told to stop."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.lanes = {lane: queue.Queue() for lane in LANES}
        self.stopped: set[int] = set()
        self.send_lock = threading.Lock()

    def send(self, msg) -> None:
        with self.send_lock:
            self.conn.send(msg)

    def read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the server is gone: so is its model
            if msg[0] == "stop":
                self.stopped.add(msg[1])
            else:
                self.lanes[msg[1]].put(msg)

    def lane_loop(self, lane: str) -> None:
        while True:
            self.run(self.lanes[lane].get())

    def run(self, msg) -> None:
        """One job: its model, the call with its callbacks relayed, then its result or its error sent back."""
        from mrtpo_app import model_load

        _, _, jid, fn, name, device, args, kwargs, callbacks = msg
        relay = _Callbacks(self, jid)
        try:
            lm = model_load.model(name, device)
            result = fn(lm, *args, **kwargs, **{cb: relay.caller(cb) for cb in callbacks})
            relay.flush()
            try:
                self.send(("done", jid, result))
            except Exception as e:  # noqa: BLE001 - a result that does not pickle: said as an error
                self.send(("error", jid, _error_state(RuntimeError(f"{fn.__name__}'s result could not be sent: "
                                                                   f"{e}"))))
        except BaseException as e:  # noqa: BLE001 - every error goes back to the session that asked
            if not isinstance(e, (Cancelled, _user_errors())):
                traceback.print_exc()
            self.send(("error", jid, _error_state(e)))
        finally:
            self.stopped.discard(jid)


class _Callbacks:
    """One job's callbacks in the worker: each call sent to the server (``progress`` at most every
    :data:`PROGRESS_S`, its latest call sent before anything else); a call after the server said stop raises
    :class:`Cancelled`."""

    def __init__(self, worker: _Worker, jid: int):
        self.worker, self.jid = worker, jid
        self.held: tuple | None = None
        self.last = -1.0

    def flush(self) -> None:
        if self.held is not None:
            held, self.held = self.held, None
            self.worker.send(("call", self.jid, "progress", held))

    def caller(self, cb: str):
        def call(*a):
            if self.jid in self.worker.stopped:
                raise Cancelled("the session stopped")
            if cb == "progress":
                self.held = a
                if time.monotonic() - self.last >= PROGRESS_S:
                    self.last = time.monotonic()
                    self.flush()
            else:
                self.flush()
                self.worker.send(("call", self.jid, cb, a))
        return call


def _user_errors() -> type:
    from mrtpo.errors import MrtpoError

    return MrtpoError


# ------------------------------------------------------------------------------------------------ the server's side

class ModelProcess:
    """The server's end: starts the worker on first use (and again after it died), sends jobs, relays callbacks."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._sock: socket.socket | None = None
        self._replies: dict[int, queue.Queue] = {}
        self._ids = itertools.count(1)
        self._preloaded: set[tuple[str, str]] = set()

    def preload(self, name: str, device: str) -> bool:
        """Start loading ``name`` on ``device`` in the worker (once per key; its error, if any, is the first real
        job's): whether this call started it."""
        with self._lock:
            if (name, device) in self._preloaded:
                return False
            self._preloaded.add((name, device))
        from mrtpo_app.model_load import loaded

        jid, _ = self.submit("model", loaded, name, device, (), {}, ())
        self.forget(jid, stop=False)
        return True

    def _started(self) -> Connection:
        """The connection to a running worker (started here when there is none)."""
        if self._proc is not None and self._proc.poll() is None and self._conn is not None:
            return self._conn
        if self._sock is not None:  # a worker that died: its socket goes with it
            self._sock.close()
        mine, theirs = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where mrtpo_app is importable from
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        self._proc = subprocess.Popen([sys.executable, "-m", "mrtpo_app.model_process", str(theirs.fileno())],
                                      pass_fds=(theirs.fileno(),), env=env)
        theirs.close()
        self._sock, self._conn = mine, Connection(os.dup(mine.fileno()))
        threading.Thread(target=self._read, args=(self._conn, self._proc), name="mrtpo-model-replies",
                         daemon=True).start()
        return self._conn

    def _read(self, conn: Connection, proc: subprocess.Popen) -> None:
        """Route the worker's messages to the jobs waiting for them; when it ends, every waiting job gets an error."""
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            except Exception as e:  # noqa: BLE001 - a reply that does not unpickle here ends that job only
                msg = None
                print(f"mrtpo: a reply of the model's process could not be read: {e}", file=sys.stderr)
            if msg is not None:
                with self._lock:
                    box = self._replies.get(msg[1])
                if box is not None:
                    box.put(msg)
        conn.close()
        code = proc.wait()
        from mrtpo.errors import MrtpoError

        gone = _error_state(MrtpoError(f"the model's process ended (exit code {code}) before it answered; the next "
                                       "click starts it again"))
        with self._lock:
            if self._conn is conn:
                self._conn = None
            boxes = list(self._replies.items())
        for jid, box in boxes:
            box.put(("error", jid, gone))

    def submit(self, lane: str, fn, name: str, device: str, args: tuple, kwargs: dict,
               callbacks: tuple[str, ...]) -> tuple[int, queue.Queue]:
        """Send one job; (its id, the queue its callbacks and its reply arrive on)."""
        with self._lock:
            conn, jid = self._started(), next(self._ids)
            box = self._replies[jid] = queue.Queue()
            conn.send(("job", lane, jid, fn, name, device, args, kwargs, callbacks))
        return jid, box

    def forget(self, jid: int, stop: bool) -> None:
        """The job's replies are no longer wanted; ``stop``: tell the worker to stop it at its next callback."""
        with self._lock:
            self._replies.pop(jid, None)
            if stop and self._conn is not None:
                try:
                    self._conn.send(("stop", jid))
                except OSError:
                    pass

    def call(self, fn, name: str, device: str, *args, lane: str = "model", **kwargs):
        """``fn(model, *args, **kwargs)`` in the worker, ``model`` being ``name`` on ``device`` there: its result, or
        its error raised here. Keyword arguments named in :data:`CALLBACKS` are called here, in this thread, as the
        work calls them (every call in order; ``progress``: the latest of those waiting); when one raises, the
        work is stopped at its next callback and the exception goes on from here."""
        given = {k: v for k, v in kwargs.items() if k in CALLBACKS and v is not None}
        plain = {k: v for k, v in kwargs.items() if k not in CALLBACKS}
        jid, box = self.submit(lane, fn, name, device, args, plain, tuple(given))
        done = False
        try:
            while True:
                msgs = [box.get()]
                while True:
                    try:
                        msgs.append(box.get_nowait())
                    except queue.Empty:
                        break
                latest = None
                for msg in msgs:
                    if msg[0] == "call" and msg[2] == "progress":
                        latest = msg[3]
                    elif msg[0] == "call":
                        given[msg[2]](*msg[3])
                if latest is not None:
                    given["progress"](*latest)
                end = next((m for m in msgs if m[0] in ("done", "error")), None)
                if end is not None:
                    done = True
                    if end[0] == "error":
                        raise _rebuilt(end[2])
                    return end[2]
        finally:
            self.forget(jid, stop=not done)

    def close(self) -> None:
        """Stop the worker (tests; a server's worker ends with the server)."""
        with self._lock:
            proc, sock, self._conn, self._sock = self._proc, self._sock, None, None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)  # (a close alone would not wake the thread reading it)
            sock.close()
        if proc is not None:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


PROCESS: ModelProcess | None = None  # the server's model process, once :func:`use_process` was called


def use_process() -> ModelProcess:
    """The models run in a process of their own from now on (``mrtpo app``: called before Streamlit starts)."""
    global PROCESS
    if PROCESS is None:
        PROCESS = ModelProcess()
    return PROCESS


if __name__ == "__main__":
    serve(int(sys.argv[1]))
