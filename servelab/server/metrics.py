"""Prometheus metrics of one server, under vLLM's names (``vllm:*``) so its dashboards work.

Gauges (``num_requests_running / waiting / swapped``, ``gpu_cache_usage_perc`` as a fraction
of every instance's KV blocks, as vLLM reports it) are set by the engine thread after every
step and every request end; histograms and counters are observed once per request when it
ends, from the engine's own times (``Request.token_times_s`` on the wall clock), so they say
what the engine did, not what HTTP added. ``time_per_output_token_seconds`` takes every gap
between two tokens of a request (vLLM v0's meaning); ``request_time_per_output_token_seconds``
the per-request mean (v1's). Each server has its own registry (several run in one test).
``servelab:engine_busy_seconds`` (wall time in steps) next to ``process_cpu_seconds_total``
says what share of a core the steps really got (contention on a shared machine).

vLLM V1's names are exported beside the old ones (issue 31): ``kv_cache_usage_perc`` (V1's
name for ``gpu_cache_usage_perc``), ``iteration_tokens_total`` (tokens per engine step),
``request_queue_time_seconds`` (arrival to first scheduled), ``request_prefill_time_seconds``
(first scheduled to first token), ``request_decode_time_seconds`` (first to last token),
``request_inference_time_seconds`` (first scheduled to last token) and the prefix-cache
counters ``prefix_cache_queries`` / ``prefix_cache_hits`` (prompt tokens looked up / found:
this engine keeps no prefix cache, so hits stay 0, which is what they mean here).
"""

from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics,
                               generate_latest)

from servelab.core.request import Request, RequestStatus

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


def openai_finish_reason(req: Request) -> str:
    """The OpenAI word for why a request ended: stop (EOS, stop token or string), length, abort."""
    if req.status is RequestStatus.FINISHED:
        return "length" if req.finish_reason == "length" else "stop"
    return "abort"


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        disable_created_metrics()  # no *_created series (process-wide, as vLLM does)
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"vllm:{name}", doc, labels, registry=r).labels(model_name)

        self.running = gauge("num_requests_running", "Requests in a running batch (on every instance).")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.swapped = gauge("num_requests_swapped", "Requests whose KV is swapped to host memory.")
        self.kv_usage = gauge("gpu_cache_usage_perc", "KV blocks in use, as a fraction of all (1 = full).")
        self.kv_usage_v1 = gauge("kv_cache_usage_perc", "KV blocks in use, as a fraction of all (V1's name).")

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(f"vllm:{name}", doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.iteration_tokens = histogram("iteration_tokens_total", "Tokens in each engine step.",
                                          ITERATION_TOKEN_BUCKETS)
        self.queue_time = histogram("request_queue_time_seconds", "Arrival to first scheduled.", E2E_BUCKETS)
        self.prefill_time = histogram("request_prefill_time_seconds", "First scheduled to first token.",
                                      E2E_BUCKETS)
        self.decode_time = histogram("request_decode_time_seconds", "First token to last token.", E2E_BUCKETS)
        self.inference_time = histogram("request_inference_time_seconds", "First scheduled to last token.",
                                        E2E_BUCKETS)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                      labels, registry=r).labels(model_name)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache (no prefix "
                                   "cache here: 0).", labels, registry=r).labels(model_name)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Engine time to first token.", labels,
                              buckets=TTFT_BUCKETS, registry=r).labels(model_name)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Each gap between two output tokens.",
                              labels, buckets=TPOT_BUCKETS, registry=r).labels(model_name)
        self.request_tpot = Histogram("vllm:request_time_per_output_token_seconds",
                                      "Per request: (last token - first token) / (tokens - 1).", labels,
                                      buckets=TPOT_BUCKETS, registry=r).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival to last token (engine clock).", labels,
                             buckets=E2E_BUCKETS, registry=r).labels(model_name)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of requests that ended.", labels,
                                     registry=r).labels(model_name)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens of requests that ended.",
                                         labels, registry=r).labels(model_name)
        self.success = Counter("vllm:request_success", "Requests that finished, by finish reason.",
                               labels + ["finished_reason"], registry=r)
        self.ended_other = Counter("servelab:request_ended_unfinished", "Requests rejected or aborted.",
                                   labels + ["status"], registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions (recompute or swap).", labels,
                                   registry=r).labels(model_name)
        self.busy = Gauge("servelab:engine_busy_seconds", "Wall time the instances spent in steps (summed).",
                          labels, registry=r).labels(model_name)
        self.cache_info = Gauge("vllm:cache_config_info", "KV cache set-up in the labels (as vLLM writes it).",
                                ["block_size", "num_gpu_blocks"], registry=r)
        self.scheduler_info = Gauge("servelab:scheduler_config_info", "Batch limits in the labels (what a "
                                    "simulator of this server needs; servelab validate --base-url reads them).",
                                    ["max_num_seqs", "max_num_batched_tokens"], registry=r)
        ProcessCollector(registry=r)  # process_cpu_seconds_total: with busy_seconds, the CPU share steps got
        self.model_name = model_name

    def set_config(self, block_size: int, num_gpu_blocks: int, max_num_seqs: int, max_num_batched_tokens: int
                   ) -> None:
        """The info gauges (value 1): KV blocks per instance and the batch limits."""
        self.cache_info.labels(str(block_size), str(num_gpu_blocks)).set(1)
        self.scheduler_info.labels(str(max_num_seqs), str(max_num_batched_tokens)).set(1)

    def set_queues(self, num_running: int, num_waiting: int, num_swapped: int, kv_used: int, kv_total: int) -> None:
        self.running.set(num_running)
        self.waiting.set(num_waiting)
        self.swapped.set(num_swapped)
        self.kv_usage.set(kv_used / kv_total if kv_total else 0.0)
        self.kv_usage_v1.set(kv_used / kv_total if kv_total else 0.0)

    def observe_step(self, num_tokens: int, num_steps: int = 1) -> None:
        """One engine step (or ``num_steps`` equal ones) of ``num_tokens`` tokens in all."""
        per_step = num_tokens / max(num_steps, 1)
        for _ in range(max(num_steps, 1)):
            self.iteration_tokens.observe(per_step)

    def observe_end(self, req: Request) -> None:
        self.prompt_tokens.inc(req.num_prompt_tokens)
        self.prefix_queries.inc(req.num_prompt_tokens)
        self.generation_tokens.inc(req.num_generated_tokens)
        if req.status is not RequestStatus.FINISHED:
            self.ended_other.labels(self.model_name, req.status.value).inc()
            return
        self.success.labels(self.model_name, openai_finish_reason(req)).inc()
        times = req.token_times_s
        scheduled = req.first_scheduled_time_s
        if scheduled is not None:
            self.queue_time.observe(max(scheduled - req.arrival_time_s, 0.0))
            if times:
                self.prefill_time.observe(max(times[0] - scheduled, 0.0))
                self.inference_time.observe(max(times[-1] - scheduled, 0.0))
        if times:
            self.decode_time.observe(max(times[-1] - times[0], 0.0))
            self.ttft.observe(max(times[0] - req.arrival_time_s, 0.0))
            self.e2e.observe(max(times[-1] - req.arrival_time_s, 0.0))
            for a, b in zip(times, times[1:]):
                self.tpot.observe(b - a)
            if len(times) > 1:
                self.request_tpot.observe((times[-1] - times[0]) / (len(times) - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
