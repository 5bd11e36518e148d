"""Starting Ray and placing one actor per engine instance.

``start_ray`` starts Ray on this machine (``num_cpus`` of it) or joins the cluster at
``address``; it leaves a Ray already running in this process alone (a test fixture, a
caller's own cluster). ``RayWorkers`` makes the actors of one ``EngineCluster`` once and
resets them for every run. Placement follows what Ray sees: with at least one GPU per
instance each actor asks for one GPU and runs on ``cuda``; fewer GPUs than instances are
shared (half a GPU each for 2 instances on 1 GPU); with none, the cluster's CPUs but one are shared
out evenly and each actor runs that many torch threads (1 each for 2 instances on 2 cores).
On a multi-node cluster the checkpoint folder must exist at the same path on every node and
servelab must be installed there.
"""

from __future__ import annotations

import socket
from typing import Any

import numpy as np

from servelab.core.errors import UserError
from servelab.engine.ray_backend.config import RayConfig


def start_ray(cfg: RayConfig) -> None:
    import ray

    if cfg.address is not None:  # named but unreachable is an error even with a Ray already up here
        _check_reachable(cfg.address)
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    try:
        if cfg.address is None:
            ray.init(num_cpus=cfg.num_cpus, **kwargs)
        else:
            ray.init(address=cfg.address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = "on this machine" if cfg.address is None else f"at {cfg.address!r}"
        raise UserError(f"cannot start or join Ray {where}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                        ) from None


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, with one line, on a host:port nobody answers (Ray itself retries for
    minutes); ``auto`` and addresses without a port are left to Ray."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise UserError(f"cannot reach the Ray cluster at {address!r}: {e.strerror or type(e).__name__}") from None


def placement(num_instances: int) -> dict[str, Any]:
    """Resources per actor as Ray sees the cluster now, and the device it runs on."""
    import ray

    return placement_for(ray.cluster_resources(), num_instances)


def placement_for(resources: dict[str, float], num_instances: int) -> dict[str, Any]:
    """A GPU each when there are enough; else the GPUs shared evenly (1/k of one, so k actors
    pack onto each GPU and all of them fit); with no GPU, the CPUs but one (the driver's)
    shared evenly, each actor running that many torch threads (at least one: threads beyond
    the cores spin against each other)."""
    gpus = int(resources.get("GPU", 0))
    if gpus >= 1:
        per_gpu = -(-num_instances // gpus)  # actors that share one GPU
        return {"num_gpus": 1 if per_gpu == 1 else 1 / per_gpu, "num_cpus": 0 if per_gpu > 1 else 1,
                "device": "cuda", "threads": 1}
    cpus = max(resources.get("CPU", 1.0), 1.0)
    share = (cpus - 1 if cpus >= 2 else cpus) / num_instances  # a core left to the driver and Ray
    num_cpus = int(share) if share >= 1 else share
    return {"num_gpus": 0, "num_cpus": num_cpus, "device": "cpu", "threads": max(1, int(share))}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class RayWorkers:
    """The actors of one engine cluster (a model replica and KV cache each)."""

    def __init__(self, engine: Any, cfg: RayConfig) -> None:
        import ray

        from servelab.engine.loader import DTYPES
        from servelab.engine.ray_backend.worker import KV_GROUP, InstanceWorker

        start_ray(cfg)
        self.cfg = cfg
        n = engine.num_instances
        place = placement(n)
        self.device = place["device"]
        threads = cfg.torch_threads or place["threads"]
        dtype = next(name for name, dt in DTYPES.items() if dt == engine.kv_dtype)
        self._cls = ray.remote(concurrency_groups={KV_GROUP: 1})(InstanceWorker)
        kv = engine.kv_config
        self._args = (str(engine.loaded.path), dtype, self.device, kv.num_gpu_blocks, kv.block_size,
                      engine.config.num_host_blocks, engine.config.seed, threads)
        self._resources = {"num_cpus": place["num_cpus"], "num_gpus": place["num_gpus"]}
        self.actors = [self._spawn() for _ in range(n)]
        self.info = ray.get([a.ready.remote() for a in self.actors])
        self.placement = {**place, "threads": threads}
        self.kv_shape = self._kv_shape(engine)
        self.num_host_blocks = engine.config.num_host_blocks
        self.model = (str(engine.loaded.path), dtype)
        self.itemsize = engine.loaded.model.embed_tokens.weight.element_size()
        self._gloo = False

    def _spawn(self) -> Any:
        return self._cls.options(max_restarts=0, **self._resources).remote(*self._args)

    @staticmethod
    def _kv_shape(engine: Any) -> tuple[int, ...]:
        c, kv = engine.loaded.config, engine.kv_config
        return (c.num_layers, 2, kv.num_gpu_blocks, kv.block_size, c.num_kv_heads, c.head_dim)

    def check_fits(self, engine: Any) -> None:
        if not self.actors:
            raise UserError("these Ray workers were shut down")
        if (str(engine.loaded.path), self.model[1]) != self.model:
            raise UserError(f"Ray workers hold {self.model[0]}, not {engine.loaded.path}")
        if len(self.actors) != engine.num_instances or self._kv_shape(engine) != self.kv_shape \
                or engine.config.num_host_blocks != self.num_host_blocks:
            raise UserError(f"Ray workers made for {len(self.actors)} instances with KV cache {self.kv_shape} "
                            f"cannot serve {engine.num_instances} instances with {self._kv_shape(engine)}")

    def _init_gloo(self) -> None:
        import ray

        if self._gloo:
            return
        self._gloo = True
        master = self.info[0]["node"]
        port = _free_port() if self.cfg.address is None else ray.get(self.actors[0].free_port.remote())
        n = len(self.actors)
        ray.get([a.init_gloo.remote(master, port, rank, n) for rank, a in enumerate(self.actors)])

    def reset(self, seed: int) -> None:
        import ray

        ray.get([a.reset.remote(seed) for a in self.actors])

    def executors(self, states: Any, clock: Any, cfg: RayConfig) -> list:
        """One driver-side executor per actor; ``clock`` (a PollingWallClock) hears of deaths."""
        from servelab.engine.ray_backend.executor import RayExecutor

        transport = cfg.kv_transport
        if transport != "object_store":
            self._init_gloo()
        block_bytes = int(np.prod(self.kv_shape[:2]) * np.prod(self.kv_shape[3:])) * self.itemsize
        carried: dict = {}  # seeded generators of requests between two actors
        return [RayExecutor(a, states, i, transport=transport, rank=i, kv_shape=self.kv_shape,
                            block_bytes=block_bytes, on_dead=clock.fail, defer=clock.defer,
                            gloo_max_bytes=cfg.gloo_max_bytes, carried=carried) for i, a in enumerate(self.actors)]

    def revive(self) -> list[int]:
        """Start a fresh actor in place of each one that died; returns their instance ids
        (a new actor's KV is empty: a cluster built after this starts from scratch)."""
        import ray

        dead = []
        for i, a in enumerate(self.actors):
            try:
                ray.get(a.ready.remote(), timeout=60)
            except ray.exceptions.RayActorError:
                dead.append(i)
        for i in dead:
            self.actors[i] = self._spawn()
        if dead:
            self.info = ray.get([a.ready.remote() for a in self.actors])
            if self._gloo:  # a new process group over the new set of processes
                self._gloo = False
                ray.get([a.leave_gloo.remote() for a in self.actors])
        return dead

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []
