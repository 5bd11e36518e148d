"""OpenAI response objects: whole completions, and SSE chunks for streams.

A stream is ``data: <chunk JSON>\\n\\n`` lines ending with ``data: [DONE]``; the last content
chunk carries ``finish_reason`` (``stop``, ``length``, or ``abort`` when the server ended the
request, as vLLM says), and with ``stream_options.include_usage`` a final chunk with empty
``choices`` carries the token counts. A request that ended unfinished after its stream began
ends with an ``error`` chunk naming the reason, then ``[DONE]``.
"""

from __future__ import annotations

import json
import time

from servelab.core.request import Request
from servelab.server.metrics import openai_finish_reason


def usage(req: Request) -> dict:
    return {"prompt_tokens": req.num_prompt_tokens, "completion_tokens": req.num_generated_tokens,
            "total_tokens": req.num_prompt_tokens + req.num_generated_tokens}


class ResponseBuilder:
    """Builds one request's objects; ``chat`` picks the chat.completion shapes."""

    def __init__(self, request_id: int, model: str, chat: bool) -> None:
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.model = model
        self.chat = chat
        self.created = int(time.time())

    def full(self, req: Request, text: str) -> dict:
        reason = openai_finish_reason(req)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [choice],
                "usage": usage(req)}

    def chunk(self, text: str, finish_reason: str | None = None, *, role: bool = False) -> str:
        if self.chat:
            delta = {"role": "assistant", "content": text} if role else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            kind = "text_completion"
        return sse({"id": self.id, "object": kind, "created": self.created, "model": self.model,
                    "choices": [choice]})

    def usage_chunk(self, req: Request) -> str:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return sse({"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [],
                    "usage": usage(req)})


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def sse_error(message: str, status: int) -> str:
    from servelab.server.errors import error_body

    return sse(error_body(status, message))


DONE = "data: [DONE]\n\n"
