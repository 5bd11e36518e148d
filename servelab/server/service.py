"""The engine service: the cluster driver's scheduler loop in a thread beside the event loop.

The event loop never touches engine state. It submits a request (``submit``) and receives
its output through a ``RequestStream``: the engine thread pushes ``Delta`` events with
``loop.call_soon_threadsafe`` from two hooks, the instance drivers' step listener (new tokens
and text of requests still running) and the metrics collector's ``on_request_end``, the one
sink every ended request passes through (finished, rejected at admission, aborted anywhere),
which sends the final delta with the request. A client that goes away aborts its request
through the inbox, and the driver frees its KV wherever it is.

Invariants: every submitted request gets exactly one final event; the text of all deltas of
a request concatenates to its output text (the detokenizer's invariant); request ids are
unique per service (a counter).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from servelab.core.request import Request, RequestSpec
from servelab.engine.sampling import SamplingParams
from servelab.metrics.collector import MetricsCollector
from servelab.server.metrics import ServerMetrics

log = logging.getLogger("servelab.server")

SHUTDOWN_REASON = "server shutting down"
DISCONNECT_REASON = "client disconnected"


@dataclass(frozen=True, slots=True)
class Delta:
    text: str
    token_ids: tuple[int, ...]
    request: Request | None = None  # set on the final event: the ended request (no longer mutated)
    final_text: str = ""  # the whole output text (final event only)
    error: str | None = None  # the engine thread failed: no more events will come

    @property
    def is_final(self) -> bool:
        return self.request is not None or self.error is not None


@dataclass(eq=False)
class RequestStream:
    """One request's events, read on the event loop; the counters are the engine thread's."""

    request_id: int
    loop: asyncio.AbstractEventLoop
    received_s: float  # perf_counter when HTTP handed it over
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    num_tokens_sent: int = 0
    num_chunks_sent: int = 0
    text_sent: list[str] = field(default_factory=list)

    def push(self, delta: Delta) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, delta)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


class _Collector(MetricsCollector):
    """The run's metrics collector that also tells the service when a request ends."""

    def __init__(self, service: EngineService) -> None:
        super().__init__()
        self.service = service

    def on_request_end(self, request: Request) -> None:
        super().on_request_end(request)
        self.service._on_end(request)

    def on_preemption(self, instance_id: int, now_s: float, kind: str) -> None:
        super().on_preemption(instance_id, now_s, kind)
        self.service.metrics.preemptions.inc()

    def on_step(self, *args, **kwargs) -> None:
        super().on_step(*args, **kwargs)
        self.service.metrics.observe_step(int(args[3] if len(args) > 3 else kwargs["num_tokens"]))


class EngineService:
    """An ``EngineCluster`` serving submitted requests in its own thread."""

    def __init__(self, engine, model_name: str, *, request_log: Path | None = None) -> None:
        self.engine = engine
        self.model_name = model_name
        self.metrics = ServerMetrics(model_name)
        c = engine.config
        self.metrics.set_config(c.block_size, engine.num_gpu_blocks, c.max_num_seqs,  # blocks per instance
                                c.max_batch_tokens)
        self.params: dict[int, SamplingParams] = {}
        self.streams: dict[int, RequestStream] = {}
        self._ids = itertools.count()
        self.cluster, self.states = engine.build(lambda spec: self.params[spec.request_id], _Collector(self))
        for d in self.cluster.drivers:
            d.listener = self
        self.inbox: queue.Queue = queue.Queue()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="servelab-engine", daemon=True)
        self.accepting = True
        self.failed: str | None = None  # why the engine thread died (a bug), if it did
        self.exiting = lambda: False  # the HTTP server's "shutting down" flag (set by run_server)
        self._log = request_log.open("a", buffering=1) if request_log is not None else None

    # ---- lifecycle ----
    def start(self) -> None:
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.cluster.serve(self.inbox, self.stop_event, poll_s=0.05)
        except BaseException as e:  # a bug: end every stream rather than leave clients hanging
            log.exception("engine thread failed")
            self.failed = f"{type(e).__name__}: {e}"
            for stream in list(self.streams.values()):
                stream.push(Delta("", (), error=self.failed))
            raise

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.failed is None

    def shutdown(self, grace_s: float) -> None:
        """Stop accepting, let requests in flight finish for up to ``grace_s``, then end the
        rest with the reason "server shutting down" and stop the thread."""
        self.accepting = False
        deadline = time.monotonic() + grace_s
        while self.alive and not self.idle() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.stop_event.set()
        self.thread.join(timeout=60)
        if self._log is not None:
            self._log.close()
            self._log = None

    def idle(self) -> bool:
        return not self.streams and self.cluster.idle()

    # ---- requests (event loop side) ----
    def submit(self, prompt_ids: tuple[int, ...], params: SamplingParams, *, priority: int = 0,
               slo=None) -> RequestStream:
        rid = next(self._ids)
        stream = RequestStream(rid, asyncio.get_running_loop(), time.perf_counter())
        self.params[rid] = params
        self.streams[rid] = stream
        spec = RequestSpec(rid, 0.0, len(prompt_ids), params.max_tokens, prompt_token_ids=prompt_ids,
                           priority=priority, slo=slo)
        self.inbox.put(("submit", spec, None))
        return stream

    def abort(self, request_id: int, reason: str | None = None) -> None:
        if reason is None:
            reason = SHUTDOWN_REASON if self.exiting() or not self.accepting else DISCONNECT_REASON
        self.inbox.put(("abort", request_id, reason))

    # ---- engine thread hooks ----
    def on_step(self, driver, applied, outcome, now_s: float) -> None:
        """InstanceDriver listener: forward new tokens of requests still running."""
        for req in applied.batch:
            stream = self.streams.get(req.request_id)
            if stream is None or req.status.is_terminal or req.num_generated_tokens <= stream.num_tokens_sent:
                continue
            tracked = self.states.tracked.get(req.request_id)
            chunks = tracked.text[stream.num_chunks_sent:] if tracked is not None else []
            text = "".join(chunks)
            stream.num_chunks_sent += len(chunks)
            stream.text_sent.append(text)
            tokens = tuple(req.output_token_ids[stream.num_tokens_sent:])
            stream.num_tokens_sent = req.num_generated_tokens
            stream.push(Delta(text, tokens))
        self._update_gauges()
        self.metrics.busy.set(sum(d.busy_s for d in self.cluster.drivers))

    def _on_end(self, req: Request) -> None:
        stream = self.streams.pop(req.request_id, None)
        self.params.pop(req.request_id, None)
        self.metrics.observe_end(req)
        self._update_gauges()
        tracked = self.states.tracked.get(req.request_id)
        if tracked is not None and tracked.detok is not None:
            final_text = tracked.detok.text  # before ``RequestStates.end`` runs: held-back text included
        else:
            final_text = self.states.outputs_text.get(req.request_id, "")
        if stream is None:
            return
        sent = "".join(stream.text_sent)
        tokens = tuple(req.output_token_ids[stream.num_tokens_sent:])
        stream.push(Delta(final_text[len(sent):], tokens, req, final_text))
        self._write_log(req, stream)

    def _update_gauges(self) -> None:
        running = waiting = swapped = used = total = 0
        for iid in self.cluster.active:
            rt = self.cluster.drivers[iid].runtime
            running += len(rt.running)
            waiting += len(rt.waiting)
            swapped += len(rt.swapped)
            used += rt.blocks.num_used_gpu_blocks
            total += rt.blocks.num_gpu_blocks
        self.metrics.set_queues(running, waiting, swapped, used, total)

    def _write_log(self, req: Request, stream: RequestStream) -> None:
        """One JSON line per ended request: the engine's own times, for comparing with a client's."""
        if self._log is None:
            return
        t0 = self.cluster.clock.t0  # engine times are perf_counter - t0
        times = req.token_times_s
        row = {"id": req.request_id, "status": req.status.value, "finish_reason": req.finish_reason,
               "prompt_tokens": req.num_prompt_tokens, "output_tokens": req.num_generated_tokens,
               "received_s": stream.received_s, "arrival_s": t0 + req.arrival_time_s,
               "engine_ttft_s": times[0] - req.arrival_time_s if times else None,
               "engine_e2e_s": times[-1] - req.arrival_time_s if times else None,
               "engine_tpot_s": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None,
               "first_token_s": t0 + times[0] if times else None}
        self._log.write(json.dumps(row) + "\n")
