"""DynaServe on the real engine (two instances in one process, real KV copies): a request split
inside its prefill and one split inside its decode give the greedy tokens of running alone,
and the dynamic router (its profile tables learnt from measured steps) does too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine_pairs import GREEDY, MAX_TOKENS, assert_tokens_of_running_alone, engine_config  # noqa: E402

from servelab.core.request import RequestSpec, RequestStatus  # noqa: E402
from servelab.engine.cluster import EngineCluster  # noqa: E402

FIXED = "dynaserve:split=fixed,pairing=fixed,min_segment_tokens=0,margin_tokens=0"


@pytest.mark.parametrize("fraction, stream", [(-0.5, 0), (-0.5, 4), (0.5, 0), (0.5, 4)],
                         ids=["in-prefill-bulk", "in-prefill-streamed", "in-decode-bulk", "in-decode-streamed"])
def test_a_split_anywhere_gives_the_tokens_of_running_alone(tiny_engine, burst_specs, alone_tokens, fraction, stream):
    router = f"{FIXED},decode_fraction={fraction},stream_kv_tokens={stream},stream_decode_splits=true"
    engine = EngineCluster(tiny_engine[0], "dynaserve:fallback_budget=8", engine_config(tiny_engine[0]),
                           num_instances=2, router=router)
    res = engine.run(burst_specs, GREEDY)
    assert_tokens_of_running_alone(res, alone_tokens)
    assert {r.num_transfers for r in res.requests} == {1}  # every request crossed once, at its split
    assert len(res.transfers) == len(burst_specs)


def test_the_dynamic_router_on_the_engine_gives_the_same_tokens(tiny_engine, burst_specs, alone_tokens):
    engine = EngineCluster(tiny_engine[0], "dynaserve:fallback_budget=16", engine_config(tiny_engine[0]),
                           num_instances=2, router="dynaserve:min_segment_tokens=2")
    again = [RequestSpec(100 + s.request_id, 0.05 + 0.001 * s.request_id, s.num_prompt_tokens, MAX_TOKENS,
                         prompt_token_ids=s.prompt_token_ids) for s in burst_specs]
    res = engine.run(burst_specs + again, GREEDY)
    assert all(r.status is RequestStatus.FINISHED for r in res.requests)
    outputs = {r.request_id: r.output_token_ids for r in res.requests}
    assert all(outputs[i] == alone_tokens[i] and outputs[100 + i] == alone_tokens[i] for i in alone_tokens)
    assert any(r.num_transfers for r in res.requests)
