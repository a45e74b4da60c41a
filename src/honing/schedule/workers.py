"""A rollout worker: generation + grading in a separate process with its own copy of the policy.

For asynchronous RL the trainer keeps updating the policy in the main process while rollouts for
later steps run in a child process. Each request names the policy version it must be generated
with; a request may carry that version's weights, which the child loads before running it.

    with ProcessWorker("my.module:make_side", cfg_dict) as w:
        w.submit(0, tasks0, seed=1, version=0, weights=model.state_dict())
        w.submit(1, tasks1, seed=2, version=0, weights=None)      # still version 0
        result, info = w.collect(0)

`InProcessWorker` has the same interface and runs each request synchronously at `submit`
(staleness 0, debugging, and the reference the process worker must match).

Transport. Requests and results travel over two one-way pipes. The parent pickles each request
eagerly in `submit` (a payload mutated afterwards is not seen; an unpicklable payload fails in
`submit`), and a parent-side thread writes the bytes, so `submit` never blocks on a busy child.
Weights never go through the pipe as bytes: `submit` copies the state dict into one flat
shared-memory buffer per dtype (reused once the child reports it has loaded it) and sends only the
file descriptors, names, offsets and shapes; the child gets zero-copy views of that buffer. The
views are valid only during `RolloutSide.load_weights` (which must copy them, as
`load_state_dict` does): the parent overwrites the buffer with a later version after that call.
Results come back plainly pickled (self-contained bytes) and are read by a parent-side thread, so
a child never blocks on a parent that is busy training.

Failure. An exception in the child's `run` (or `load_weights`) comes back and `collect` raises it
as `HoningError` with the child's traceback text. If the child dies, `collect` raises
`HoningError` with its exit code instead of waiting. The child exits when the parent dies (EOF on
its request pipe when idle; a watchdog thread that checks the parent pid when busy), and it
ignores SIGINT so that Ctrl-C is handled by the parent, which shuts the child down.

The child is started with multiprocessing's "spawn" context, which re-imports the parent's
`__main__` module in the child: scripts that start a worker need an `if __name__ == "__main__":`
guard.
"""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Any, Protocol

import torch
import torch.multiprocessing as tmp

from honing.errors import HoningError
from honing.schedule.shm import pack_state, unpack_state

__all__ = ["InProcessWorker", "ProcessWorker", "RolloutSide", "WorkerTimeout", "pack_state", "unpack_state"]

_PARENT_POLL_S = 0.5   # child: how often the watchdog checks that the parent is alive
_WAIT_POLL_S = 0.2     # parent: how often a blocked collect re-checks the child's liveness
_CLOSE_GRACE_S = 5.0   # close: how long a child may take to exit before it is killed


class RolloutSide(Protocol):
    """What runs inside the worker. Built in the child by `factory(factory_arg)`."""

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Copy `state` into the policy (the tensors are only valid during this call)."""
        ...

    def run(self, payload: Any, seed: int) -> Any:
        """Roll out + grade one batch; return a picklable result."""
        ...


class WorkerTimeout(HoningError, TimeoutError):
    """`collect` ran past its timeout; the batch stays pending and can be collected later."""


# ----------------------------------------------------------------------------------------------
# In-process worker


def _version_error(batch_id: int, version: int, held: int | None) -> str:
    held_s = "no weights yet" if held is None else f"policy version {held}"
    return (f"batch {batch_id} asks for policy version {version} without sending weights, "
            f"but the rollout worker holds {held_s}; pass weights= when the version changes")


class InProcessWorker:
    """The worker interface without a process: each request runs synchronously in `submit`, with
    the caller's payload and weights objects as they are (nothing is pickled or copied)."""

    def __init__(self, side: RolloutSide, initial_version: int | None = None) -> None:
        self.side = side
        self.version = initial_version
        self._done: dict[int, tuple[bool, Any, dict[str, float]]] = {}
        self._order: list[int] = []
        self._closed = False

    def submit(self, batch_id: int, payload: Any, seed: int, version: int,
               weights: dict[str, torch.Tensor] | None) -> None:
        if self._closed:
            raise HoningError("the rollout worker is closed")
        if batch_id in self._done:
            raise HoningError(f"batch {batch_id} was already submitted and not yet collected")
        t0 = time.perf_counter()
        load_s = 0.0
        ok, result = True, None
        try:
            if weights is not None:
                self.version = None
                self.side.load_weights(weights, version)
                self.version = version
                load_s = time.perf_counter() - t0
            elif self.version != version:
                raise HoningError(_version_error(batch_id, version, self.version))
            result = self.side.run(payload, seed)
        except Exception:  # noqa: BLE001 - reported by collect
            ok, result = False, traceback.format_exc()
        info = {"version": version, "worker/busy_s": time.perf_counter() - t0, "worker/idle_s": 0.0,
                "worker/load_weights_s": load_s, "worker/push_s": 0.0}
        self._done[batch_id] = (ok, result, info)
        self._order.append(batch_id)

    def collect(self, batch_id: int, timeout_s: float | None = None) -> tuple[Any, dict[str, float]]:
        if batch_id not in self._done:
            raise HoningError(f"batch {batch_id} was not submitted or was already collected")
        ok, result, info = self._done.pop(batch_id)
        self._order.remove(batch_id)
        info = dict(info, transfer_s=0.0)
        if not ok:
            raise HoningError(f"rollout worker failed on batch {batch_id}:\n{result}")
        return result, info

    def pending(self) -> list[int]:
        return list(self._order)

    def close(self) -> None:
        self._closed = True
        self._done.clear()
        self._order.clear()

    def __enter__(self) -> InProcessWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------------------------
# Child side


def _load_factory(factory: str) -> Any:
    mod_name, sep, fn_name = factory.partition(":")
    if not sep or not mod_name or not fn_name:
        raise HoningError(f"rollout worker factory {factory!r} is not of the form 'module:function'")
    mod = importlib.import_module(mod_name)
    fn = mod
    for part in fn_name.split("."):
        fn = getattr(fn, part)
    return fn


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(3)


def _child_main(factory: str, factory_arg: Any, threads: int, initial_version: int | None,
                req_conn: Any, res_conn: Any, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent shuts us down
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="parent-watch").start()
    torch.set_num_threads(threads)

    def send(msg: tuple) -> None:
        res_conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    try:
        side = _load_factory(factory)(factory_arg)
    except BaseException:  # noqa: BLE001 - reported by the parent's constructor
        send(("start_error", traceback.format_exc()))
        return
    send(("ready", os.getpid()))
    version = initial_version
    while True:
        t_wait = time.perf_counter()
        try:
            raw = req_conn.recv_bytes()
        except (EOFError, OSError):  # the parent is gone
            break
        t0 = time.perf_counter()
        idle = t0 - t_wait
        msg = pickle.loads(raw)
        if msg[0] == "stop":
            break
        _, batch_id, seed, want, buf_id, packed_bytes, payload_bytes = msg
        del raw, msg
        load_s, run_s = 0.0, 0.0
        try:
            if packed_bytes is not None:
                version = None
                try:  # the weights: file descriptors of the parent's shared buffers
                    side.load_weights(unpack_state(ForkingPickler.loads(packed_bytes)), want)
                finally:
                    del packed_bytes
                    try:
                        send(("loaded", buf_id))
                    except OSError:
                        pass
                version = want
                load_s = time.perf_counter() - t0
            elif version != want:
                raise HoningError(_version_error(batch_id, want, version))
            t_run = time.perf_counter()
            result = side.run(pickle.loads(payload_bytes), seed)
            run_s = time.perf_counter() - t_run
            out = ("result", batch_id, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception:  # noqa: BLE001 - reported by the parent's collect
            out = ("error", batch_id, traceback.format_exc())
        info = {"version": want, "worker/busy_s": time.perf_counter() - t0, "worker/idle_s": idle,
                "worker/load_weights_s": load_s, "worker/run_s": run_s}
        try:
            send(out + (info,))
        except OSError:  # the parent is gone
            break
    close = getattr(side, "close", None)
    if callable(close):
        close()
    # A clean exit, minus the interpreter's module teardown (seconds with transformers loaded):
    # run the atexit hooks (temp-dir finalizers, ...), flush, and leave.
    for c in (req_conn, res_conn):
        c.close()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(0)


# ----------------------------------------------------------------------------------------------
# Parent side


@dataclass
class _Inbox:
    """What the reader thread has received; guarded by `cond`."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    ready_pid: int | None = None
    start_error: str | None = None
    done: dict[int, tuple[str, Any, dict[str, float]]] = field(default_factory=dict)
    released: set[int] = field(default_factory=set)
    eof: bool = False


def _reader(conn: Any, inbox: _Inbox) -> None:
    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except Exception:  # noqa: BLE001 - EOF: the child is gone (or its pipe is unusable)
            with inbox.cond:
                inbox.eof = True
                inbox.cond.notify_all()
            return
        with inbox.cond:
            kind = msg[0]
            if kind == "ready":
                inbox.ready_pid = msg[1]
            elif kind == "start_error":
                inbox.start_error = msg[1]
            elif kind == "loaded":
                inbox.released.add(msg[1])
            else:  # result / error
                inbox.done[msg[1]] = (kind, msg[2], msg[3])
            inbox.cond.notify_all()


def _sender(conn: Any, outbox: queue.Queue) -> None:
    while True:
        data = outbox.get()
        if data is None:
            return
        try:
            conn.send_bytes(data)
        except OSError:  # the child is gone; collect reports it
            return


def _shutdown(proc: Any, outbox: queue.Queue, sender: threading.Thread, conns: list[Any],
              grace_s: float) -> None:
    if proc.is_alive():
        outbox.put(pickle.dumps(("stop",)))
    outbox.put(None)
    proc.join(grace_s)
    if proc.is_alive():
        proc.terminate()
        proc.join(2.0)
    if proc.is_alive():
        proc.kill()
        proc.join(2.0)
    sender.join(1.0)
    for c in conns:
        try:
            c.close()
        except OSError:
            pass


def _exit_text(code: int | None) -> str:
    if code is None:
        return "an unknown exit code (it closed its pipe but is still running)"
    if code < 0:
        try:
            return f"exit code {code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"exit code {code}"
    return f"exit code {code}"


@dataclass
class _Buf:
    buf_id: int
    flats: dict[str, torch.Tensor]
    busy: bool


class ProcessWorker:
    """Runs a `RolloutSide` built by `factory(factory_arg)` in a spawned child process.

    `factory` is "module:function"; the child imports it, so it must be importable there (the
    child gets the parent's sys.path). The constructor waits until the side is built and raises
    `HoningError` with the child's traceback if building it fails. The child runs torch with
    `threads` intra-op threads; results match `InProcessWorker` bit for bit when that equals the
    parent's `torch.get_num_threads()` (CPU float reductions depend on the thread count).
    `initial_version`: the policy version the freshly built side already holds, if any (else the
    first request must carry weights)."""

    def __init__(self, factory: str, factory_arg: Any = None, threads: int = 1, start_timeout_s: float = 300,
                 initial_version: int | None = None) -> None:
        mod_name, sep, fn_name = factory.partition(":")
        if not sep or not mod_name or not fn_name:
            raise HoningError(f"rollout worker factory {factory!r} is not of the form 'module:function'")
        self.factory = factory
        self._order: list[int] = []
        self._push_s: dict[int, float] = {}
        self._bufs: list[_Buf] = []
        self._next_buf = 0
        self._inbox = _Inbox()
        self._dead_msg: str | None = None
        ctx = tmp.get_context("spawn")
        req_r, req_w = ctx.Pipe(duplex=False)
        res_r, res_w = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child_main, name="honing-rollout-worker", daemon=False,
                                 args=(factory, factory_arg, threads, initial_version, req_r, res_w, os.getpid()))
        try:
            self._proc.start()
        except Exception as e:
            req_w.close()
            res_r.close()
            raise HoningError(f"cannot start the rollout worker (factory {factory!r}; factory_arg must be "
                              f"picklable): {type(e).__name__}: {e}") from e
        finally:
            req_r.close()  # only the child holds these ends, so its death is EOF for us and vice versa
            res_w.close()
        self._outbox: queue.Queue = queue.Queue()
        self._sender = threading.Thread(target=_sender, args=(req_w, self._outbox), daemon=True,
                                        name="rollout-worker-send")
        self._sender.start()
        threading.Thread(target=_reader, args=(res_r, self._inbox), daemon=True, name="rollout-worker-recv").start()
        self._finalizer = weakref.finalize(self, _shutdown, self._proc, self._outbox, self._sender,
                                           [req_w, res_r], _CLOSE_GRACE_S)
        # multiprocessing's own exit hook joins non-daemonic children, which would wait forever for
        # an idle worker; this hook (registered later, so run earlier) stops it first.
        atexit.register(self._finalizer)
        self._wait_ready(start_timeout_s)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        inbox = self._inbox
        with inbox.cond:
            while inbox.ready_pid is None and inbox.start_error is None:
                if inbox.eof or not self._proc.is_alive():
                    break
                if time.monotonic() > deadline:
                    break
                inbox.cond.wait(_WAIT_POLL_S)
            ready, err = inbox.ready_pid, inbox.start_error
        if ready is not None:
            return
        if err is not None:
            self.close()
            raise HoningError(f"rollout worker factory {self.factory!r} failed in the worker process:\n{err}")
        if self._proc.is_alive() and not inbox.eof:
            self.close()
            raise HoningError(f"rollout worker (factory {self.factory!r}) did not start within {timeout_s:g} s")
        self._proc.join(2.0)
        code = self._proc.exitcode
        self.close()
        raise HoningError(f"rollout worker (factory {self.factory!r}) died while starting with {_exit_text(code)}")

    def _dead(self) -> str | None:
        """A message if the child is gone (its pipe closed or the process ended), else None."""
        if self._dead_msg is None and (self._inbox.eof or not self._proc.is_alive()):
            self._proc.join(2.0)
            self._dead_msg = f"the rollout worker (pid {self._proc.pid}) died with {_exit_text(self._proc.exitcode)}"
        return self._dead_msg

    def _buffer(self) -> _Buf:
        with self._inbox.cond:
            released, self._inbox.released = self._inbox.released, set()
        for b in self._bufs:
            if b.buf_id in released:
                b.busy = False
        free = [b for b in self._bufs if not b.busy]
        if free:
            return free[0]
        b = _Buf(self._next_buf, {}, False)
        self._next_buf += 1
        self._bufs.append(b)
        return b

    def submit(self, batch_id: int, payload: Any, seed: int, version: int,
               weights: dict[str, torch.Tensor] | None) -> None:
        if not self._finalizer.alive:
            raise HoningError("the rollout worker is closed")
        if batch_id in self._push_s:
            raise HoningError(f"batch {batch_id} was already submitted and not yet collected")
        dead = self._dead()
        if dead:
            raise HoningError(f"cannot submit batch {batch_id}: {dead}")
        t0 = time.perf_counter()
        try:
            payload_bytes = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise HoningError(f"the payload of batch {batch_id} cannot be sent to the rollout worker: "
                              f"{type(e).__name__}: {e}") from e
        packed_bytes, buf_id = None, None
        if weights is not None:
            buf = self._buffer()
            packed = pack_state(weights, buf.buf_id, buf.flats or None)
            buf.flats, buf.busy, buf_id = packed.flats, True, buf.buf_id
            packed_bytes = ForkingPickler.dumps(packed).tobytes()
            for other in self._bufs:  # keep at most one spare buffer around
                if other is not buf and not other.busy and len(self._bufs) > 2:
                    self._bufs.remove(other)
                    break
        data = pickle.dumps(("run", batch_id, seed, version, buf_id, packed_bytes, payload_bytes),
                            protocol=pickle.HIGHEST_PROTOCOL)
        self._push_s[batch_id] = time.perf_counter() - t0
        self._order.append(batch_id)
        self._outbox.put(data)

    def collect(self, batch_id: int, timeout_s: float | None = None) -> tuple[Any, dict[str, float]]:
        if batch_id not in self._push_s:
            raise HoningError(f"batch {batch_id} was not submitted or was already collected")
        t0 = time.perf_counter()
        deadline = None if timeout_s is None else t0 + timeout_s
        inbox = self._inbox
        with inbox.cond:
            while batch_id not in inbox.done:
                if inbox.eof or not self._proc.is_alive():
                    break
                if deadline is not None and time.perf_counter() >= deadline:
                    break
                inbox.cond.wait(_WAIT_POLL_S if deadline is None
                                else max(0.0, min(_WAIT_POLL_S, deadline - time.perf_counter())))
            got = inbox.done.pop(batch_id, None)
        if got is None:
            dead = self._dead()
            if dead:
                raise HoningError(f"{dead} before returning batch {batch_id}")
            raise WorkerTimeout(f"batch {batch_id} from the rollout worker was not ready within {timeout_s:g} s")
        kind, body, info = got
        self._order.remove(batch_id)
        push_s = self._push_s.pop(batch_id)
        if kind == "error":
            raise HoningError(f"rollout worker failed on batch {batch_id}:\n{body}")
        result = pickle.loads(body)
        info = dict(info, **{"worker/push_s": push_s, "transfer_s": time.perf_counter() - t0})
        return result, info

    def pending(self) -> list[int]:
        return list(self._order)

    def close(self) -> None:
        self._finalizer()
        atexit.unregister(self._finalizer)
        self._bufs.clear()

    def __enter__(self) -> ProcessWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
