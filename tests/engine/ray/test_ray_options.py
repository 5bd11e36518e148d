"""The Ray backend's options fail with one line naming the option, before Ray starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from servelab.cli.main import app
from servelab.core.errors import UserError
from servelab.engine.cluster import EngineCluster
from servelab.engine.ray_backend import RayConfig
from servelab.engine.ray_backend.launch import start_ray

runner = CliRunner()


@pytest.mark.parametrize("args, message", [
    (["--ray-address", "auto"], "--ray-address needs --backend ray"),
    (["--backend", "mpi"], "unknown engine backend 'mpi'"),
])
def test_bad_backend_options_are_one_line(make_checkpoint, args, message):
    res = runner.invoke(app, ["generate", "--model", str(make_checkpoint()), "-w", "gsm8k:n=1", *args])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("kwargs, field", [({"kv_transport": "nccl"}, "kv_transport"), ({"num_cpus": 0}, "num_cpus"),
                                           ({"poll_s": 0}, "poll_s"), ({"torch_threads": 0}, "torch_threads"),
                                           ({"address": " "}, "address")])
def test_ray_config_names_the_bad_field(kwargs, field):
    with pytest.raises(UserError, match=field):
        RayConfig(**kwargs)


def test_an_unreachable_cluster_is_refused_in_seconds():
    with pytest.raises(UserError, match="cannot reach the Ray cluster at '127.0.0.1:1'"):
        start_ray(RayConfig(address="127.0.0.1:1"))


def test_engine_cluster_rejects_an_unknown_backend(make_checkpoint):
    with pytest.raises(UserError, match="inprocess, ray"):
        EngineCluster(make_checkpoint(), "vllm", backend="threads")


@pytest.mark.parametrize("resources, n, expected", [
    ({"CPU": 2.0}, 2, {"num_gpus": 0, "num_cpus": 0.5, "device": "cpu", "threads": 1}),
    ({"CPU": 2.0}, 1, {"num_gpus": 0, "num_cpus": 1, "device": "cpu", "threads": 1}),
    ({"CPU": 1.0}, 2, {"num_gpus": 0, "num_cpus": 0.5, "device": "cpu", "threads": 1}),
    ({"CPU": 16.0}, 2, {"num_gpus": 0, "num_cpus": 7, "device": "cpu", "threads": 7}),
    ({"CPU": 16.0, "GPU": 2.0}, 2, {"num_gpus": 1, "num_cpus": 1, "device": "cuda", "threads": 1}),
    ({"CPU": 16.0, "GPU": 1.0}, 2, {"num_gpus": 0.5, "num_cpus": 0, "device": "cuda", "threads": 1}),
    ({"CPU": 16.0, "GPU": 3.0}, 4, {"num_gpus": 0.5, "num_cpus": 0, "device": "cuda", "threads": 1}),
])
def test_actors_take_a_gpu_each_where_ray_sees_enough_and_share_otherwise(resources, n, expected):
    from servelab.engine.ray_backend.launch import placement_for

    assert placement_for(resources, n) == expected


def test_auto_transport_sends_small_kv_by_gloo_and_large_kv_through_the_store():
    from servelab.engine.executor import RequestStates
    from servelab.engine.ray_backend.executor import RayExecutor

    def executor(transport):
        return RayExecutor(None, RequestStates(), 0, transport=transport, rank=0, kv_shape=(1, 2, 8, 1, 1, 1),
                           block_bytes=100, on_dead=lambda *a: None, defer=lambda fn: None, gloo_max_bytes=1000)

    auto = executor("auto")
    assert auto._via_gloo(999) and not auto._via_gloo(1000)
    assert not executor("object_store")._via_gloo(1) and executor("gloo")._via_gloo(10**9)
    with pytest.raises(UserError, match="gloo_max_bytes"):
        RayConfig(gloo_max_bytes=-1)
