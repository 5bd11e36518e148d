"""OpenAI-compatible HTTP server on the real engine cluster (FastAPI on uvicorn).

``run.build_server`` / ``run.run_server`` assemble it; ``service`` runs the scheduler loop in
its own thread; ``app`` holds the routes; ``schemas`` / ``translate`` turn bodies into engine
requests; ``responses`` shapes OpenAI objects and SSE chunks; ``metrics`` exports Prometheus.
This package imports torch (through the engine): the simulator never imports it.
"""
