import pytest

from servelab.core.policy import POLICIES
from servelab.core.registry import RegistryError, parse_name_params


def test_baselines_are_registered():
    assert {"vllm", "sarathi", "static", "sjf", "ljf", "priority"} <= set(POLICIES.names())


def test_params_are_typed_and_validated():
    name, params = parse_name_params("sarathi:token_budget=256,preemption=swap")
    policy = POLICIES.create(name, params)
    assert policy.config.token_budget == 256 and policy.config.preemption == "swap"
    with pytest.raises(RegistryError, match="unknown parameter"):
        POLICIES.create("sarathi", {"budget": "1"})
    with pytest.raises(RegistryError, match="parameter .token_budget.: input should be a valid integer"):
        POLICIES.create("sarathi", {"token_budget": "lots"})
    with pytest.raises(RegistryError, match="unknown policy"):
        POLICIES.get("nope")
