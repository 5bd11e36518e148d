"""Builders for metrics tests: ended requests with hand-chosen token times."""

from __future__ import annotations

from servelab.core.request import SLO, Request, RequestSpec, RequestStatus


def build_request(request_id: int, arrival_s: float, token_times_s: list[float], *,
                  status: RequestStatus = RequestStatus.FINISHED, reason: str = "length",
                  first_scheduled_s: float | None = None, slo: SLO | None = None,
                  num_prompt_tokens: int = 8, instance_id: int = 0) -> Request:
    spec = RequestSpec(request_id, arrival_s, num_prompt_tokens, max(len(token_times_s), 1), slo=slo)
    req = Request(spec)
    req.token_times_s = list(token_times_s)
    req.num_generated_tokens = len(token_times_s)
    req.instance_id = instance_id
    req.first_scheduled_time_s = first_scheduled_s if first_scheduled_s is not None else (
        arrival_s if token_times_s else None)
    if status.is_terminal:
        end = token_times_s[-1] if token_times_s else arrival_s
        req.finish(status, end, reason)
    else:
        req.status = status
    return req
