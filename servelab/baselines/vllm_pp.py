"""vLLM with pipeline parallelism (the KunServe paper's ``vLLM (PP)``): instances are paired
from the start into static two-stage pipelines, each stage holding half the layers, so each
GPU frees half its parameter memory for KV, at the cost of pipelined execution.

The ``vllm-pp`` router forms the pairs on the first arrival (``SetLayers`` + ``FormPipeline``;
an odd instance out stays whole) and then dispatches as Llumnix does (the most remaining
steps, ``llumnix.least_loaded``). Each pipeline step is scheduled by chunked prefill with a
budget of ``stages x token_budget`` (vLLM runs one virtual engine per stage, each with its own
budget and its own ``max_num_seqs``) and cut into ``num_microbatches`` microbatches by token count (the paper's Fig. 17a token chunking; ``former=rows``: whole rows
dealt by size, so one request's prompt never occupies two microbatches of a step, as vLLM's
virtual engines bind a request to one engine).

vLLM's virtual engines overlap consecutive steps, and so do the groups here by default
(``servelab.cluster.pipeline``: microbatch slot m enters stage 0 when its previous pass has
left the last stage); ``overlap=false`` makes every step fill and drain the pipeline instead.
KunServe's groups run on the same pipeline model, so the comparison between them is even.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servelab.baselines.llumnix import least_loaded, router_preset
from servelab.cluster.config import ClusterConfig
from servelab.cluster.presets import register_preset
from servelab.cluster.reconfig import FormPipeline, SetLayers
from servelab.core.policy import ROUTERS, ClusterState, Placement, Router
from servelab.core.registry import RegistryError, coerce_param
from servelab.core.request import Request
from servelab.costmodel.links import LinkSpec


@dataclass(frozen=True)
class VLLMPPConfig:
    num_stages: int = 2
    num_microbatches: int = 2
    overlap: bool = True  # consecutive steps overlap, as vLLM's virtual engines run them
    # tokens: microbatches of equal token count, a prompt chunk cut between two of them (its
    # second part runs on stage 0 while the first is on stage 1) | rows: whole rows dealt by
    # size, a request's chunk in one microbatch (vLLM's virtual engines: one engine per request)
    former: str = "tokens"

    def __post_init__(self) -> None:
        if self.num_stages < 2 or self.num_microbatches < 1:
            raise ValueError("num_stages must be >= 2 and num_microbatches >= 1")
        if self.former not in ("tokens", "rows"):
            raise ValueError(f"former must be tokens or rows, got {self.former!r}")


@ROUTERS.register("vllm-pp")
class VLLMPPRouter(Router):
    Config = VLLMPPConfig

    def __init__(self, config: VLLMPPConfig = VLLMPPConfig()) -> None:
        self.config = config
        self._formed = False

    def on_arrival(self, now_s: float, request: Request, cluster: ClusterState) -> list:
        actions: list = []
        if not self._formed:
            self._formed = True
            if getattr(cluster, "can_change_layers", False):
                actions += self._pipelines(cluster)
        if actions:  # the groups exist once these are applied: place on the first one
            return actions + [Placement(request, actions[-1].instance_ids[0])]
        return [Placement(request, least_loaded(cluster.instances).instance_id)]

    def _pipelines(self, cluster: ClusterState) -> list:
        from servelab.designs.kunserve.drop_plan import stage_layers
        from servelab.designs.kunserve.microbatch import MicrobatchFormer

        s = self.config.num_stages
        ids = [v.instance_id for v in cluster.instances if len(v.members) == 1]
        layers = cluster.instances[0].spec.model_spec.num_layers
        actions: list = []
        for k in range(len(ids) // s):
            members = tuple(ids[k * s:(k + 1) * s])
            actions += [SetLayers(iid, rng) for iid, rng in zip(members, stage_layers(layers, s))]
            first = cluster.instance(members[0])
            former = MicrobatchFormer("tokens", self.config.num_microbatches) if self.config.former == "tokens" else None
            actions.append(FormPipeline(members, self.config.num_microbatches, former=former,
                                        max_num_seqs=s * first.max_num_seqs, max_batch_tokens=s * first.max_batch_tokens,
                                        overlap=self.config.overlap))
        return actions


@register_preset("vllm-pp")
def _vllm_pp(num_instances: int, params: dict[str, Any], group: dict[str, Any], link: LinkSpec) -> ClusterConfig:
    """Static two-stage pipelines of ``kunserve``-policy instances (chunked prefill whose step budget
    is stages x ``token_budget``) behind the ``vllm-pp`` router. A cluster with fewer instances than
    ``num_stages`` would form no pipeline and run plain chunked prefill under vLLM-PP's name:
    refused."""
    stages = coerce_param(params.get("num_stages", VLLMPPConfig.num_stages), int, "preset 'vllm-pp' parameter "
                          "'num_stages'")
    if num_instances < stages:
        raise RegistryError(f"preset 'vllm-pp' parameter 'num_stages': {stages} pipeline stages need at least "
                            f"{stages} instances, the cluster has {num_instances} (--instances)")
    return router_preset("vllm-pp", "vllm-pp", VLLMPPConfig, "kunserve", params, group, link, num_instances)
