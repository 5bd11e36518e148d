"""One streamed request to an OpenAI-compatible server, timed as ``vllm bench serve`` times it.

TTFT is from sending the request to the first chunk with content (a token), ITL each gap
between later content chunks, latency (e2e) to the end of the stream. Output tokens are the
server's ``usage.completion_tokens`` (requested with ``stream_options.include_usage``), else
the number of content chunks. Timing uses ``time.perf_counter`` on the client.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

import httpx

from servelab.bench.prompts import PlannedRequest


@dataclass
class RequestResult:
    index: int
    success: bool = False
    start_s: float = 0.0  # perf_counter when sent
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    prompt_len: int = 0  # the server's count when it reported usage, else the planned one
    output_len: int = 0
    response_id: str = ""
    finish_reason: str | None = None
    error: str = ""

    @property
    def tpot_s(self) -> float | None:
        """(latency - TTFT) / (output tokens - 1), as vLLM's benchmark defines it."""
        return (self.latency_s - self.ttft_s) / (self.output_len - 1) if self.output_len > 1 else None


def payload_for(req: PlannedRequest, model: str, endpoint: str, *, ignore_eos: bool, temperature: float,
                extra: dict | None = None) -> dict:
    body: dict = {"model": model, "max_tokens": req.output_len, "temperature": temperature, "stream": True,
                  "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    if endpoint.endswith("/chat/completions"):
        if not isinstance(req.prompt, str):
            raise ValueError("the chat endpoint takes text prompts (use --prompt-format text)")
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    if req.priority:
        body["priority"] = req.priority
    if req.slo:
        body["slo"] = req.slo
    if extra:
        body.update(extra)
    return body


def _content(chunk: dict) -> str | None:
    """The chunk's text (possibly ""), or None when it carries no token (usage, role only)."""
    choices = chunk.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    if "text" in choice:
        return choice["text"] or ""
    delta = choice.get("delta") or {}
    if "content" in delta and not (delta.get("role") and delta.get("content") == ""):
        return delta.get("content") or ""
    return None


async def sse_lines(response: httpx.Response):
    """The stream's lines split only where server-sent events end a line (``\\n``, ``\\r\\n``,
    ``\\r``). httpx's ``aiter_lines`` also splits at the other characters ``str.splitlines`` knows
    (U+2028, U+0085, U+001C ...), which a JSON encoder leaves unescaped in generated text: a
    random-weight model's tokens include them, and the broken ``data:`` line failed the request
    (1 of 32 streams of a calibration probe against vLLM)."""
    buffer = ""
    async for text in response.aiter_text():
        buffer += text
        *lines, buffer = re.split(r"\r\n|\n|\r(?=.)", buffer, flags=re.S)
        for line in lines:
            yield line
    if buffer:
        yield buffer.rstrip("\r")


async def send(client: httpx.AsyncClient, url: str, body: dict, req: PlannedRequest,
               headers: dict | None = None, on_token=None) -> RequestResult:
    """``on_token``: called with no argument as each content chunk arrives (a probe that must
    act while a stream runs, ``validate.probes``' mixed step, waits on it)."""
    out = RequestResult(req.index, prompt_len=req.prompt_len)
    num_chunks = 0
    usage = None
    out.start_s = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                out.error = f"HTTP {response.status_code}: {text[:300]}"
                return out
            async for line in sse_lines(response):
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    out.error = str(chunk["error"].get("message", chunk["error"]))[:300]
                    return out
                now = time.perf_counter()
                if _content(chunk) is not None:
                    if num_chunks == 0:
                        out.ttft_s = now - out.start_s
                    else:
                        out.itl_s.append(now - last)
                    num_chunks += 1
                    last = now
                    if on_token is not None:
                        on_token()
                    out.finish_reason = (chunk["choices"][0].get("finish_reason") or out.finish_reason)
                    out.response_id = chunk.get("id", out.response_id)
                if chunk.get("usage"):
                    usage = chunk["usage"]
        out.latency_s = time.perf_counter() - out.start_s
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
        out.error = f"{type(e).__name__}: {e}"[:300]
        return out
    if num_chunks == 0:
        out.error = "no tokens in the response"
        return out
    out.output_len = int(usage["completion_tokens"]) if usage else num_chunks
    if usage and usage.get("prompt_tokens"):
        out.prompt_len = int(usage["prompt_tokens"])
    out.success = True
    return out
