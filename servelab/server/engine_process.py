"""The engine in its own process, behind the HTTP front end (what ``servelab serve`` runs).

Why: with the engine on a thread of the HTTP process, tokenising, JSON and SSE work on the
event loop take the GIL from the forward pass, and the server uses one core at most. vLLM
splits the API server from the engine core; this does the same with ``multiprocessing``
(spawn): the child loads the checkpoint, builds the ``EngineCluster`` and runs the usual
``EngineService`` (scheduler loop, detokenizer, metrics, request log); the parent keeps only
the tokenizer (``Translator``) and the HTTP app, and talks to the child over one duplex pipe.

Messages, parent -> child: ``("submit", id, prompt_ids, params, priority, slo, received_s)``,
``("abort", id, reason)``, ``("metrics", n)``, ``("shutdown", grace_s)``. Child -> parent:
``("ready", info)`` or ``("error", message)`` once at start; then ``("deltas", [(id, Delta)])``,
one message per engine step (every stream's new tokens of that step, finals included),
``("metrics", n, text)``, ``("failed", why)`` if the scheduler loop died of a bug, and
``("closed",)`` after a shutdown. ``/metrics`` is rendered by the child (its registry has every
engine-side series), so its ``process_*`` series describe the engine process.

Invariants (as in-process): every submitted request gets exactly one final event; a client
that goes away aborts its request across the pipe; if the child dies (crash, kill, OOM), the
parent's reader sees the pipe close, marks the service failed with the exit code and ends
every open stream with an error event, so no client hangs and /health answers 503. If the
parent dies, the child sees the pipe close and stops.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from servelab.core.errors import UserError
from servelab.server.service import DISCONNECT_REASON, SHUTDOWN_REASON, Delta, EngineService, RequestStream

log = logging.getLogger("servelab.server")

START_TIMEOUT_S = 900.0  # loading a checkpoint on a loaded machine can take minutes
METRICS_TIMEOUT_S = 10.0


# ---------------------------------------------------------------- child side
@dataclass(eq=False)
class _PipeStream:
    """A ``RequestStream`` stand-in in the child: deltas go to the service's outbox."""

    request_id: int
    outbox: list
    received_s: float
    num_tokens_sent: int = 0
    num_chunks_sent: int = 0
    text_sent: list[str] = field(default_factory=list)

    def push(self, delta: Delta) -> None:
        self.outbox.append((self.request_id, delta))


class _ChildService(EngineService):
    """``EngineService`` whose streams are the parent's: each step's deltas go out as one message."""

    def __init__(self, engine, model_name: str, conn, lock: threading.Lock, *, request_log=None) -> None:
        super().__init__(engine, model_name, request_log=request_log)
        self.conn, self.lock = conn, lock
        self.outbox: list = []

    def send(self, msg) -> None:
        with self.lock:
            self.conn.send(msg)

    def flush(self) -> None:
        if self.outbox:  # appended to by the engine thread only; the streams hold this list
            batch = self.outbox[:]
            self.outbox.clear()
            try:
                self.send(("deltas", batch))
            except (BrokenPipeError, OSError):  # the parent is gone: the main thread stops us
                pass

    def submit_remote(self, rid: int, prompt_ids, params, priority: int, slo, received_s: float) -> None:
        from servelab.core.request import RequestSpec

        self.params[rid] = params
        self.streams[rid] = _PipeStream(rid, self.outbox, received_s)  # type: ignore[assignment]
        spec = RequestSpec(rid, 0.0, len(prompt_ids), params.max_tokens, prompt_token_ids=tuple(prompt_ids),
                           priority=priority, slo=slo)
        self.inbox.put(("submit", spec, None))

    def on_step(self, driver, applied, outcome, now_s: float) -> None:
        super().on_step(driver, applied, outcome, now_s)
        self.flush()

    def _on_end(self, req) -> None:
        super()._on_end(req)
        self.flush()

    def _serve(self) -> None:
        try:
            super()._serve()
        finally:
            self.flush()
            if self.failed is not None:  # a bug killed the scheduler loop: the parent must stop serving
                try:
                    self.send(("failed", self.failed))
                except (BrokenPipeError, OSError):
                    pass


def _child_main(conn, config, threads: int | None) -> None:
    """The engine process: build the engine, answer ``ready``, then serve messages until told to
    stop or the parent goes away."""
    import signal

    # Ctrl-C reaches the whole process group and a supervisor's SIGTERM may too: the parent's
    # graceful shutdown decides when requests in flight end, so the child waits for its word
    # (or for the pipe to close, if the parent died)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    lock = threading.Lock()
    try:
        import torch

        if threads:
            torch.set_num_threads(threads)
        from servelab.engine.cluster import EngineCluster

        engine = EngineCluster(config.model, config.policy, config.engine, num_instances=config.num_instances,
                               router=config.router, dtype=config.dtype, backend=config.backend,
                               ray_config=config.ray_config)
        service = _ChildService(engine, config.model_name, conn, lock, request_log=config.request_log)
    except Exception as e:  # noqa: BLE001 - every start-up failure is reported to the parent as one line
        msg = f"engine options: {e}" if isinstance(e, ValueError) and not isinstance(e, UserError) else str(e)
        with lock:
            conn.send(("error", msg or type(e).__name__))
        return
    info = {"max_model_len": engine.max_model_len, "kv_config": engine.kv_config,
            "num_gpu_blocks": engine.num_gpu_blocks, "pid": mp.current_process().pid}
    service.start()
    service.send(("ready", info))
    grace = 0.0
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent died: stop at once
            break
        kind = msg[0]
        if kind == "submit":
            service.submit_remote(*msg[1:])
        elif kind == "abort":
            service.abort(msg[1], msg[2])
        elif kind == "metrics":
            service.send(("metrics", msg[1], service.metrics.render()))
        elif kind == "shutdown":
            grace = msg[1]
            break
    service.shutdown(grace)
    service.flush()
    try:
        service.send(("closed",))
    except (BrokenPipeError, OSError):
        pass


# ---------------------------------------------------------------- parent side
class _RemoteMetrics:
    def __init__(self, service: ProcessEngineService) -> None:
        self.service = service

    def render(self) -> bytes:
        return self.service.render_metrics()


class ProcessEngineService:
    """The parent's half: the same surface ``app`` uses of ``EngineService`` (``submit``,
    ``abort``, ``alive``, ``failed``, ``accepting``, ``exiting``, ``metrics.render``,
    ``shutdown``, ``idle``), with the engine in a child process started by the constructor."""

    def __init__(self, config, loaded, *, threads: int | None = None,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.model_name = config.model_name
        self.engine = SimpleNamespace(loaded=loaded)  # what /v1/models reads
        self.metrics = _RemoteMetrics(self)
        self.streams: dict[int, RequestStream] = {}
        self._ids = itertools.count()
        self.accepting = True
        self.failed: str | None = None
        self.exiting = lambda: False
        self._lock = threading.Lock()  # one sender at a time on the pipe
        self._replies: dict[int, Any] = {}
        self._reply_ready = threading.Condition()
        self._closed = threading.Event()
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_child_main, args=(child_conn, config, threads), name="servelab-engine",
                                   daemon=True)
        self.process.start()
        child_conn.close()
        self.info = self._wait_ready(start_timeout_s)
        self.max_model_len = self.info["max_model_len"]
        self.kv_config = self.info["kv_config"]
        self.thread = threading.Thread(target=self._read, name="servelab-engine-reader", daemon=True)
        self.thread.start()

    def _wait_ready(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while not self.conn.poll(0.2):
            if not self.process.is_alive():
                raise UserError(f"the engine process exited during start-up (exit code {self.process.exitcode})")
            if time.monotonic() > deadline:
                self._kill()
                raise UserError(f"the engine process did not start within {timeout_s:.0f} s")
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(5)
            raise UserError(f"the engine process exited during start-up (exit code {self.process.exitcode})") from None
        if msg[0] == "error":
            self.process.join(10)
            raise UserError(msg[1])
        return msg[1]

    # ---- lifecycle ----
    def start(self) -> None:
        """The child runs from the constructor on (the app's lifespan calls this)."""

    @property
    def alive(self) -> bool:
        return self.failed is None and self.process.is_alive() and not self._closed.is_set()

    def idle(self) -> bool:
        return not self.streams

    def shutdown(self, grace_s: float) -> None:
        """Stop accepting; the child lets requests in flight finish for ``grace_s``, ends the rest
        with "server shutting down" (their final events come back first), then exits."""
        self.accepting = False
        if self.process.is_alive() and not self._closed.is_set():
            try:
                self._send(("shutdown", grace_s))
            except (BrokenPipeError, OSError):
                pass
            self._closed.wait(grace_s + 60)
        self.process.join(10)
        if self.process.is_alive():
            self._kill()
        self.thread.join(5)

    def _kill(self) -> None:
        self.process.kill()  # the child ignores SIGTERM (see _child_main)
        self.process.join(10)

    # ---- requests (event loop side) ----
    def submit(self, prompt_ids: tuple[int, ...], params, *, priority: int = 0, slo=None) -> RequestStream:
        rid = next(self._ids)
        stream = RequestStream(rid, asyncio.get_running_loop(), time.perf_counter())
        self.streams[rid] = stream
        try:
            self._send(("submit", rid, prompt_ids, params, priority, slo, stream.received_s))
        except (BrokenPipeError, OSError):
            pass
        # the reader sets _closed before it ends the open streams: a stream registered after that
        # is ended here (whoever pops it from ``streams`` sends its one final event)
        if self._closed.is_set() and self.streams.pop(rid, None) is not None:
            stream.push(Delta("", (), error=self.failed or "engine process not reachable"))
        return stream

    def abort(self, request_id: int, reason: str | None = None) -> None:
        if reason is None:
            reason = SHUTDOWN_REASON if self.exiting() or not self.accepting else DISCONNECT_REASON
        try:
            self._send(("abort", request_id, reason))
        except (BrokenPipeError, OSError):
            pass  # the child is gone; the reader ended the stream already

    def render_metrics(self) -> bytes:
        if not self.alive:
            return b""
        n = next(self._ids)
        self._send(("metrics", n))
        deadline = time.monotonic() + METRICS_TIMEOUT_S
        with self._reply_ready:
            while n not in self._replies and self.alive and time.monotonic() < deadline:
                self._reply_ready.wait(0.1)
            return self._replies.pop(n, b"")

    def _send(self, msg) -> None:
        with self._lock:
            self.conn.send(msg)

    # ---- reader thread ----
    def _read(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                if msg[0] == "deltas":
                    self._deliver(msg[1])
                elif msg[0] == "metrics":
                    with self._reply_ready:
                        self._replies[msg[1]] = msg[2]
                        self._reply_ready.notify_all()
                elif msg[0] == "failed":
                    self.failed = msg[1]
                elif msg[0] == "closed":
                    break
        except (EOFError, OSError):
            self.process.join(2)
            code = self.process.exitcode
            self.failed = f"engine process exited (exit code {code})" if code is not None else "engine process lost"
            log.error("%s; ending %d open request(s)", self.failed, len(self.streams))
        finally:
            self._closed.set()
            with self._reply_ready:
                self._reply_ready.notify_all()
            for rid in list(self.streams):
                stream = self.streams.pop(rid, None)
                if stream is not None:
                    stream.push(Delta("", (), error=self.failed or "engine process stopped"))

    def _deliver(self, batch: list) -> None:
        """One wake-up of each event loop per step, not one per token."""
        by_loop: dict[Any, list] = {}
        for rid, delta in batch:
            stream = self.streams.get(rid)
            if stream is None:
                continue
            if delta.is_final:
                self.streams.pop(rid, None)
            by_loop.setdefault(stream.loop, []).append((stream.queue, delta))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that event loop is closed: nobody is listening any more
                pass


def _put_all(items: list) -> None:
    for q, delta in items:
        q.put_nowait(delta)
