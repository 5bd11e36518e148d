"""Request bodies of the OpenAI-compatible API (pydantic), as FastAPI validates and documents them.

The fields follow OpenAI's ``/v1/completions`` and ``/v1/chat/completions``; ``top_k``,
``ignore_eos``, ``stop_token_ids`` and ``priority`` are the extensions vLLM accepts, and
``slo`` (per-request latency targets, seconds) is servelab's. Numbers are typed strictly (a
JSON ``true`` is not a token id) and bounded, so every bad body is a 400 with the field named,
before anything reaches the engine. Unknown fields are ignored, as OpenAI's clients send some
(``user``) that change nothing here. Options that servelab does not implement (``n > 1``,
``logprobs``, ``echo``, penalties, ``logit_bias``, ``best_of``, ``suffix``) are accepted only at
their no-op values, so a client never gets a silently different answer than it asked for.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from servelab.core.limits import MAX_TOKENS

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_SEED = 2**63 - 1
MAX_PRIORITY = 2**31 - 1
MAX_TEXT_CHARS = 1 << 22  # 4 Mi characters: far past any context, small enough to tokenise at once

Float = Annotated[StrictFloat, Field(allow_inf_nan=False)]
TokenId = Annotated[StrictInt, Field(ge=0, le=2**31 - 1)]
StopString = Annotated[StrictStr, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: StrictBool = False


class SLOTargets(_Body):
    """Per-request latency targets in seconds (servelab extension), handed to the policy."""

    ttft_s: Annotated[Float, Field(gt=0)] | None = None
    tpot_s: Annotated[Float, Field(gt=0)] | None = None
    tbt_s: Annotated[Float, Field(gt=0)] | None = None


class SamplingFields(_Body):
    """Fields shared by both endpoints."""

    model: StrictStr | None = Field(None, max_length=512, description="The served model name (GET /v1/models).")
    max_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] | None = None
    temperature: Annotated[Float, Field(ge=0, le=100)] | None = None
    top_p: Annotated[Float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1, le=2**31 - 1)] | None = Field(
        None, description="Extension: keep the k most likely tokens (0 or -1 disables).")
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_STRINGS)] | None = None
    ignore_eos: StrictBool = Field(False, description="Extension: keep generating past EOS (fixed-length benchmarks).")
    n: Annotated[StrictInt, Field(ge=1, le=1)] = Field(1, description="Only 1 is supported.")
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Annotated[Float, Field(ge=0, le=0)] = Field(0.0, description="Only 0 is supported.")
    frequency_penalty: Annotated[Float, Field(ge=0, le=0)] = Field(0.0, description="Only 0 is supported.")
    logit_bias: Annotated[dict[str, Float], Field(max_length=0)] | None = Field(None, description="Not supported.")
    user: StrictStr | None = Field(None, max_length=512)
    priority: Annotated[StrictInt, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] = Field(
        0, description="Extension: larger is more urgent (read by the priority policy).")
    slo: SLOTargets | None = Field(None, description="Extension: per-request latency targets (seconds).")


Prompt = Union[
    Annotated[StrictStr, Field(min_length=1, max_length=MAX_TEXT_CHARS)],
    Annotated[list[TokenId], Field(min_length=1)],
    Annotated[list[Annotated[StrictStr, Field(min_length=1, max_length=MAX_TEXT_CHARS)]],
              Field(min_length=1, max_length=1)],
    Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=1)],
]


class CompletionRequest(SamplingFields):
    prompt: Prompt = Field(..., description="Text or token ids; a list of one prompt is accepted (no batches).")
    logprobs: Annotated[StrictInt, Field(ge=0, le=0)] | None = Field(None, description="Not supported.")
    echo: Literal[False] = Field(False, description="Not supported.")
    best_of: Annotated[StrictInt, Field(ge=1, le=1)] | None = Field(None, description="Only 1 is supported.")
    suffix: Annotated[StrictStr, Field(max_length=0)] | None = Field(None, description="Not supported.")


class TextPart(_Body):
    type: Literal["text"]
    text: Annotated[StrictStr, Field(max_length=MAX_TEXT_CHARS)]


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "developer"]
    content: Annotated[StrictStr, Field(max_length=MAX_TEXT_CHARS)] | Annotated[list[TextPart], Field(min_length=1)]
    name: StrictStr | None = Field(None, max_length=256)

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=4096)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] | None = None
    logprobs: Literal[False] | None = Field(None, description="Not supported.")
    add_generation_prompt: StrictBool = Field(True, description="Extension: end the prompt with the assistant's turn.")
