"""Request bodies of the OpenAI-compatible API (pydantic), as FastAPI validates and documents them.

The fields follow OpenAI's ``/v1/completions`` and ``/v1/chat/completions``; ``top_k``,
``ignore_eos``, ``stop_token_ids`` and ``priority`` are the extensions vLLM accepts, and
``slo`` (per-request latency targets, seconds) is servelab's. Numbers are typed strictly (a
JSON ``true`` is not a token id) and bounded, so every bad body is a 400 with the field named,
before anything reaches the engine. Unknown fields are ignored, as OpenAI's clients send some
(``user``) that change nothing here. Options that servelab does not implement (``n > 1``,
``echo``, penalties, ``logit_bias``, ``best_of``, ``suffix``) are accepted only at their no-op
values, so a client never gets a silently different answer than it asked for; ``logprobs``
has no no-op value (OpenAI and vLLM answer ``logprobs: 0`` with the sampled tokens'
log-probabilities), so any value but null is refused. The fields whose type is a union
(``prompt``, ``stop``) state their rules in words (``errors.rule``), so a bad one is answered
with the rule it breaks rather than one complaint per accepted form.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

from servelab.core.errors import shown
from servelab.core.limits import MAX_TOKENS
from servelab.server.errors import rule

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_SEED = 2**63 - 1
MAX_PRIORITY = 2**31 - 1
MAX_TEXT_CHARS = 1 << 22  # 4 Mi characters: far past any context, small enough to tokenise at once
MAX_TOKEN_ID = 2**31 - 1
NO_LOGPROBS = ("log-probabilities are not supported by this server yet (OpenAI and vLLM would return the "
               "sampled tokens' ones, even for 0); omit the field or send null")

Float = Annotated[StrictFloat, Field(allow_inf_nan=False)]
TokenId = Annotated[StrictInt, Field(ge=0, le=MAX_TOKEN_ID)]
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

    @field_validator("n", mode="before")
    @classmethod
    def _n_rule(cls, value):
        if type(value) is int and value != 1:
            raise rule(f"one choice per request: only n = 1 is supported, got {value} (send {value} requests)")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_rule(cls, value):
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            return value  # null, or a wrong type: the annotation says what it takes
        if len(items) > MAX_STOP_STRINGS:
            raise rule(f"at most {MAX_STOP_STRINGS} stop strings, got {len(items)}")
        for i, item in enumerate(items):
            at = "" if isinstance(value, str) else f"item {i} "
            if not isinstance(item, str):
                raise rule(f"{at}must be a string, got {shown(item)}")
            if not 1 <= len(item) <= MAX_STOP_CHARS:
                raise rule(f"{at}must be 1 to {MAX_STOP_CHARS} characters long, got {len(item)}")
        return value


Prompt = Union[
    Annotated[StrictStr, Field(min_length=1, max_length=MAX_TEXT_CHARS)],
    Annotated[list[TokenId], Field(min_length=1)],
    Annotated[list[Annotated[StrictStr, Field(min_length=1, max_length=MAX_TEXT_CHARS)]],
              Field(min_length=1, max_length=1)],
    Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=1)],
]


class CompletionRequest(SamplingFields):
    prompt: Prompt = Field(..., description="Text or token ids; a list of one prompt is accepted (no batches).")
    logprobs: None = Field(None, description="Not supported yet: only null.")
    echo: Literal[False] = Field(False, description="Not supported.")
    best_of: Annotated[StrictInt, Field(ge=1, le=1)] | None = Field(None, description="Only 1 is supported.")
    suffix: Annotated[StrictStr, Field(max_length=0)] | None = Field(None, description="Not supported.")

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_rule(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            if len(value) > 1:
                raise rule(f"one prompt per request: a list of {len(value)} prompts is not supported")
            _check_prompt(value[0], "item 0 ")
        else:
            _check_prompt(value, "")
        return value

    @field_validator("logprobs", mode="before")
    @classmethod
    def _logprobs_rule(cls, value):
        if value is not None:
            raise rule(NO_LOGPROBS)
        return value

    @field_validator("best_of", mode="before")
    @classmethod
    def _best_of_rule(cls, value):
        if type(value) is int and value != 1:
            raise rule(f"only best_of = 1 (or null) is supported, got {value}")
        return value


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
    logprobs: Literal[False] | None = Field(None, description="Not supported yet: only false or null.")
    top_logprobs: None = Field(None, description="Not supported yet: only null.")
    add_generation_prompt: StrictBool = Field(True, description="Extension: end the prompt with the assistant's turn.")

    @field_validator("logprobs", "top_logprobs", mode="before")
    @classmethod
    def _logprobs_rule(cls, value):
        if value is not None and value is not False:
            raise rule(NO_LOGPROBS)
        return value


def _check_prompt(value, at: str) -> None:
    """A prompt is non-empty text, or a non-empty list of token ids; ``at`` names the item."""
    if isinstance(value, str):
        if not 1 <= len(value) <= MAX_TEXT_CHARS:
            raise rule(f"{at}must be 1 to {MAX_TEXT_CHARS:,} characters of text, got {len(value):,}")
        return
    if not isinstance(value, list):
        raise rule(f"{at}must be text, a list of token ids, or a list of one prompt, got {shown(value)}")
    if not value:
        raise rule(f"{at}must not be empty: give text or at least one token id")
    for i, token in enumerate(value):
        if type(token) is not int or not 0 <= token <= MAX_TOKEN_ID:
            raise rule(f"{at}token {i} must be a token id (an integer in [0, {MAX_TOKEN_ID}]), got {shown(token)}")
