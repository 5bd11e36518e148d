"""Servers for the tests: one tiny checkpoint (256 positions, so every generation is short),
loaded once, and live servers on free loopback ports, started and stopped by the fixtures."""

from __future__ import annotations

import pytest
import torch

from servelab.engine.cluster import EngineConfig
from servelab.engine.loader import load_checkpoint
from servelab.engine.tiny_model import gsm8k_texts, make_tiny_model, train_tokenizer
from servelab.server.run import ServerConfig, ServerThread

SMALL_ENGINE = EngineConfig(kv_budget_bytes=8 << 20, block_size=4, max_num_seqs=64)


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    tokenizer = train_tokenizer(gsm8k_texts(limit=3000), vocab_size=512)
    return make_tiny_model(tmp_path_factory.mktemp("srv-ckpt"), tokenizer=tokenizer, max_position=256)


@pytest.fixture(scope="session")
def loaded(checkpoint):
    return load_checkpoint(checkpoint)


@pytest.fixture
def start_server(checkpoint, loaded):
    """start_server(**ServerConfig fields) -> a running ServerThread (stopped after the test)."""
    started = []

    def start(**kwargs) -> ServerThread:
        kwargs.setdefault("engine", SMALL_ENGINE)
        config = ServerConfig(model=checkpoint, port=0, served_model_name="tiny", **kwargs)
        server = ServerThread(config, loaded).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop(timeout_s=30)
        assert not server.thread.is_alive()


@pytest.fixture(scope="session")
def kv_in_use():
    """kv_in_use(service) -> KV blocks held over every instance."""
    def count(service) -> int:
        cluster = service.cluster
        return sum(cluster.drivers[i].runtime.blocks.num_used_gpu_blocks for i in cluster.active)

    return count
