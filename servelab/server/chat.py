"""The checkpoint's chat template: ``chat_template`` from ``tokenizer_config.json`` (HF Jinja).

Rendered as transformers renders it (a sandboxed Jinja environment with ``trim_blocks`` and
``lstrip_blocks``, ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token`` and
``raise_exception``), then tokenised without adding special tokens, since the template writes
them. A checkpoint without a template has no chat endpoint (400, as vLLM), unless the server
is given one (``--chat-template FILE``): guessing a format would be a silently wrong prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

from servelab.core.errors import UserError
from servelab.server.errors import APIError


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        try:
            self.template = env.from_string(source)
        except TemplateError as e:
            raise UserError(f"chat template does not compile: {e}") from None
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        from jinja2 import TemplateError

        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateError as e:  # the template's own raise_exception, or a message it cannot render
            raise APIError(400, f"messages: the chat template rejected them ({e})", "messages") from None


def _raise(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)


def _token_text(value) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older tokenizer configs
        value = value.get("content", "")
    return value if isinstance(value, str) else ""


def load_chat_template(model_dir: Path, override: Path | None = None) -> ChatTemplate | None:
    """The template to use, or None when the checkpoint has none and none was given."""
    path = Path(model_dir) / "tokenizer_config.json"
    config = {}
    if path.is_file():
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise UserError(f"{path}: unreadable ({type(e).__name__})") from None
        if not isinstance(config, dict):
            raise UserError(f"{path}: expected a JSON object")
    if override is not None:
        try:
            source = Path(override).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--chat-template {override}: cannot read ({type(e).__name__})") from None
    else:
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: [{"name": "default", "template": ...}]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if not isinstance(source, str) or not source:
            return None
    return ChatTemplate(source, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))
