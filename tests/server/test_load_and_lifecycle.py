"""64 concurrent streaming clients, /metrics afterwards, a client that disconnects mid-stream,
and a shutdown with requests in flight."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from servelab.core.request import RequestStatus
from servelab.server.service import DISCONNECT_REASON, SHUTDOWN_REASON


def scrape(base_url: str) -> dict[str, float]:
    """Samples of /metrics by name (label model_name dropped; finished_reason kept in the name)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(base_url + "/metrics").text):
        for s in family.samples:
            extra = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("model_name", "le"))
            if "le" not in s.labels:
                out[s.name + (f"{{{extra}}}" if extra else "")] = s.value
    return out


def test_64_concurrent_streams_and_metrics(start_server, kv_in_use):
    server = start_server()
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120)

    async def one(i: int) -> tuple[int, str, int]:
        stream = await client.completions.create(model="tiny", prompt=f"Question {i}: how many apples?",
                                                 max_tokens=8 + i % 9, temperature=0.7, seed=i, stream=True,
                                                 stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        tokens, reason = 0, None
        async for chunk in stream:
            if chunk.choices:
                tokens += 1
                reason = chunk.choices[0].finish_reason or reason
            if chunk.usage:
                assert chunk.usage.completion_tokens == tokens
        return tokens, reason, 8 + i % 9

    async def main():
        return await asyncio.gather(*(one(i) for i in range(64)))

    results = asyncio.run(main())
    assert all(tokens == want and reason == "length" for tokens, reason, want in results)
    deadline = time.monotonic() + 10
    while not server.service.idle() and time.monotonic() < deadline:
        time.sleep(0.01)
    m = scrape(server.base_url)
    total_tokens = sum(want for _, _, want in results)
    assert m["vllm:request_success_total{finished_reason=length}"] == 64
    assert m["vllm:generation_tokens_total"] == total_tokens
    assert m["vllm:time_to_first_token_seconds_count"] == 64
    assert m["vllm:e2e_request_latency_seconds_count"] == 64
    assert m["vllm:time_per_output_token_seconds_count"] == total_tokens - 64  # every gap between tokens
    prompts = sum(r.num_prompt_tokens for r in server.service.cluster.requests)
    assert m["vllm:prompt_tokens_total"] == prompts
    assert (m["vllm:num_requests_running"], m["vllm:num_requests_waiting"], m["vllm:gpu_cache_usage_perc"]) == (0, 0, 0)
    assert kv_in_use(server.service) == 0


def _stream_lines(url: str, body: dict, num_chunks: int, got: list) -> None:
    """Read ``num_chunks`` data lines of a stream, then drop the connection."""
    with httpx.Client(timeout=30) as c, c.stream("POST", url, json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                got.append(line)
                if len(got) >= num_chunks:
                    return  # leaving the with-blocks closes the socket mid-stream


def test_disconnect_mid_stream_frees_kv(start_server, kv_in_use):
    server = start_server()
    got: list[str] = []
    body = {"prompt": "Tell a long story", "max_tokens": 240, "ignore_eos": True, "stream": True}
    _stream_lines(server.base_url + "/v1/completions", body, 3, got)
    assert len(got) == 3
    service = server.service
    deadline = time.monotonic() + 10
    while not service.idle() and time.monotonic() < deadline:
        time.sleep(0.01)
    (req,) = service.cluster.requests
    assert (req.status, req.finish_reason) == (RequestStatus.ABORTED, DISCONNECT_REASON)
    assert 3 <= req.num_generated_tokens < 240
    assert kv_in_use(service) == 0


def test_shutdown_ends_every_request_in_flight_with_a_reason(start_server, kv_in_use):
    # no grace period: on an idle machine 240 tiny-model tokens can finish within any short one
    server = start_server(shutdown_timeout_s=0.0)
    url = server.base_url + "/v1/completions"
    outcomes: list = []

    def streaming(i: int) -> None:
        lines: list[str] = []
        try:
            with httpx.Client(timeout=30) as c, c.stream("POST", url, json={
                    "prompt": f"story {i}", "max_tokens": 240, "ignore_eos": True, "stream": True}) as r:
                lines = [x for x in r.iter_lines() if x.startswith("data:")]
            outcomes.append(("stream", lines[-2] if len(lines) > 1 else lines))
        except httpx.HTTPError as e:
            outcomes.append(("stream-cut", type(e).__name__))

    def whole() -> None:
        try:
            r = httpx.post(url, json={"prompt": "x", "max_tokens": 240, "ignore_eos": True}, timeout=30)
            outcomes.append(("whole", r.status_code))
        except httpx.HTTPError as e:
            outcomes.append(("whole-cut", type(e).__name__))

    threads = [threading.Thread(target=streaming, args=(i,)) for i in range(4)] + [threading.Thread(target=whole)]
    for t in threads:
        t.start()
    service = server.service
    deadline = time.monotonic() + 10
    while sum(r.num_generated_tokens > 0 for r in service.cluster.requests) < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    server.stop(timeout_s=30)
    for t in threads:
        t.join(30)
    assert not server.thread.is_alive() and not service.thread.is_alive()
    requests = service.cluster.requests
    assert len(requests) == 5 and all(r.status.is_terminal and r.finish_reason for r in requests)
    aborted = [r for r in requests if r.status is RequestStatus.ABORTED]
    assert aborted and all(r.finish_reason == SHUTDOWN_REASON for r in aborted)
    assert all(r.num_generated_tokens == 240 for r in requests if r.status is RequestStatus.FINISHED)
    assert kv_in_use(service) == 0
    assert len(outcomes) == 5


def _stream_all(base_url: str, n: int, max_tokens: int) -> list[tuple[int, str]]:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120)

    async def one(i: int) -> tuple[int, str]:
        stream = await client.completions.create(model="tiny", prompt=f"Problem {i}: a train leaves", stream=True,
                                                 max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True})
        tokens, reason = 0, None
        async for chunk in stream:
            tokens += 1
            reason = chunk.choices[0].finish_reason or reason
        return tokens, reason

    async def main():
        return await asyncio.gather(*(one(i) for i in range(n)))

    return asyncio.run(main())


def test_full_kv_preempts_and_loses_nothing(start_server, kv_in_use):
    from servelab.engine.cluster import EngineConfig

    # 32 blocks of 4 tokens: one request (about 10 + 40 tokens) fits, eight at once do not
    server = start_server(engine=EngineConfig(kv_budget_bytes=64 << 10, block_size=4))
    results = _stream_all(server.base_url, 8, 40)
    assert results == [(40, "length")] * 8
    m = scrape(server.base_url)
    assert m["vllm:num_preemptions_total"] > 0
    assert m["vllm:request_success_total{finished_reason=length}"] == 8
    assert kv_in_use(server.service) == 0


def test_cluster_of_two_with_handoffs_streams_every_token(start_server, kv_in_use):
    server = start_server(policy="distserve", num_instances=2)  # prefill instance hands off to decode
    assert _stream_all(server.base_url, 6, 12) == [(12, "length")] * 6
    requests = server.service.cluster.requests
    assert all(r.num_transfers >= 1 for r in requests)  # each moved from the prefill to the decode instance
    assert kv_in_use(server.service) == 0
