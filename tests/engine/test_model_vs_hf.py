"""Our paged model against HF transformers on the same checkpoint folder (fp32, eager attention)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from servelab.engine.loader import load_checkpoint

from engine_helpers import chunk, hf_last_logits, make_runner

TOL = 1e-4

VARIANTS = {
    "llama": dict(arch="llama"),
    "qwen2": dict(arch="qwen2"),
    "llama_tied": dict(arch="llama", tie_embeddings=True),
    "qwen2_tied": dict(arch="qwen2", tie_embeddings=True, rope_theta=1e6),
    "llama3_rope": dict(arch="llama", rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}),
    "linear_rope": dict(arch="llama", rope_scaling={"type": "linear", "factor": 4.0}),
    "dynamic_rope": dict(arch="qwen2", rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
}


def _load_both(folder):
    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    return load_checkpoint(folder), hf


# every decode kernel; split-kv with 8-token splits so that a 41..73-token context spans many
KERNELS = {"split-kv": dict(decode_kernel="split-kv", split_tokens=8), "padded": dict(decode_kernel="padded")}


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prefill_then_32_decodes_match_hf(variant, kernel, make_checkpoint, prompts):
    loaded, hf = _load_both(make_checkpoint(**VARIANTS[variant]))
    runner, blocks = make_runner(loaded, **KERNELS[kernel])
    seq = list(prompts[7])
    _, logits = runner.compute_logits([chunk(blocks, 0, seq, 0)])
    assert (logits[0] - hf_last_logits(hf, seq)).abs().max() <= TOL
    for _ in range(32):
        seq.append(int(logits[0].argmax()))
        _, logits = runner.compute_logits([chunk(blocks, 0, seq[-1:], len(seq) - 1)])
        assert (logits[0] - hf_last_logits(hf, seq)).abs().max() <= TOL


@pytest.mark.parametrize("variant", ["llama", "qwen2", "llama3_rope"])
def test_chunked_prefill_matches_hf(variant, make_checkpoint, prompts):
    loaded, hf = _load_both(make_checkpoint(**VARIANTS[variant]))
    runner, blocks = make_runner(loaded, block_size=4)
    prompt = prompts[12]  # 41 tokens: chunks end mid-block
    cuts = [0, 7, 26, len(prompt)]
    for a, b in zip(cuts, cuts[1:]):
        ids, logits = runner.compute_logits([chunk(blocks, 0, prompt[a:b], a, sample=b == len(prompt))])
        assert ids == ([0] if b == len(prompt) else [])
    assert (logits[0] - hf_last_logits(hf, prompt)).abs().max() <= TOL


def test_scaled_rope_changes_logits(make_checkpoint, prompts):
    """The scaling variants must not silently fall back to plain RoPE."""
    plain = load_checkpoint(make_checkpoint(arch="llama"))
    scaled = load_checkpoint(make_checkpoint(**VARIANTS["linear_rope"]))
    outs = []
    for loaded in (plain, scaled):
        runner, blocks = make_runner(loaded)
        outs.append(runner.compute_logits([chunk(blocks, 0, prompts[10], 0)])[1])
    assert (outs[0] - outs[1]).abs().max() > 1e-2


def test_bf16_chunked_prefill_close_to_hf_bf16(make_checkpoint, prompts, monkeypatch):
    """In bf16 the engine's CPU prefill kernel (query tiles of matmuls, bf16 scores, as HF's eager
    attention) over a prompt cut into chunks (the later ones over cached blocks, several tiles each)
    and a few decodes: the last logits stay close to HF's bf16 eager forward, measured against
    how far HF's own bf16 forward is from its float32 one."""
    from servelab.engine import prefill_kernels

    monkeypatch.setitem(prefill_kernels.PREFILL_TILES, torch.bfloat16, 4)
    folder = make_checkpoint(arch="llama")
    loaded = load_checkpoint(folder, dtype=torch.bfloat16)
    assert prefill_kernels.cpu_prefill_kernel(torch.bfloat16) == "matmul-tiles"
    hf16 = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.bfloat16).eval()
    hf32 = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    runner, blocks = make_runner(loaded, block_size=4)
    seq = list(prompts[12])
    cuts = [0, 7, 26, len(seq)]
    for a, b in zip(cuts, cuts[1:]):
        _, logits = runner.compute_logits([chunk(blocks, 0, seq[a:b], a, sample=b == len(seq))])
    for step in range(4):
        ref16, ref32 = hf_last_logits(hf16, seq).float(), hf_last_logits(hf32, seq)
        ours = logits[0].float()
        bf16_noise = (ref16 - ref32).abs().max()
        # after the prefill HF's numerics exactly (0.0 measured; a mask one key off: 2.1x the noise);
        # decodes run the split-kv kernel, whose rounding differs (measured up to 1.2x the noise)
        assert (ours - ref16).abs().max() <= (0.5 if step == 0 else 2) * bf16_noise + 1e-3, step
        assert (ours - ref32).abs().max() <= 2 * bf16_noise + 1e-3, step
        seq.append(int(ref32.argmax()))
        _, logits = runner.compute_logits([chunk(blocks, 0, seq[-1:], len(seq) - 1)])
