"""Schemathesis on the app's own OpenAPI schema, against a live server: no 5xx, and every
answer is what the document says (issue 22, item 7): a status it lists for the operation,
its content type, a body matching its schema (the OpenAI error object for 4xx), and no
schema-invalid body accepted. A wrong method is a 405 that names the allowed ones.

Bounded: a fixed number of generated cases per operation (schemathesis' default mix of valid
and invalid bodies), derandomised, on a model of 256 positions, so the valid ones that run
finish quickly (about half a minute in all). (Driven through hypothesis directly:
schemathesis' pytest fixture loader does not work with this pytest.)
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (content_type_conformance, negative_data_rejection, not_a_server_error,
                                 response_schema_conformance, status_code_conformance)

MAX_EXAMPLES = 40
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]


@pytest.mark.slow
def test_the_server_answers_as_its_openapi_document_says(start_server, kv_in_use):
    server = start_server()
    schema = schemathesis.openapi.from_url(server.base_url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"} <= paths
    seen: dict[str, set[int]] = {}
    for op in operations:
        @given(case=op.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                  derandomize=True, database=None)
        def check(case) -> None:
            response = case.call(timeout=60)
            seen.setdefault(op.path, set()).add(response.status_code)
            case.validate_response(response, checks=CHECKS)

        check()
    assert server.service.alive  # the engine thread survived every body
    assert {200, 400} <= seen["/v1/completions"] and {200, 400} <= seen["/v1/chat/completions"]  # both kinds tried
    server.stop()
    assert kv_in_use(server.service) == 0


def test_the_document_lists_400_not_422_and_metrics_as_text(start_server):
    server = start_server(api_key="KEY")
    doc = httpx.get(server.base_url + "/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = doc["paths"][path]["post"]["responses"]
        assert "422" not in responses and {"200", "400", "401"} <= set(responses)
        assert responses["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    metrics = httpx.get(server.base_url + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")


def test_a_wrong_method_is_a_405_naming_the_allowed_ones(start_server):
    server = start_server()
    for method, path, allowed in (("DELETE", "/v1/completions", "POST"), ("GET", "/v1/chat/completions", "POST"),
                                  ("POST", "/health", "GET"), ("PUT", "/metrics", "GET")):
        response = httpx.request(method, server.base_url + path)
        assert response.status_code == 405 and response.headers["allow"] == allowed, (method, path)
        assert response.json()["error"]["message"] == f"Method Not Allowed: {method} {path} (allowed: {allowed})"
