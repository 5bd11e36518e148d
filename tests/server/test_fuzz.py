"""Schemathesis on the app's own OpenAPI schema, against a live server: no 5xx, ever.

Bounded: a fixed number of generated cases per operation (schemathesis' default mix of valid
and invalid bodies), derandomised, on a model of 256 positions, so the valid ones that run
finish quickly. (Driven through hypothesis directly: schemathesis' pytest fixture loader does
not work with this pytest.)
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

MAX_EXAMPLES = 40


def test_no_server_errors(start_server, kv_in_use):
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
            case.validate_response(response, checks=[not_a_server_error])

        check()
    assert server.service.alive  # the engine thread survived every body
    assert {200, 400} <= seen["/v1/completions"] and {200, 400} <= seen["/v1/chat/completions"]  # both kinds tried
    server.stop()
    assert kv_in_use(server.service) == 0
