"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}`` with a 4xx status.

Everything a client can get wrong ends here, with the field or the limit named, so the
official clients raise their typed errors (``BadRequestError``, ``NotFoundError``, ...) and a
bad request never reaches the engine. A 5xx is left for the server's own faults (the engine
thread died) and for a shutdown (503).
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 503: "service_unavailable"}


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


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """FastAPI's validation errors as one line naming the first bad field, and that field."""
    if not errors:
        return "invalid request body", None
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    # a union reports each alternative (e.g. prompt.str, prompt.list[int]); the field is the first part
    field = loc[0] if loc else None
    where = ".".join(loc) if loc else "body"
    if first.get("type") == "json_invalid":
        return f"invalid JSON body: {first.get('msg', '')}".strip(), None
    message = f"{where}: {first.get('msg', 'invalid value')}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return message, field
