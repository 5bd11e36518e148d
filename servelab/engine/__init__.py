"""Real PyTorch engine: a Llama-family model over a paged KV cache, driven by the same plans.

Modules: ``config`` (model config from HF fields), ``model`` (pure nn.Module; ragged and
padded forwards), ``attention`` (paged attention + per-step metadata), ``kv_cache`` (KV
tensors indexed by ``BlockManager`` block ids), ``runner`` (one step: metadata, forward,
sampling), ``sampling``, ``detokenize``, ``loader`` (HF checkpoint folders), ``tiny_model``
(random-weight checkpoints for tests and benchmarks), ``bench`` (decode-step timing).
Importing this package imports nothing heavy; each module imports torch itself.
"""
