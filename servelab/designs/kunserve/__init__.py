"""KunServe: parameter-centric memory management under bursts (the ``kunserve`` router and
preset: Llumnix-style dispatch, throttling monitor, drop plan, pipeline groups with
coordinated KV exchange and lookahead microbatches, restore, failure and autoscaling hooks;
the ``kunserve`` policy: chunked prefill whose budget grows with the pipeline).

Building blocks (drop plan, Eq. 1, microbatch formers) are numpy/scipy only: no torch.
"""

from servelab.designs.kunserve import policy, router  # noqa: F401  (register policy, router and preset)
