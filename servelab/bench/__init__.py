"""Load generator for any OpenAI-compatible server (``servelab bench``), vLLM-style results.

``prompts`` plans requests (arrivals and exact-length prompts from a workload spec),
``client`` streams one request and times it, ``run`` drives them on asyncio, ``results``
summarises (vLLM's field names, goodput), ``plots`` draws, ``compare`` puts a bench run
against ``servelab serve`` next to the simulator's prediction for the same workload.
No torch here: only the optional ``tokenizers`` for exact prompt lengths.
"""
