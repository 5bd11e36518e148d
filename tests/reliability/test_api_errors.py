"""Bad values given through the Python API (a ClusterConfig built by hand, catalog lookups,
engine and sampling options) are ``UserError``s naming the value, as on the CLI."""

from __future__ import annotations

import pytest

from servelab.catalog import get_gpu, get_model
from servelab.catalog.instance import InstanceSpec, kv_budget_bytes
from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.presets import cluster_for
from servelab.core.errors import UnknownNameError, UserError
from servelab.core.policy import POLICIES
from servelab.core.registry import RegistryError
from servelab.simulator import simulate


def test_unknown_catalog_names_are_user_errors_and_still_key_errors():
    for lookup, name in ((get_gpu, "B300"), (get_model, "Llama-9-1T")):
        with pytest.raises(UnknownNameError) as caught:
            lookup(name)
        assert isinstance(caught.value, KeyError) and isinstance(caught.value, UserError)
        assert str(caught.value).startswith(f"unknown {'GPU' if lookup is get_gpu else 'model'} '{name}'; known: ")


def test_hand_built_cluster_errors_name_the_value():
    with pytest.raises(UserError, match="unknown GPU 'B300'"):
        simulate([], ClusterConfig(groups=(InstanceGroup(gpu="B300"),)))
    with pytest.raises(UserError, match="InstanceGroup.count must be >= 1, got 0"):
        InstanceGroup(count=0)
    with pytest.raises(UserError, match="host_kv_gb must be >= 0, got nan"):
        InstanceGroup(host_kv_gb=float("nan"))
    with pytest.raises(UserError, match="max_model_len must be >= 2, got 1"):
        ClusterConfig(max_model_len=1)
    with pytest.raises(UserError, match="weights .* do not fit in 1 x A100-40GB"):
        kv_budget_bytes(InstanceSpec("A100-40GB", "Llama-2-13B", memory_reserve_fraction=0.9))
    with pytest.raises(UserError, match="tp and pp must be >= 1"):
        InstanceSpec("A100-80GB", "Llama-2-7B", tp=0)


def test_unknown_policy_lists_presets_not_internal_building_blocks():
    with pytest.raises(RegistryError) as caught:
        cluster_for("fastest")
    known = str(caught.value).split("known: ")[1].split(", ")
    assert {"distserve", "bucketserve-pd", "multibin", "vllm", "static"} <= set(known)
    assert "multibin_replica" not in known and "multibin_replica" not in POLICIES.names()
    assert POLICIES.create("multibin_replica") is not None  # hidden, still built by the multibin preset
    assert "multibin_replica" in POLICIES.names(include_hidden=True)


@pytest.mark.parametrize("preset", ["distserve", "bucketserve-pd"])
def test_preset_num_prefill_is_read_as_an_int_parameter(preset):
    with pytest.raises(RegistryError, match=f"preset '{preset}' parameter 'num_prefill': input should be a valid "
                                            "integer, got 'abc'"):
        cluster_for(f"{preset}:num_prefill=abc", num_instances=3)
    cluster = cluster_for(f"{preset}:num_prefill=2", num_instances=3)
    assert [(g.role, g.count) for g in cluster.groups] == [("prefill", 2), ("decode", 1)]


def test_engine_and_sampling_options_are_user_errors():
    pytest.importorskip("torch")
    from servelab.engine.cluster import EngineConfig
    from servelab.engine.sampling import SamplingParams

    for kwargs, message in (({"block_size": 0}, "engine block_size must be >= 1, got 0"),
                            ({"on_overflow": "drop"}, "engine on_overflow must be one of reject, truncate"),
                            ({"max_model_len": 1}, "engine max_model_len must be >= 2, got 1"),
                            ({"watermark": 1.0}, "engine watermark must be in [0, 1), got 1.0")):
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            EngineConfig(**kwargs)
    for kwargs, message in (({"temperature": -1.0}, "sampling temperature must be >= 0"),
                            ({"top_p": 0.0}, "sampling top_p must be in"), ({"max_tokens": 0}, "sampling max_tokens"),
                            ({"stop": ("",)}, "sampling stop strings must be non-empty")):
        with pytest.raises(UserError, match=message):
            SamplingParams(**kwargs)
