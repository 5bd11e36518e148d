"""The systems the papers compare against, one module each, registered by name.

Policies: ``vllm`` (and its orderings ``sjf``, ``ljf``, ``priority``), ``sarathi``, ``static``.
Routers: ``round_robin``, ``least_loaded``, ``distserve`` (with its P/D cluster preset).
"""
