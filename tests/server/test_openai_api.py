"""The official ``openai`` client against a live server: completions and chat, streaming and
not, usage and finish reasons, the extension fields, auth, and bad input as 4xx bodies."""

from __future__ import annotations

import httpx
import openai
import pytest

from servelab.core.request import SLO, RequestStatus

PROMPT = "Natalia sold clips to 48 of her friends"


@pytest.fixture
def server(start_server):
    return start_server()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_completion_streamed_equals_whole(server, client):
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12
    assert whole.usage.prompt_tokens == len(server.service.engine.loaded.tokenizer.encode(PROMPT).ids)
    assert "".join(c.choices[0].text for c in text_chunks) == whole.choices[0].text  # greedy: same tokens
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices
    assert len(text_chunks) == 12  # one chunk per token, even when a token adds no text yet


def test_chat_uses_the_template_and_streams(server, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How many clips?"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    tokenizer = server.service.engine.loaded.tokenizer
    rendered = "<s><|system|>\nBe brief.</s>\n<|user|>\nHow many clips?</s>\n<|assistant|>\n"
    assert whole.usage.prompt_tokens == len(tokenizer.encode(rendered, add_special_tokens=False).ids)
    assert whole.choices[0].message.role == "assistant"
    stream = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                                 stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == whole.choices[0].message.content
    assert stream[-1].choices[0].finish_reason == "length"


def test_stop_string_and_ignore_eos(server, client):
    free = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0)
    text = free.choices[0].text
    stop = text[3:6]
    assert stop and text.find(stop) == 3
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[:3]
    assert cut.choices[0].finish_reason == "stop"


def test_models_health_and_extensions_reach_the_policy(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(server.base_url + "/health").status_code == 200
    client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2,
                              extra_body={"priority": 7, "slo": {"ttft_s": 0.5, "tpot_s": 0.05}})
    spec = server.service.cluster.requests[-1].spec
    assert (spec.priority, spec.slo) == (7, SLO(ttft_s=0.5, tpot_s=0.05))


@pytest.mark.parametrize("kwargs, status, words", [
    (dict(model="nope", prompt="x"), 404, "does not exist"),
    (dict(model="tiny", prompt="x", max_tokens=400), 400, "maximum context length is 256"),
    (dict(model="tiny", prompt=[7, 9999]), 400, "outside the vocabulary"),
    (dict(model="tiny", prompt="x", temperature=-1), 400, "temperature"),
    (dict(model="tiny", prompt="x", top_p=0), 400, "top_p"),
    (dict(model="tiny", prompt="x", n=2), 400, "n"),
    (dict(model="tiny", prompt="x", logprobs=2), 400, "logprobs"),
    (dict(model="tiny", prompt="", max_tokens=2), 400, "prompt"),
    (dict(model="tiny", prompt="x", max_tokens=0), 400, "max_tokens"),
    (dict(model="tiny", prompt="x", stop=[""]), 400, "stop"),
])
def test_bad_completion_requests_are_4xx(server, client, kv_in_use, kwargs, status, words):
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(**kwargs)
    assert info.value.status_code == status
    body = info.value.body
    assert words in body["message"] and body["type"].endswith("_error")
    assert server.service.alive and kv_in_use(server.service) == 0


def test_kv_that_can_never_fit_is_400(start_server):
    from servelab.engine.cluster import EngineConfig

    server = start_server(engine=EngineConfig(kv_budget_bytes=64 << 10, block_size=4))  # a few dozen blocks
    c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="KV blocks"):
        c.completions.create(model="tiny", prompt="x", max_tokens=250)


def test_raw_bodies(server):
    post = lambda body, **kw: httpx.post(server.base_url + "/v1/completions", content=body,  # noqa: E731
                                         headers={"content-type": "application/json"}, **kw)
    for body in (b"{bad json", b"[]", b'{"prompt": true}', b'{"prompt": [true]}', b'{"prompt":"x","seed":-1}'):
        r = post(body)
        assert r.status_code == 400 and r.json()["error"]["message"], body
    assert httpx.get(server.base_url + "/v1/nothing").status_code == 404
    assert httpx.get(server.base_url + "/v1/completions").status_code == 405


def test_api_key(start_server):
    server = start_server(api_key="sekret")
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=server.base_url + "/v1", api_key="sekret", max_retries=0)
    assert good.completions.create(model="tiny", prompt="x", max_tokens=2).usage.completion_tokens == 2
    assert httpx.get(server.base_url + "/metrics").status_code == 200  # like vLLM: /metrics is open
    ended = [r for r in server.service.cluster.requests if r.status.is_terminal]
    assert [r.status for r in ended] == [RequestStatus.FINISHED]


def test_vllm_conventions_v1_metrics_created_time_and_refusals(server, client):
    """Issue 31 (9): vLLM V1's metric names beside the old ones, /v1/models' created a real
    time, and n > 1, best_of, logprobs and a list of prompts refused in OpenAI's error shape
    with the rule in words (not pydantic's "input should be less than or equal to 1")."""
    import time

    model = client.models.list().data[0]
    assert abs(model.created - time.time()) < 3600
    client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3)
    text = httpx.get(server.base_url + "/metrics").text
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:iteration_tokens_total_bucket",
                 "vllm:request_queue_time_seconds_count", "vllm:request_prefill_time_seconds_count",
                 "vllm:request_decode_time_seconds_count", "vllm:request_inference_time_seconds_count",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        assert name in text, name
    counts = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("vllm:") and "{" in line and "_bucket" not in line}
    assert counts["vllm:request_prefill_time_seconds_count"] == 1 and counts["vllm:iteration_tokens_total_count"] >= 3
    assert counts["vllm:prefix_cache_queries_total"] == counts["vllm:prompt_tokens_total"]
    for kwargs, words in ((dict(n=2), "only n = 1 is supported"), (dict(best_of=2), "best_of = 1"),
                          (dict(logprobs=0), "log-probabilities are not supported"),
                          (dict(prompt=["a", "b"]), "a list of 2 prompts is not supported")):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(**{"model": "tiny", "prompt": "x", "max_tokens": 2, **kwargs})
        body = info.value.body
        assert set(body) == {"message", "type", "param", "code"} and words in body["message"], body
