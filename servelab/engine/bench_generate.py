"""End-to-end decode throughput: the servelab engine vs HF transformers ``generate``.

``servelab perf engine-generate --model DIR --batch 1,8,32 --new-tokens 64``
builds, for each batch size, that many prompts of GSM8K text whose token lengths are spread
geometrically over ``[--min-len, --max-len]``, and generates ``--new-tokens`` tokens greedily
(EOS ignored) for all of them at once: through ``EngineInstance`` (vLLM policy, paged KV)
and through HF ``generate`` (left-padded batch, its dynamic KV cache) on the same checkpoint.

Decode throughput counts only tokens after the prefill: for HF, from the first generated
token (timestamped by a streamer) to the end; for the engine, from the moment every
request has its first token to the last token. Both use the same torch thread count. It also
reports how many greedy tokens agree between the two (fp32: expected all or nearly all).
"""

from __future__ import annotations

import json
import time

import torch

from servelab.core.request import RequestSpec
from servelab.engine.loader import load_checkpoint
from servelab.engine.sampling import SamplingParams
from servelab.engine.serve_loop import EngineConfig, EngineInstance
from servelab.engine.tiny_model import gsm8k_texts


def make_prompts(tokenizer, batch: int, min_len: int, max_len: int) -> list[list[int]]:
    """``batch`` prompts of GSM8K text, lengths geometric over [min_len, max_len]."""
    stream: list[int] = []
    for text in gsm8k_texts(limit=2000):
        stream += tokenizer.encode(text).ids[1:]
        if len(stream) > batch * max_len + 1:
            break
    if batch == 1:
        lengths = [max_len]
    else:
        ratio = (max_len / min_len) ** (1 / (batch - 1))
        lengths = [round(min_len * ratio**i) for i in range(batch)]
    prompts, at = [], 0
    for n in lengths:
        prompts.append([0] + stream[at:at + n - 1])  # <s> + text
        at += n
    return prompts


class _FirstTokenTimer:
    """A ``generate`` streamer that notes when the first new tokens arrive (after prefill)."""

    def __init__(self) -> None:
        self.num_puts = 0
        self.first_token_s: float | None = None

    def put(self, value) -> None:
        self.num_puts += 1
        if self.num_puts == 2:  # the first put is the prompt
            self.first_token_s = time.perf_counter()

    def end(self) -> None:
        pass


def run_hf(hf_model, prompts: list[list[int]], new_tokens: int) -> tuple[float, float, list[list[int]]]:
    """(total seconds, decode tokens/s, generated ids) for one left-padded greedy batch."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), 2, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    timer = _FirstTokenTimer()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, pad_token_id=2, streamer=timer)
    end = time.perf_counter()
    decode_tokens = len(prompts) * (new_tokens - 1)
    return end - t0, decode_tokens / (end - timer.first_token_s), out[:, width:].tolist()


def run_engine(loaded, prompts: list[list[int]], new_tokens: int) -> tuple[float, float, list[list[int]]]:
    specs = [RequestSpec(i, 0.0, len(p), new_tokens, prompt_token_ids=tuple(p)) for i, p in enumerate(prompts)]
    need = sum(len(p) + new_tokens for p in prompts) * 2
    c = loaded.config
    kv_bytes = (need + 16 * len(prompts)) * 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4
    config = EngineConfig(kv_budget_bytes=kv_bytes, max_batch_tokens=max(8192, sum(map(len, prompts))),
                          max_num_seqs=len(prompts))
    engine = EngineInstance(loaded, "vllm", config)
    t0 = time.perf_counter()
    res = engine.run(specs, SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True))
    total = time.perf_counter() - t0
    start = max(r.token_times_s[0] for r in res.requests)
    end = max(r.token_times_s[-1] for r in res.requests)
    decode_tokens = sum(1 for r in res.requests for t in r.token_times_s if t > start)
    outputs = [r.output_token_ids for r in sorted(res.requests, key=lambda r: r.request_id)]
    return total, decode_tokens / (end - start), outputs


def run(args) -> None:
    """The benchmark; ``args`` carries the ``servelab perf engine-generate`` options."""
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    loaded = load_checkpoint(args.model, dtype="float32")
    hf_model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    rows = []
    for batch in args.batch:
        prompts = make_prompts(loaded.tokenizer, batch, args.min_len, args.max_len)
        e_total, e_tps, e_out = run_engine(loaded, prompts, args.new_tokens)
        h_total, h_tps, h_out = run_hf(hf_model, prompts, args.new_tokens)
        same = sum(a == b for x, y in zip(e_out, h_out) for a, b in zip(x, y))
        rows.append({"batch": batch, "prompt_tokens": sum(map(len, prompts)), "engine_total_s": e_total,
                     "hf_total_s": h_total, "engine_decode_tok_s": e_tps, "hf_decode_tok_s": h_tps,
                     "decode_speedup": e_tps / h_tps, "total_speedup": h_total / e_total,
                     "greedy_tokens_equal": same / (batch * args.new_tokens)})
        if not args.json:
            r = rows[-1]
            print(f"batch {batch:3d} ({r['prompt_tokens']} prompt tokens): decode engine {e_tps:7.1f} tok/s, "
                  f"HF {h_tps:7.1f} tok/s -> {r['decode_speedup']:.2f}x; end-to-end {e_total:6.1f} s vs "
                  f"{h_total:6.1f} s -> {r['total_speedup']:.2f}x; greedy tokens equal {r['greedy_tokens_equal']:.1%}",
                  flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))

