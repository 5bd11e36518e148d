"""Fan independent simulations out over local processes or a Ray cluster.

A sweep of policies x rates, or the probes of a capacity search, are independent runs of a
pure function (a simulation depends only on its inputs), so running them elsewhere gives the
same results as running them here one after another. ``Fanout.map`` runs ``fn(item)`` for
every item and hands each result to ``on_result`` as it arrives (for a progress bar over all
points); it returns the results in the items' order, so callers build exactly the rows a
serial run builds.

Backends: ``local`` (``jobs`` processes of ``concurrent.futures``; ``jobs=1`` runs in this
process, no pickling) and ``ray`` (``ray.init()`` starts a local Ray unless an address is
given, ``ray.init(address=...)`` joins a running cluster; every item is a Ray task). ``fn``
must be a module-level function and items and results picklable.

``setup`` (a module-level function, optional) runs once in every process that simulates,
before its first item: the CLI passes ``hugepage_arenas.install`` so that sweep and capacity
workers, like ``simulate``, put Python's object arenas on huge pages before they allocate.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from servelab.core.errors import UserError

BACKENDS = ("local", "ray")


class Fanout:
    def __init__(self, jobs: int = 1, backend: str = "local", ray_address: str | None = None,
                 setup: Callable[[], Any] | None = None) -> None:
        if backend not in BACKENDS:
            raise UserError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise UserError(f"--jobs must be an integer >= 1, got {jobs!r}")
        if ray_address is not None and backend != "ray":
            raise UserError("--ray-address needs --backend ray")
        self.jobs = jobs
        self.backend = backend
        self.ray_address = ray_address
        self.setup = setup

    @property
    def parallel(self) -> int:
        """How many items may run at once (a Ray cluster: its CPUs, known once it is joined)."""
        if self.backend == "ray":
            import ray

            self._init_ray()
            return max(1, int(ray.cluster_resources().get("CPU", 1)))
        return self.jobs

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any],
            on_result: Callable[[int, Any], None] | None = None,
            keep: Callable[[Any], Any] | None = None) -> list[Any]:
        """``[keep(fn(item)) for item in items]``, run by the backend; ``on_result(index, result)``
        hears each whole result as it ends (``keep`` drops what need not stay in memory)."""
        items = list(items)
        if self.backend == "ray":
            return self._map_ray(fn, items, on_result, keep)
        if self.jobs == 1 or len(items) <= 1:
            if self.setup is not None:
                self.setup()
            results = []
            for k, item in enumerate(items):
                result = fn(item)
                if on_result is not None:
                    on_result(k, result)
                results.append(result if keep is None else keep(result))
            return results
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        results: list[Any] = [None] * len(items)
        # spawn, not fork: a forked child would inherit this process's threads and locks mid-state
        with ProcessPoolExecutor(max_workers=min(self.jobs, len(items)),
                                 mp_context=multiprocessing.get_context("spawn"), initializer=self.setup) as pool:
            futures = {pool.submit(fn, item): k for k, item in enumerate(items)}
            for future in as_completed(futures):
                k = futures[future]
                result = future.result()
                if on_result is not None:
                    on_result(k, result)
                results[k] = result if keep is None else keep(result)
        return results

    def _init_ray(self) -> None:
        try:
            import ray
        except ImportError:
            raise UserError("--backend ray needs the ray package (pip install 'servelab[ray]')") from None
        if not ray.is_initialized():
            try:
                if self.ray_address is None:
                    ray.init(num_cpus=self.jobs if self.jobs > 1 else None, include_dashboard=False,
                             log_to_driver=False)
                else:
                    ray.init(address=self.ray_address, log_to_driver=False)
            except Exception as err:  # Ray's own errors (timeouts, a wrong address) are not UserErrors
                where = f"join Ray at {self.ray_address}" if self.ray_address else "start a local Ray"
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise UserError(f"--backend ray: could not {where}: {first}") from None

    def _map_ray(self, fn, items, on_result, keep) -> list[Any]:
        import ray

        self._init_ray()
        if self.setup is None:
            task = ray.remote(fn)
            refs = [task.remote(item) for item in items]
        else:
            task = ray.remote(_set_up_and_run)
            refs = [task.remote(self.setup, fn, item) for item in items]
        index = {ref: k for k, ref in enumerate(refs)}
        results: list[Any] = [None] * len(items)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                k = index[ref]
                result = ray.get(ref)
                if on_result is not None:
                    on_result(k, result)
                results[k] = result if keep is None else keep(result)
        return results


def _set_up_and_run(setup: Callable[[], Any], fn: Callable[[Any], Any], item: Any) -> Any:
    """A Ray task's body when there is a ``setup``: a worker process runs many tasks, and a
    setup such as ``hugepage_arenas.install`` acts once per process (later calls return)."""
    setup()
    return fn(item)
