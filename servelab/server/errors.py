"""OpenAI-style errors, in one place: ``{"error": {"message", "type", "param", "code"}}`` with a 4xx.

Everything a client can get wrong ends here, with the field and the rule it broke in one
readable line, so the official clients raise their typed errors (``BadRequestError``,
``NotFoundError``, ...) and a bad request never reaches the engine. A 5xx is left for the
server's own faults (the engine thread died) and for a shutdown (503).

A body that fails validation is a 400, as vLLM answers it (FastAPI's default is 422; the
OpenAPI document says 400 too, see ``app.py``). ``rule(text)`` is how a request model states
a rule in words (``prompt: must not be empty``) instead of pydantic's per-alternative dump;
``validation_message`` turns any other pydantic error into ``field: what is wrong, got X``.
New request options (issue 31: n > 1, logprobs, list prompts) add their rules the same way.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic_core import PydanticCustomError

from servelab.core.errors import shown

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 503: "service_unavailable"}
_DESCRIPTIONS = {400: "Invalid request: the message names the field and the rule it breaks",
                 401: "Missing or wrong API key", 404: "Unknown model",
                 500: "The engine failed", 503: "The engine is not running, or the server is shutting down"}
RULE = "servelab_rule"  # the pydantic error type of ``rule``


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error object, as every 4xx and 5xx of this server carries it."""

    error: ErrorDetail


def error_responses(*statuses: int) -> dict:
    """``responses=`` for a FastAPI route: each status documented with the error object."""
    return {s: {"model": ErrorResponse, "description": _DESCRIPTIONS.get(s, "Error")} for s in statuses}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error" if status >= 500 else
                                                             "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers or None)


def rule(text: str) -> PydanticCustomError:
    """A broken rule of a request field, in words (raise it from a field validator)."""
    return PydanticCustomError(RULE, "{rule}", {"rule": text})


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """Pydantic's errors as one line naming the first bad field and the rule, and that field's
    path (OpenAI's ``param``).

    A union (``prompt``: text, token ids, a list of one prompt) reports one error per
    alternative; the one that applies is the one that is not a plain type mismatch, and the
    others are not problems of their own.
    """
    if not errors:
        return "invalid request body", None
    if errors[0].get("type") == "json_invalid":
        return f"invalid JSON body: {errors[0].get('msg', '')}".strip(), None
    by_field: dict[str, list[dict]] = {}
    for err in errors:
        by_field.setdefault(_path(err.get("loc", ())), []).append(err)
    where, group = next(iter(by_field.items()))
    err = next((e for e in group if e.get("type") == RULE), None) \
        or next((e for e in group if not str(e.get("type", "")).endswith("_type")), group[0])
    if err.get("type") == RULE:
        message = f"{where}: {err['msg']}"
    elif err.get("type") == "missing":
        message = f"{where}: required"
    elif all(str(e.get("type", "")).endswith("_type") for e in group) and len(group) > 1:
        message = f"{where}: none of its accepted forms matches, got {_json_type(err.get('input'))}"
    else:
        text = str(err.get("msg", "invalid value"))
        text = text.removeprefix("Value error, ").replace(" after validation", "")
        message = f"{where}: {text[:1].lower() + text[1:]}, got {shown(err.get('input'))}"
    others = [f for f in by_field if f != where]
    if others:
        message += f" (also wrong: {', '.join(others[:3])}{', ...' if len(others) > 3 else ''})"
    return message, (where if where != "body" else None)


def _path(loc: tuple) -> str:
    """``('body', 'messages', 0, 'content', 'list[TextPart]')`` -> ``messages[0].content``: union
    tags (a type name pydantic puts in the path) dropped, list indices in brackets."""
    out = ""
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_union_tag(str(part)):
            out += f".{part}" if out else str(part)
    return out or "body"


def _is_union_tag(part: str) -> bool:
    return any(c in part for c in "[]-") or part in ("str", "int", "float", "bool", "list", "dict", "none")


def _json_type(value: object) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "a list",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)
