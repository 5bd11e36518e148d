"""The bench client reads server-sent events line by line as SSE defines lines: generated text
with U+2028, U+0085 or U+001C (left unescaped by JSON encoders, produced by random-weight
models) must not split a ``data:`` line (httpx's ``aiter_lines`` splits there)."""

from __future__ import annotations

import asyncio
import json

import httpx

from servelab.bench.client import send
from servelab.bench.prompts import PlannedRequest

TEXTS = ["a\u2028b", "c\x85d", "e\x1cf\x1dg\x1e", "h\u2029i\x0bj\x0ck"]


def _stream(line_end: str, pieces: int):
    chunks = [json.dumps({"id": "x", "choices": [{"index": 0, "text": t, "finish_reason": None}]},
                         ensure_ascii=False) for t in TEXTS]
    chunks.append(json.dumps({"id": "x", "choices": [], "usage": {"prompt_tokens": 3,
                                                                  "completion_tokens": len(TEXTS)}}))
    body = "".join(f"data: {c}{line_end}{line_end}" for c in chunks) + f"data: [DONE]{line_end}{line_end}"
    raw = body.encode()
    step = max(1, len(raw) // pieces)
    return [raw[i:i + step] for i in range(0, len(raw), step)]  # split anywhere, even inside a character


def _run(line_end: str, pieces: int):
    class Body(httpx.AsyncByteStream):
        async def __aiter__(self):
            for piece in _stream(line_end, pieces):
                yield piece

    transport = httpx.MockTransport(lambda request: httpx.Response(200, stream=Body()))

    async def go():
        async with httpx.AsyncClient(transport=transport) as client:
            return await send(client, "http://server/v1/completions", {"prompt": [1, 2, 3]},
                              PlannedRequest(0, 0.0, [1, 2, 3], 3, len(TEXTS)))

    return asyncio.run(go())


def test_unicode_line_separators_in_generated_text_do_not_break_the_stream():
    for line_end in ("\n", "\r\n", "\r"):
        for pieces in (1, 7, 200):
            r = _run(line_end, pieces)
            assert r.error == "" and r.success, (line_end, pieces, r.error)
            assert r.output_len == len(TEXTS) and len(r.itl_s) == len(TEXTS) - 1
