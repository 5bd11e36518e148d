"""Server mode: requests submitted while the cluster driver runs, aborts, and shutdown."""

from __future__ import annotations

import queue
import threading
import time

from servelab.core.request import RequestSpec, RequestStatus
from servelab.engine.cluster import EngineCluster, EngineConfig
from servelab.engine.loader import load_checkpoint
from servelab.engine.sampling import SamplingParams


def test_submit_abort_and_shutdown(make_checkpoint, prompts):
    loaded = load_checkpoint(make_checkpoint())
    engine = EngineCluster(loaded, "vllm", EngineConfig(kv_budget_bytes=8 << 20, block_size=4), num_instances=2)
    params = {i: SamplingParams(max_tokens=4 if i < 3 else 2000, ignore_eos=True) for i in range(5)}
    cluster, states = engine.build(lambda spec: params[spec.request_id])
    inbox, stop, seen = queue.Queue(), threading.Event(), {}
    thread = threading.Thread(target=cluster.serve, args=(inbox, stop), daemon=True)
    thread.start()
    for i in range(5):
        inbox.put(("submit", RequestSpec(i, 0.0, len(prompts[i]), 4, prompt_token_ids=tuple(prompts[i])),
                   lambda req: seen.__setitem__(req.request_id, req)))
    deadline = time.monotonic() + 60
    while not all(i in seen and seen[i].status.is_terminal for i in range(3)) and time.monotonic() < deadline:
        time.sleep(0.01)
    inbox.put(("abort", 3, "client disconnected"))
    while not seen[3].status.is_terminal and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()  # request 4 is still generating: shutdown ends it with a reason
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert [seen[i].status for i in range(3)] == [RequestStatus.FINISHED] * 3
    assert all(seen[i].num_generated_tokens == 4 for i in range(3))
    assert (seen[3].status, seen[3].finish_reason) == (RequestStatus.ABORTED, "client disconnected")
    assert (seen[4].status, seen[4].finish_reason) == (RequestStatus.ABORTED, "server shutting down")
    assert all(cluster.drivers[i].runtime.blocks.num_used_gpu_blocks == 0 for i in cluster.active)
