"""Cluster presets: how a policy name from the CLI becomes a whole cluster.

Most policies run on every instance of a homogeneous cluster behind a least-loaded router.
Designs that shape the cluster itself (DistServe's prefill/decode split, BucketServe's P/D
pools, Multi-Bin's central batch queue) register a preset builder from their own module, so the CLI
and the API stay one line: ``cluster_for("distserve", num_instances=4, gpu=..., model=...)``.
"""

from __future__ import annotations

from typing import Any, Callable

from servelab.cluster.config import ClusterConfig, InstanceGroup, default_link
from servelab.costmodel.links import LinkSpec
from servelab.core.registry import RegistryError, coerce_param, parse_name_params

PresetBuilder = Callable[[int, dict[str, Any], dict[str, Any], LinkSpec], ClusterConfig]
PRESETS: dict[str, PresetBuilder] = {}


def register_preset(name: str):
    def decorate(fn: PresetBuilder) -> PresetBuilder:
        PRESETS[name] = fn
        return fn

    return decorate


def cluster_for(policy_spec: str, *, num_instances: int = 1, link: LinkSpec | None = None,
                **group: Any) -> ClusterConfig:
    """``policy_spec`` is ``name[:key=value,...]``; ``group`` holds InstanceGroup fields (gpu, model, tp...)."""
    _load_preset_modules()
    name, params = parse_name_params(policy_spec)
    if num_instances < 1:
        raise RegistryError(f"num_instances must be >= 1, got {num_instances}")
    builder = PRESETS.get(name)
    link = link or default_link()
    if builder is not None:
        return builder(num_instances, params, group, link)
    from servelab.core.policy import POLICIES

    if not POLICIES.has(name):
        known = ", ".join(sorted(set(POLICIES.names()) | set(PRESETS)))
        raise RegistryError(f"unknown policy {name!r}; known: {known}")
    router = "least_loaded" if num_instances > 1 else "round_robin"
    return ClusterConfig(groups=(InstanceGroup(count=num_instances, policy=name, policy_params=params, **group),),
                         router=router, link=link)


def pd_cluster(name: str, policy: str, num_instances: int, params: dict[str, Any], group: dict[str, Any],
                link: LinkSpec) -> ClusterConfig:
    """Prefill and decode pools (half each by default, ``num_prefill`` to choose) behind the
    ``distserve`` router, which hands each request over with its KV after the first token."""
    if num_instances < 2:
        raise RegistryError(f"{name} needs at least 2 instances (prefill + decode)")
    params = dict(params)
    num_prefill = coerce_param(params.pop("num_prefill", (num_instances + 1) // 2), int,
                               f"preset {name!r} parameter 'num_prefill'")
    if not 1 <= num_prefill < num_instances:
        raise RegistryError(f"{name}: num_prefill must be in [1, {num_instances - 1}], got {num_prefill}")
    return ClusterConfig(groups=(
        InstanceGroup(count=num_prefill, role="prefill", policy=policy, policy_params=params, **group),
        InstanceGroup(count=num_instances - num_prefill, role="decode", policy=policy, policy_params=params, **group),
    ), router="distserve", link=link)


def _load_preset_modules() -> None:
    """Designs and baselines register presets in their own modules; loading the registries
    imports them."""
    from servelab.core.policy import ROUTERS

    ROUTERS.names()
