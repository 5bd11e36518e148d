"""The ASGI app: OpenAI routes over an ``EngineService``, plus /health and /metrics.

A request is validated (pydantic, then ``Translator``'s limits) before it is submitted, so
bad input is a 4xx with an OpenAI error body: a body that fails validation is a 400, as vLLM
answers it, and the OpenAPI document (``/openapi.json``) says so, with the error object's
schema, instead of FastAPI's default 422; ``/metrics`` is documented as the Prometheus text it
is, and a 405 names the allowed methods (``Allow``). Once submitted, the handler waits for the
request's first event before answering, so a request the engine refuses on arrival is a 4xx
too, and a stream's headers go out with its first token. While it waits (and while a
non-streaming request runs) the client's connection is polled; a client that goes away
aborts its request, which frees its KV. During a stream, Starlette cancels the generator on
disconnect and the ``finally`` aborts the request the same way.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from servelab.core.request import RequestStatus
from servelab.server.errors import APIError, error_response, error_responses, validation_message
from servelab.server.metrics import openai_finish_reason
from servelab.server.responses import DONE, ResponseBuilder, sse_error
from servelab.server.schemas import ChatCompletionRequest, CompletionRequest
from servelab.server.service import SHUTDOWN_REASON, Delta, EngineService, RequestStream
from servelab.server.translate import Prepared, Translator

DISCONNECT_POLL_S = 0.25


def build_app(service: EngineService, translator: Translator, *, api_key: str | None = None,
              shutdown_grace_s: float = 5.0) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if not service.thread.is_alive() and service.failed is None:
            service.start()
        yield
        await asyncio.to_thread(service.shutdown, shutdown_grace_s)

    app = FastAPI(title="servelab", summary="OpenAI-compatible server on the servelab engine", lifespan=lifespan)
    _error_handlers(app)

    async def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')")

    keyed = (401,) if api_key is not None else ()
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)], responses=error_responses(*keyed))
    event = {"type": "object", "required": ["data"],  # one server-sent event: a chunk's JSON, or [DONE]
             "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}
    generation = {**error_responses(400, 404, 500, 503),
                  200: {"description": "The completion (JSON), or with stream=true its server-sent events",
                        "content": {"application/json": {}, "text/event-stream": {"schema": event}}}}

    created = int(time.time())  # when this server started serving the model (OpenAI: a Unix time)

    @v1.get("/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": service.model_name, "object": "model", "created": created,
                                            "owned_by": "servelab", "root": str(service.engine.loaded.path),
                                            "max_model_len": translator.max_model_len}]}

    @v1.post("/completions", response_model=None, responses=generation)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _respond(service, translator.completion(body), False, request)

    @v1.post("/chat/completions", response_model=None, responses=generation)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _respond(service, translator.chat(body), True, request)

    app.include_router(v1)

    @app.get("/health", responses=error_responses(503))
    async def health() -> Response:
        if not service.alive:
            return error_response(503, f"engine not running{': ' + service.failed if service.failed else ''}")
        return JSONResponse({})

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={200: {"description": "Prometheus text exposition format"}})
    async def metrics() -> Response:
        return Response(await asyncio.to_thread(service.metrics.render), media_type=CONTENT_TYPE_LATEST)

    _document_400(app)
    return app


def _document_400(app: FastAPI) -> None:
    """The OpenAPI document with the validation answer this server gives (400 and the error
    object, documented on each route) in place of FastAPI's 422 and its schemas."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> Response:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> Response:
        message, param = validation_message(list(exc.errors()))
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        allowed = (exc.headers or {}).get("Allow")  # a 405 names the methods the path takes
        message = f"{exc.detail}: {request.method} {request.url.path}" + (f" (allowed: {allowed})" if allowed else "")
        return error_response(exc.status_code, message, headers=exc.headers)


async def _next(stream: RequestStream, request: Request) -> Delta | None:
    """The stream's next event, or None when the client went away first."""
    while True:
        try:
            return await asyncio.wait_for(stream.queue.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                return None


def _refusal(delta: Delta) -> APIError:
    """A request that ended before it produced anything, as an HTTP error."""
    if delta.error is not None:
        return APIError(500, f"engine failed: {delta.error}")
    req = delta.request
    if req.status is RequestStatus.REJECTED:
        return APIError(400, f"request rejected: {req.finish_reason}")
    return APIError(503 if req.finish_reason == SHUTDOWN_REASON else 500, f"request aborted: {req.finish_reason}")


async def _respond(service: EngineService, prepared: Prepared, chat: bool, request: Request) -> Response:
    if not service.accepting or service.exiting():
        raise APIError(503, "server shutting down")
    if not service.alive:
        raise APIError(503, f"engine not running{': ' + service.failed if service.failed else ''}")
    stream = service.submit(prepared.prompt_ids, prepared.params, priority=prepared.priority, slo=prepared.slo)
    builder = ResponseBuilder(stream.request_id, service.model_name, chat)
    ended = False
    try:
        first = await _next(stream, request)
        if first is None:
            return Response(status_code=499)  # nobody is listening; the finally aborts the request
        if first.is_final and (first.error is not None or first.request.status is not RequestStatus.FINISHED):
            ended = True
            raise _refusal(first)
        if prepared.stream:
            ended = True  # the generator owns the request from here
            return StreamingResponse(_events(service, stream, builder, first, prepared.include_usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        delta = first
        while not delta.is_final:
            delta = await _next(stream, request)
            if delta is None:
                return Response(status_code=499)
        ended = True
        if delta.error is not None or delta.request.status is not RequestStatus.FINISHED:
            raise _refusal(delta)
        return JSONResponse(builder.full(delta.request, delta.final_text))
    finally:
        if not ended:
            service.abort(stream.request_id)


async def _events(service: EngineService, stream: RequestStream, builder: ResponseBuilder, delta: Delta,
                  include_usage: bool):
    ended = False
    try:
        if builder.chat:
            yield builder.chunk("", role=True)
        while True:
            if delta.error is not None:
                ended = True
                yield sse_error(f"engine failed: {delta.error}", 500)
                break
            req = delta.request
            if req is not None:
                ended = True
                yield builder.chunk(delta.text, openai_finish_reason(req))
                if req.status is not RequestStatus.FINISHED:
                    yield sse_error(f"request {req.status.value}: {req.finish_reason}",
                                    503 if req.finish_reason == SHUTDOWN_REASON else 400)
                if include_usage:
                    yield builder.usage_chunk(req)
                break
            yield builder.chunk(delta.text)
            delta = await stream.queue.get()
        yield DONE
    finally:
        if not ended:
            service.abort(stream.request_id)
