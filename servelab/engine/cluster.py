"""The real engine as a cluster: several engine instances of one model in this process.

Each instance has its own paged KV cache (``EngineConfig.kv_budget_bytes`` each) and a
model runner over the shared weights; the same ``ClusterDriver`` that runs the simulator
drives them on the wall clock, with the same policies, routers and presets (``distserve``
makes prefill and decode instances). KV moved by a hand-off or a Move is really copied
between the instances' caches, block by block, and costs what the copy takes.

Instances in one process run one at a time (steps are serialised; a step's time is its real
time), which is exact for one instance and a faithful, slower stand-in for several GPUs;
the Ray backend puts instances in separate processes behind the same driver.

With ``layer_ranges=True`` instances can drop layers, form pipeline groups and
restore, as KunServe does: ``servelab.engine.layer_range`` (the rebuild factory) and
``servelab.engine.pipeline`` (the group's stage-by-stage executor) move the real weights and KV
(on Ray: ``ray_backend.layers``, the stages in the members' actors).

Invariants: every request ends completed, rejected or aborted with a reason; a request whose
prompt plus ``max_tokens`` exceeds ``max_model_len`` (default: the model's positions) is
rejected on arrival, or its prompt truncated with ``on_overflow="truncate"``; after
``run`` every KV block of every instance is free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.cluster.clocks import WallClock
from servelab.cluster.driver import ClusterDriver
from servelab.cluster.kv_pool import ClusterKVPool
from servelab.core.admission import OVERFLOW_MODES, AdmissionConfig
from servelab.core.driver import InstanceDriver
from servelab.core.errors import UserError
from servelab.core.instance import InstanceLimits, InstanceRuntime
from servelab.core.kv_blocks import KVCacheConfig
from servelab.core.limits import MAX_SWAP_SPACE_GB, step_limits_error
from servelab.core.policy import POLICIES, ROUTERS
from servelab.core.registry import parse_name_params
from servelab.core.request import Request, RequestSpec
from servelab.engine.sampling import SamplingParams
from servelab.metrics import MetricsCollector, RequestTable, RunSummary, summarize


BACKENDS = ("inprocess", "ray")  # where instances run: this process, or one Ray actor each


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine sizes and the context rule; a bad value is a ``UserError`` naming the field.
    ``num_host_blocks`` from vLLM's swap space in GiB: ``host_blocks_for(loaded, gib, block_size)``."""

    kv_budget_bytes: int = 256 << 20  # per instance
    block_size: int = 16
    max_batch_tokens: int = 2048
    max_num_seqs: int = 64
    num_host_blocks: int = 0  # host KV pool for swap preemption, per instance; 0 disables swapping
    watermark: float = 0.01
    seed: int = 0  # sampler seed for requests without their own
    max_model_len: int | None = None  # prompt + max_tokens limit at admission; None: the model's positions
    on_overflow: str = "reject"  # or "truncate" the prompt (head and tail kept)
    # the decode attention of the in-process backend's instances (``attention.DECODE_KERNELS``); the
    # Ray and layer-range backends run the runner's default (split-kv) and refuse another
    decode_kernel: str = "split-kv"

    def __post_init__(self) -> None:
        if self.decode_kernel not in ("split-kv", "padded"):  # attention.DECODE_KERNELS (torch-free here)
            raise UserError(f"engine decode_kernel must be split-kv or padded, got {self.decode_kernel!r}")
        if self.kv_budget_bytes < 1:
            raise UserError(f"engine kv_budget_bytes must be >= 1, got {self.kv_budget_bytes}")
        for name in ("block_size", "max_batch_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise UserError(f"engine {name} must be >= 1, got {getattr(self, name)}")
        if (why := step_limits_error(self.max_batch_tokens, self.max_num_seqs)) is not None:
            raise UserError(f"engine {why}")
        if self.num_host_blocks < 0:
            raise UserError(f"engine num_host_blocks must be >= 0, got {self.num_host_blocks}")
        if not 0 <= self.watermark < 1:
            raise UserError(f"engine watermark must be in [0, 1), got {self.watermark}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise UserError(f"engine max_model_len must be >= 2, got {self.max_model_len}")
        if self.on_overflow not in OVERFLOW_MODES:
            raise UserError(f"engine on_overflow must be one of {', '.join(OVERFLOW_MODES)}, got {self.on_overflow!r}")


def host_blocks_for(loaded: Any, swap_space_gb: float, block_size: int) -> int:
    """Host KV blocks that ``swap_space_gb`` GiB hold for this checkpoint (vLLM's swap space)."""
    from servelab.engine.kv_cache import num_blocks_for_budget

    if not 0 <= swap_space_gb <= MAX_SWAP_SPACE_GB:
        raise UserError(f"swap space must be in [0, {MAX_SWAP_SPACE_GB:g}] GiB, got {swap_space_gb}")
    c = loaded.config
    dtype = loaded.model.embed_tokens.weight.dtype if loaded.model is not None else loaded.dtype
    return num_blocks_for_budget(int(swap_space_gb * 2**30), c.num_layers, block_size, c.num_kv_heads, c.head_dim,
                                 dtype)


@dataclass
class EngineResult:
    requests: list[Request]
    texts: dict[int, str]  # output text per request id (cut at a stop string)
    collector: MetricsCollector
    summary: RunSummary
    wall_s: float
    num_used_blocks_after: int  # over all instances
    num_gpu_blocks: int  # over all instances
    transfers: list[tuple[int, int, float, float, float]] | None = None  # (src, dst, start, duration, bytes)
    links: dict[str, dict] | None = None  # per link: busy_s (measured copy time), bytes, jobs (chunks)

    @property
    def num_output_tokens(self) -> int:
        return sum(r.num_generated_tokens for r in self.requests)

    def outputs(self) -> dict[int, list[int]]:
        return {r.request_id: list(r.output_token_ids) for r in self.requests}


class EngineCluster:
    """``num_instances`` engine instances of one checkpoint under a policy (or preset) and router."""

    factory: Any = None

    def __init__(self, model: str | Path | Any, policy_spec: str = "vllm", config: EngineConfig = EngineConfig(), *,
                 num_instances: int = 1, router: str | None = None, dtype: str | None = None, device: str = "auto",
                 kv_pool_bytes: int = 0, backend: str = "inprocess", ray_config: Any = None,
                 ray_workers: Any = None, layer_ranges: bool = False) -> None:
        from servelab.cluster.presets import cluster_for

        if backend not in BACKENDS:
            raise UserError(f"unknown engine backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        self.backend = backend
        self.layer_ranges = layer_ranges  # instances may drop layers and form pipeline groups (KunServe)
        self.ray_config = ray_config  # a ray_backend.RayConfig; None: its defaults
        self._ray_workers = ray_workers  # the actors: made at the first run (or another cluster's), reused
        from servelab.engine.kv_cache import num_blocks_for_budget
        from servelab.engine.loader import load_checkpoint

        self.loaded = load_checkpoint(model, dtype=dtype, device=device) if isinstance(model, (str, Path)) else model
        cluster = cluster_for(policy_spec, num_instances=num_instances)
        self.groups = cluster.instance_groups()
        for g in self.groups:  # fail early on a bad spec
            POLICIES.create(g.policy, dict(g.policy_params))
        if router is not None:
            self.router_name, self.router_params = parse_name_params(router)
        else:
            self.router_name, self.router_params = cluster.router, dict(cluster.router_params)
        ROUTERS.create(self.router_name, dict(self.router_params))
        self.policy_spec = policy_spec
        self.config = config
        self.kv_pool_bytes = kv_pool_bytes
        c = self.loaded.config
        self.kv_dtype = self.loaded.model.embed_tokens.weight.dtype
        num_blocks = num_blocks_for_budget(config.kv_budget_bytes, c.num_layers, config.block_size,
                                           c.num_kv_heads, c.head_dim, self.kv_dtype)
        if num_blocks < 1:
            raise UserError(f"a KV budget of {config.kv_budget_bytes} bytes holds no block of {config.block_size} "
                             f"tokens for this model")
        if config.max_model_len is not None and config.max_model_len > c.max_position:
            raise UserError(f"max_model_len {config.max_model_len} exceeds the model's {c.max_position} positions")
        self.max_model_len = config.max_model_len or c.max_position
        self.kv_config = KVCacheConfig(config.block_size, num_blocks, config.num_host_blocks, config.watermark)
        self.flops_per_token = 2.0 * sum(p.numel() for n, p in self.loaded.model.named_parameters()
                                         if n.startswith("layers.") and p.dim() == 2)
        itemsize = self.loaded.model.embed_tokens.weight.element_size()
        self.kv_bytes_per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * itemsize

    @property
    def num_instances(self) -> int:
        return len(self.groups)

    @property
    def num_gpu_blocks(self) -> int:
        return self.kv_config.num_gpu_blocks

    def run(self, specs: Sequence[RequestSpec], params: SamplingParams | Mapping[int, SamplingParams]
            ) -> EngineResult:
        """Serve every spec; ``params`` is one SamplingParams for all or one per request id."""

        def params_for(spec: RequestSpec) -> SamplingParams:
            if isinstance(params, SamplingParams):
                return params
            try:
                return params[spec.request_id]
            except KeyError:
                raise UserError(f"no SamplingParams for request {spec.request_id}") from None

        for spec in specs:
            params_for(spec)
        cluster, states = self.build(params_for)
        result = cluster.run(specs)
        return self.result_of(cluster, states, result.wall_s, result.transfers, result.links)

    def build(self, params_for, collector: MetricsCollector | None = None) -> tuple[ClusterDriver, Any]:
        """A cluster driver over fresh caches (wall clock, measured transfers), and the shared
        per-request sampling state; ``params_for(spec)`` gives each request's SamplingParams.
        ``run`` uses it for a finite workload, the server for ``ClusterDriver.serve`` (with its
        own ``collector``, a MetricsCollector subclass that also streams request ends)."""
        from servelab.engine.executor import Executor, RequestStates
        from servelab.engine.kv_cache import PagedKVCache
        from servelab.engine.runner import ModelRunner
        from servelab.engine.sampling import Sampler

        loaded, cfg = self.loaded, self.config
        c = loaded.config
        device = loaded.model.embed_tokens.weight.device
        states = RequestStates(tokenizer=loaded.tokenizer, eos_token_ids=loaded.generation.eos_token_ids)
        sampler = Sampler(cfg.seed, device=device)
        collector = collector if collector is not None else MetricsCollector()
        if cfg.decode_kernel != "split-kv" and (self.backend == "ray" or self.layer_ranges):
            raise UserError(f"engine decode_kernel={cfg.decode_kernel} runs on the in-process backend without layer "
                            "ranges only")
        clock, executors = WallClock(), None
        if self.backend == "ray":
            clock, executors = self._ray_executors(states)
        drivers = []
        factory = None
        if self.layer_ranges:
            from servelab.engine.layer_range import EngineFactory

            if executors is not None:  # the Ray backend: weights and caches change in the actors
                from servelab.engine.ray_backend.layers import RayEngineFactory

                factory = RayEngineFactory(self, states, sampler, executors)
            else:
                factory = EngineFactory(self, states, sampler)
        for iid, group in enumerate(self.groups):
            spec = hw = None
            if factory is not None:
                spec = factory.spec(iid)
                hw = factory.hardware(spec)
                executor = factory.executor(hw.cost)
            elif executors is not None:
                executor = executors[iid]
            else:
                cache = PagedKVCache(c.num_layers, self.kv_config.num_gpu_blocks, cfg.block_size, c.num_kv_heads,
                                     c.head_dim, dtype=self.kv_dtype, device=device,
                                     num_host_blocks=cfg.num_host_blocks)
                executor = Executor(ModelRunner(loaded.model, cache, sampler, decode_kernel=cfg.decode_kernel), states)
            runtime = InstanceRuntime(iid, self.kv_config, InstanceLimits(cfg.max_batch_tokens, cfg.max_num_seqs),
                                      group.role)
            drivers.append(InstanceDriver(runtime, POLICIES.create(group.policy, dict(group.policy_params)), executor,
                                          collector, flops_per_token=self.flops_per_token, fast_forward=False,
                                          kv_bytes_per_token=self.kv_bytes_per_token, spec=spec,
                                          cost_model=hw.cost if hw is not None else None))

        def on_arrival(req: Request) -> str | None:
            if req.spec.prompt_token_ids is None:
                return "no prompt_token_ids (the engine needs token ids)"
            states.register(req.request_id, req.spec.prompt_token_ids, params_for(req.spec))
            return None

        pool = ClusterKVPool(self.kv_pool_bytes) if self.kv_pool_bytes else None
        cluster = ClusterDriver(drivers, ROUTERS.create(self.router_name, dict(self.router_params)),
                                clock=clock, collector=collector,
                                admission=AdmissionConfig(self.max_model_len, cfg.on_overflow), pool=pool,
                                measured_transfers=True, max_output_tokens=lambda s: params_for(s).max_tokens,
                                on_arrival=on_arrival, rebuild=factory)
        self.factory = factory  # the last build's (layer_ranges only): bytes dropped, restored
        if hasattr(clock, "bind"):
            clock.bind(cluster)  # the Ray backend's clock fails instances whose actor died
        return cluster, states

    def _ray_executors(self, states) -> tuple[Any, list]:
        """The Ray backend: actors made once (reset for each run), a clock that polls them."""
        from servelab.engine.ray_backend import RayConfig
        from servelab.engine.ray_backend.clock import PollingWallClock
        from servelab.engine.ray_backend.launch import RayWorkers

        cfg = self.ray_config or RayConfig()
        if self._ray_workers is None:
            self._ray_workers = RayWorkers(self, cfg)
        self._ray_workers.check_fits(self)
        self._ray_workers.revive()  # an actor that died in an earlier run is replaced
        self._ray_workers.reset(self.config.seed)
        clock = PollingWallClock(cfg.poll_s)
        return clock, self._ray_workers.executors(states, clock, cfg)

    @property
    def ray_workers(self) -> Any:
        """The Ray actors (None before the first run, or in process); another EngineCluster of
        the same checkpoint, KV sizes and instance count may take them (``ray_workers=``)."""
        return self._ray_workers

    def close(self) -> None:
        """Stop the Ray actors, if any (the in-process backend holds nothing to stop)."""
        if self._ray_workers is not None:
            self._ray_workers.shutdown()
            self._ray_workers = None

    def result_of(self, cluster: ClusterDriver, states, wall_s: float, transfers=None, links=None) -> EngineResult:
        collector = cluster.collector
        table = RequestTable.from_requests(cluster.requests)
        drivers = [cluster.drivers[i] for i in sorted(cluster.active)]
        used = sum(d.runtime.blocks.num_used_gpu_blocks for d in drivers)
        total = sum(d.runtime.blocks.num_gpu_blocks for d in drivers)
        return EngineResult(cluster.requests, dict(states.outputs_text), collector, summarize(table, collector),
                            wall_s, used, total, transfers, links)
