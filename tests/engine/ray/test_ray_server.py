"""``servelab serve --backend ray``: the OpenAI server over instance actors streams the greedy
tokens that the in-process server gives, and stops cleanly (no request left, actors gone)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

ray = pytest.importorskip("ray")

from servelab.engine.cluster import EngineConfig  # noqa: E402
from servelab.engine.loader import load_checkpoint  # noqa: E402
from servelab.engine.ray_backend import RayConfig  # noqa: E402
from servelab.server.run import ServerConfig, ServerThread  # noqa: E402

ENGINE = EngineConfig(kv_budget_bytes=8 << 20, block_size=4, max_num_seqs=16)
PROMPTS = ["Natalia sold clips to", "Weng earns 12 an hour", "Betty is saving money for", "James writes a letter"]


def _completions(checkpoint, loaded, **kwargs) -> list[str]:
    config = ServerConfig(model=checkpoint, port=0, served_model_name="tiny", engine=ENGINE, policy="distserve",
                          num_instances=2, **kwargs)
    server = ServerThread(config, loaded, start_timeout_s=120).__enter__()
    try:
        def complete(prompt: str) -> str:
            r = httpx.post(server.base_url + "/v1/completions", timeout=120,
                           json={"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            return list(pool.map(complete, PROMPTS))
    finally:
        server.stop(timeout_s=60)
        assert not server.thread.is_alive()
        server.service.engine.close()


def test_the_server_on_ray_actors_answers_as_the_in_process_one(ray_session, make_checkpoint):
    checkpoint = make_checkpoint()
    loaded = load_checkpoint(checkpoint)
    local = _completions(checkpoint, loaded)
    on_ray = _completions(checkpoint, loaded, backend="ray", ray_config=RayConfig())
    assert on_ray == local and all(local)
