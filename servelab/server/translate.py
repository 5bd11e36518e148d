"""From a validated OpenAI body to what the engine takes: prompt token ids and SamplingParams.

The limits a request can break are checked here, before it is submitted, each a 400 naming
the field: a token id outside the vocabulary, a prompt plus ``max_tokens`` beyond the model's
context (vLLM's message), and a request whose KV could never fit one instance (the policy
would reject it on arrival; the same rule as ``core.planning.admission_error``). Defaults
follow vLLM: ``max_tokens`` 16 for completions and the rest of the context for chat;
sampling defaults from the checkpoint's ``generation_config.json``, else OpenAI's
(temperature 1, top_p 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.core.kv_blocks import BlockManager
from servelab.core.request import SLO
from servelab.engine.sampling import SamplingParams
from servelab.server.chat import ChatTemplate
from servelab.server.errors import APIError
from servelab.server.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields

DEFAULT_COMPLETION_TOKENS = 16


@dataclass(frozen=True, slots=True)
class Prepared:
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    priority: int
    slo: SLO | None
    stream: bool
    include_usage: bool


class Translator:
    def __init__(self, loaded, engine, model_name: str, chat_template: ChatTemplate | None) -> None:
        self.tokenizer = loaded.tokenizer
        self.vocab_size = loaded.config.vocab_size
        self.max_model_len = getattr(engine, "max_model_len", loaded.config.max_position)  # --max-model-len
        self.defaults = loaded.generation
        self.model_name = model_name
        self.chat_template = chat_template
        self.blocks = BlockManager(engine.kv_config)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist (this server serves `{self.model_name}`).",
                           "model", "model_not_found")

    def completion(self, body: CompletionRequest) -> Prepared:
        self.check_model(body.model)
        prompt = body.prompt[0] if isinstance(body.prompt, list) and isinstance(body.prompt[0], (str, list)) \
            else body.prompt
        if isinstance(prompt, str):
            ids = tuple(self.tokenizer.encode(prompt).ids)
        else:
            ids = tuple(prompt)
            bad = next((t for t in ids if t >= self.vocab_size), None)
            if bad is not None:
                raise APIError(400, f"prompt: token id {bad} is outside the vocabulary (size {self.vocab_size})",
                               "prompt")
        return self._prepare(body, ids, body.max_tokens, "prompt")

    def chat(self, body: ChatCompletionRequest) -> Prepared:
        self.check_model(body.model)
        if self.chat_template is None:
            raise APIError(400, "this model has no chat template (tokenizer_config.json chat_template); use "
                                "/v1/completions, or start the server with --chat-template FILE", "messages")
        messages = [{"role": m.role, "content": m.text} | ({"name": m.name} if m.name else {})
                    for m in body.messages]
        text = self.chat_template.render(messages, body.add_generation_prompt)
        ids = tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)
        if not ids:
            raise APIError(400, "messages: the rendered chat prompt is empty", "messages")
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        return self._prepare(body, ids, max_tokens, "messages")

    def _prepare(self, body: SamplingFields, ids: tuple[int, ...], max_tokens: int | None, where: str) -> Prepared:
        num_prompt = len(ids)
        if max_tokens is None:
            max_tokens = (DEFAULT_COMPLETION_TOKENS if where == "prompt" else self.max_model_len - num_prompt)
        if num_prompt + max_tokens > self.max_model_len or max_tokens < 1:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                                f"requested {num_prompt + max(max_tokens, 0)} tokens ({num_prompt} in the {where}, "
                                f"{max(max_tokens, 0)} for the completion). Please reduce the length of the {where} "
                                f"or max_tokens.", where, "context_length_exceeded")
        blocks = self.blocks
        need, usable = blocks.blocks_for(num_prompt + max_tokens), blocks.num_gpu_blocks - blocks.watermark_blocks
        if need > usable:
            raise APIError(400, f"max_tokens: {num_prompt}+{max_tokens} tokens need {need} KV blocks; an instance "
                                f"of this server has {usable} usable (reduce max_tokens or the {where})", "max_tokens")
        return Prepared(ids, self._params(body, max_tokens), body.priority, _slo(body),
                        body.stream, bool(body.stream_options and body.stream_options.include_usage))

    def _params(self, body: SamplingFields, max_tokens: int) -> SamplingParams:
        d = self.defaults
        temperature = body.temperature if body.temperature is not None else (
            d.temperature if d.temperature is not None else 1.0)
        top_p = body.top_p if body.top_p is not None else (d.top_p if d.top_p is not None else 1.0)
        top_k = body.top_k if body.top_k is not None else (d.top_k or 0)
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        try:
            return SamplingParams(temperature=float(temperature), top_k=max(top_k, 0), top_p=float(top_p),
                                  seed=body.seed, max_tokens=max_tokens, stop=stop,
                                  stop_token_ids=tuple(body.stop_token_ids or ()), ignore_eos=body.ignore_eos)
        except (ValueError, TypeError) as e:  # the checkpoint's defaults can be out of range too
            raise APIError(400, f"sampling parameters: {e}") from None


def _slo(body: SamplingFields) -> SLO | None:
    s = body.slo
    if s is None or (s.ttft_s is None and s.tpot_s is None and s.tbt_s is None):
        return None
    return SLO(ttft_s=s.ttft_s, tpot_s=s.tpot_s, tbt_s=s.tbt_s)
