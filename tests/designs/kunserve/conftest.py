"""A small throttled cluster: Qwen-2.5-14B on A800s with most memory reserved, so a few
dozen 2K-token requests overflow the KV cache of two instances."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servelab.cluster.links import TopologyConfig
from servelab.cluster.presets import cluster_for
from servelab.core.request import RequestSpec
from servelab.costmodel.links import LinkSpec

SMALL = {"gpu": "A800-80GB", "model": "Qwen-2.5-14B", "memory_reserve_fraction": 0.6}
RDMA_200G = TopologyConfig(gpus_per_server=1, inter_link=LinkSpec(25e9, 10e-6))


def small_cluster(spec: str, num_instances: int = 2, link_gbps: float = 200.0, **hardware):
    c = cluster_for(spec, num_instances=num_instances, **{**SMALL, **hardware})
    topology = RDMA_200G if link_gbps == 200.0 else replace(RDMA_200G, inter_link=LinkSpec(link_gbps / 8 * 1e9, 10e-6))
    return replace(c, link=None, topology=topology)


def burst(n: int = 40, prompt: int = 2000, output: int = 120, gap_s: float = 0.02, tail: int = 0):
    """``n`` requests ``gap_s`` apart, then ``tail`` light ones a second apart (time to restore)."""
    head = [RequestSpec(i, gap_s * i, prompt + 37 * (i % 5), output) for i in range(n)]
    return head + [RequestSpec(n + k, n * gap_s + 5.0 + k, 200, 20) for k in range(tail)]


@pytest.fixture
def throttling_burst():
    return burst()


@pytest.fixture(name="small_cluster")
def small_cluster_fixture():
    return small_cluster


@pytest.fixture(name="burst")
def burst_fixture():
    return burst
