"""The systems the papers compare against, one module each, registered by name.

Policies: ``vllm`` (and its orderings ``sjf``, ``ljf``, ``priority``), ``sarathi``, ``static``.
Routers: ``round_robin``, ``least_loaded``, ``distserve`` (with its P/D cluster preset), and
KunServe's baselines, each with a preset of the same name: ``llumnix`` (KV-load dispatch and
migration), ``infercept`` (swap to host over PCIe overlapped with compute), ``vllm-pp``
(static two-stage pipelines).
"""
