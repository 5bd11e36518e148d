"""Build and run a server: checkpoint -> EngineCluster -> EngineService -> app -> uvicorn.

With ``engine_process`` (``servelab serve``'s default) the EngineCluster and EngineService run in
a child process and the app talks to it through ``engine_process.ProcessEngineService``.

``run_server`` is what ``servelab serve`` calls: uvicorn handles SIGINT/SIGTERM with a
graceful shutdown (stop accepting, let requests in flight finish for ``shutdown_timeout_s``,
cancel the rest, whose handlers abort their requests with "server shutting down"), then the
app's lifespan stops the engine thread. ``ServerThread`` runs the same server in a thread of
this process, for tests and for commands that start and stop a server themselves.
"""

from __future__ import annotations

from typing import Any

import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from servelab.core.errors import UserError
from servelab.engine.cluster import EngineConfig


@dataclass(frozen=True)
class ServerConfig:
    model: Path
    policy: str = "vllm"
    router: str | None = None
    num_instances: int = 1
    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None
    dtype: str | None = None
    chat_template: Path | None = None
    request_log: Path | None = None
    shutdown_timeout_s: float = 5.0
    log_level: str = "warning"
    backend: str = "inprocess"  # or "ray": each instance in a Ray actor
    ray_config: Any = None  # engine.ray_backend.RayConfig when backend is "ray"
    engine_process: bool = False  # the engine in a child process (engine_process.py); False: a thread here

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise UserError(f"--port must be in [0, 65535], got {self.port}")
        if not 0 <= self.shutdown_timeout_s <= 3600:
            raise UserError(f"--shutdown-timeout must be in [0, 3600] seconds, got {self.shutdown_timeout_s}")
        if self.api_key is not None:
            key = self.api_key
            if not key.strip():
                raise UserError("--api-key must not be empty")
            if key != key.strip() or not all(" " <= c <= "~" for c in key):
                # HTTP drops the spaces around a header value and carries only ASCII reliably: no
                # client could send such a key, so every request would get a 401
                raise UserError(f"--api-key must be printable ASCII with no space at either end (a client's "
                                f"'Authorization: Bearer KEY' header cannot carry it), got {len(key)} characters "
                                f"starting {key[:1]!r} and ending {key[-1:]!r}")

    @property
    def model_name(self) -> str:
        return self.served_model_name or str(self.model)


def build_server(config: ServerConfig, loaded=None):
    """(app, service) for ``config``; ``loaded`` reuses a checkpoint already in memory."""
    from servelab.engine.cluster import EngineCluster
    from servelab.server.app import build_app
    from servelab.server.chat import load_chat_template
    from servelab.server.service import EngineService
    from servelab.server.translate import Translator

    if config.engine_process:
        return _build_process_server(config, loaded)
    model = loaded if loaded is not None else config.model
    try:
        engine = EngineCluster(model, config.policy, config.engine, num_instances=config.num_instances,
                               router=config.router, dtype=config.dtype, backend=config.backend,
                               ray_config=config.ray_config)
    except ValueError as e:  # EngineConfig / KV budget problems are the user's options
        raise UserError(f"engine options: {e}") from None
    template = load_chat_template(engine.loaded.path, config.chat_template)
    service = EngineService(engine, config.model_name, request_log=config.request_log)
    translator = Translator(engine.loaded, engine, config.model_name, template)
    app = build_app(service, translator, api_key=config.api_key, shutdown_grace_s=config.shutdown_timeout_s)
    return app, service


def _build_process_server(config: ServerConfig, loaded):
    """The HTTP front end here, the engine in a child process: the parent keeps the tokenizer."""
    import torch

    from servelab.engine.loader import load_checkpoint
    from servelab.server.app import build_app
    from servelab.server.chat import load_chat_template
    from servelab.server.engine_process import ProcessEngineService
    from servelab.server.translate import Translator

    if config.backend != "inprocess":
        raise UserError(f"the engine process runs the inprocess backend only, not {config.backend!r}")
    if loaded is None:
        loaded = load_checkpoint(config.model, dtype=config.dtype, weights=False)  # the child loads the weights
    template = load_chat_template(loaded.path, config.chat_template)  # a bad template fails before the child starts
    service = ProcessEngineService(config, loaded, threads=torch.get_num_threads())
    try:
        translator = Translator(loaded, service, config.model_name, template)
        app = build_app(service, translator, api_key=config.api_key, shutdown_grace_s=config.shutdown_timeout_s)
    except BaseException:
        service.shutdown(0)
        raise
    return app, service


def _uvicorn_server(app, config: ServerConfig, service):
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                                           timeout_graceful_shutdown=config.shutdown_timeout_s,
                                           access_log=config.log_level in ("info", "debug")))
    service.exiting = lambda: server.should_exit
    return server


def run_server(config: ServerConfig, loaded=None) -> None:
    _check_port(config.host, config.port)  # before the engine (process) starts
    app, service = build_server(config, loaded)
    _uvicorn_server(app, config, service).run()


def _check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
        except OSError as e:
            raise UserError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """A server on a free loopback port in a background thread: ``with ServerThread(cfg) as s:``."""

    def __init__(self, config: ServerConfig, loaded=None, *, start_timeout_s: float = 60.0) -> None:
        from dataclasses import replace

        if config.port == 0:
            config = replace(config, port=free_port(config.host))
        self.config = config
        self.app, self.service = build_server(config, loaded)
        self.server = _uvicorn_server(self.app, config, self.service)
        self.thread = threading.Thread(target=self.server.run, name="servelab-http", daemon=True)
        self.start_timeout_s = start_timeout_s

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __exit__(self, *exc) -> None:
        self.stop()
