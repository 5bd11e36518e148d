"""Llama-family decoder (Llama-2/3, Qwen2/2.5) as a pure ``nn.Module`` over a paged KV cache.

No I/O and no state besides weights and the RoPE table: the KV cache tensor and the step's
attention metadata come in as arguments. ``forward`` takes a flat ragged batch (``[T]``
token ids and positions, any mix of prefill chunks and decodes); ``forward_padded`` takes a
dense ``[B, S]`` batch. Both return logits only for the rows named by the metadata's
``logits_indices``, in float32.

Weights: q/k/v projections are fused into ``qkv_proj`` and gate/up into ``gate_up_proj``
(the loader concatenates HF tensors); tied embeddings share one Parameter. On the CPU the
loader calls ``pack_linears``: every projection then also keeps a packed copy of its weight and
multiplies with it up to ``PACKED_MAX_ROWS`` rows, at the cost of a second copy of the weights:
on an AVX2-only CPU in float32 with one torch thread the panels of ``decode_gemm`` (its C kernel
beat oneDNN at decode row counts there; docs/benchmarks/decode_kernels.md), elsewhere oneDNN's
packed weight (measured 1.6x the FLOP/s of ``F.linear`` at 32 rows, 1.1-1.2x at 2,048, fp32, one
core, on an AVX512 CPU; docs/benchmarks/vs_vllm.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from servelab.engine import decode_gemm, layer_ops
from servelab.engine.attention import PaddedMetadata, RaggedMetadata
from servelab.engine.config import ModelConfig, RopeScaling
from servelab.engine.device import cpu_has_bf16


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None or scaling.rope_type in ("default", "dynamic"):
        return inv_freq  # dynamic NTK only changes frequencies beyond max_position
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # llama3: keep high frequencies, divide low ones by factor, interpolate in between
    low_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, H, D]; cos, sin: [T, 1, D] (the half-split "rotate_half" convention of HF Llama)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _can_pack(weight: torch.Tensor) -> bool:
    """Whether oneDNN can pack this weight here. bf16 needs the CPU's bf16 path (AVX512 or
    AVX-NE-CONVERT): on an AVX2-only CPU (AMD Zen 3) ``_reorder_linear_weight`` raises, which
    made loading a bf16 model fail; such a layer now computes with ``F.linear``."""
    if not (weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    return weight.dtype != torch.bfloat16 or cpu_has_bf16()


def default_packed_max_rows() -> int | None:
    """Rows above which a packed projection multiplies with ``F.linear`` (MKL) instead, by CPU.

    AVX512 (the earlier AVX512-BF16 machine): packed at any size (fp32 at 2,048 rows 2.2x
    ``F.linear``'s GFLOP/s, bf16 1.05x; docs/benchmarks/vs_vllm.md). AVX2 only (AMD Zen 3): packed
    only up to 512 rows. There, F.linear multiplied 2,048 rows at 89-92 GFLOP/s against the
    packed 68-77 (docs/benchmarks/decode_kernels.md), a bench-200m prefill step of 2,048 tokens
    took 12.0 s of CPU against 13.6 (4 of 4 alternated runs faster), at 512 tokens 3.01 against
    3.03 s, and packed weights still win at a decode's 32 rows (1.01-1.14x)."""
    return None if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 512


PACKED_MAX_ROWS: int | None = default_packed_max_rows()


class Linear(nn.Linear):
    """``nn.Linear`` that can run from a packed copy of its weight on the CPU.

    The packed copy is either ``decode_gemm``'s panels (``panels``: float32, AVX2-only CPU) or
    oneDNN's opaque packed weight (``packed``), never both. It lives outside the parameters: a
    deep copy (KunServe's layer moves), ``state_dict`` and ``.to()`` never see it. It is used only
    while the weight is unchanged since packing (its version counter), the input is on the CPU in
    the weight's dtype and has at most ``PACKED_MAX_ROWS`` rows (the panels also need one torch
    thread); otherwise the layer computes from its weight as usual."""

    packed: torch.Tensor | None = None
    panels: torch.Tensor | None = None
    packed_version: int = -1

    def pack(self) -> bool:
        self.packed = self.panels = None
        if decode_gemm.can_pack(self.weight) and (self.bias is None or self.bias.dtype == torch.float32):
            self.panels = decode_gemm.pack(self.weight)
            self.packed_version = self.weight._version
            return True
        if not _can_pack(self.weight):
            return False
        try:
            with torch.no_grad():
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        except RuntimeError:  # an ISA check oneDNN makes that _can_pack did not foresee
            self.packed = None
            return False
        self.packed_version = self.weight._version
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.panels is not None or self.packed is not None) and x.device.type == "cpu" \
                and self.weight._version == self.packed_version and x.dtype == self.weight.dtype \
                and x.dim() == 2 and (PACKED_MAX_ROWS is None or x.shape[0] <= PACKED_MAX_ROWS):
            if self.panels is not None:
                if torch.get_num_threads() == 1:
                    return decode_gemm.linear(x, self.panels, self.bias)
            else:
                return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("packed", None)  # opaque: cannot be copied; the copy computes from its weight
        state.pop("panels", None)  # the copy computes from its weight (and may move elsewhere)
        state.pop("packed_version", None)
        return state


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if layer_ops.applies(x):  # one fused pass (float32, one thread): the same arithmetic
            return layer_ops.rms_norm(x, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.scale = config.head_dim ** -0.5
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_layer: torch.Tensor,
                meta: RaggedMetadata | PaddedMetadata) -> torch.Tensor:
        # x: [T, hidden]; kv_layer: [2, num_blocks, block_size, kv_heads, head_dim]
        qkv = self.qkv_proj(x)  # [T, q_size + 2 * kv_size], this layer's own tensor
        qk = qkv[:, :self.q_size + self.kv_size].view(-1, self.num_heads + self.num_kv_heads, self.head_dim)
        if layer_ops.applies(qkv):  # rotated in place, in one pass (float32, one thread)
            layer_ops.rope_(qkv, self.num_heads + self.num_kv_heads, self.head_dim, cos, sin)
        else:  # q's and k's heads rotate in one call (half the small ops of two; issue 27's step breakdown)
            qk = apply_rope(qk, cos, sin)
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]  # [T, Hq, D], [T, Hkv, D]
        v = qkv[:, self.q_size + self.kv_size:].view(-1, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        out = meta.attend(kv_layer, q, k, v, self.scale)  # [T, Hq, D]
        return self.o_proj(out.flatten(1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if layer_ops.applies(gate_up):  # one fused pass (float32, one thread)
            return self.down_proj(layer_ops.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))  # in place: one fewer [T, intermediate] tensor


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_layer: torch.Tensor,
                meta: RaggedMetadata | PaddedMetadata) -> torch.Tensor:
        a = self.self_attn(self.input_layernorm(x), cos, sin, kv_layer, meta)
        norm = self.post_attention_layernorm
        if layer_ops.applies(x) and layer_ops.applies(a) and x.is_contiguous() and a.is_contiguous():
            x, h = layer_ops.add_rms_norm(x, a, norm.weight, norm.eps)  # the add and the norm in one pass
        else:
            x = x + a
            h = norm(x)
        return x + self.mlp(h)


class Model(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.reset_rope()

    def pack_linears(self) -> int:
        """Pack every projection's weight for oneDNN (CPU only); returns how many were packed."""
        return sum(m.pack() for m in self.modules() if isinstance(m, Linear))

    def tie_weights(self) -> None:
        if self.config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def reset_rope(self) -> None:
        """(Re)build the float32 RoPE table; call after ``to_empty`` or a dtype cast."""
        c = self.config
        device = self.embed_tokens.weight.device
        if device.type == "meta":
            return
        inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling)
        freqs = torch.outer(torch.arange(c.max_position, dtype=torch.float32), inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)  # [max_position, head_dim]
        self.rope_cos = angles.cos().to(device)
        self.rope_sin = angles.sin().to(device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor,
                meta: RaggedMetadata) -> torch.Tensor:
        # input_ids, positions: [T]; kv: [L, 2, num_blocks, block_size, kv_heads, head_dim]
        hidden = self._layers(input_ids, positions, kv, meta)  # [T, hidden]
        return self._logits(hidden.index_select(0, meta.logits_indices))

    def forward_padded(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor,
                       meta: PaddedMetadata) -> torch.Tensor:
        # input_ids, positions: [B, S] (padding rows/tokens hold any valid id and position)
        hidden = self._layers(input_ids.flatten(), positions.flatten(), kv, meta)  # [B * S, hidden]
        return self._logits(hidden.index_select(0, meta.logits_indices))

    def _layers(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor,
                meta: RaggedMetadata | PaddedMetadata) -> torch.Tensor:
        dtype = self.embed_tokens.weight.dtype
        cos = self.rope_cos.index_select(0, positions).to(dtype).unsqueeze(1)  # [T, 1, D]
        sin = self.rope_sin.index_select(0, positions).to(dtype).unsqueeze(1)  # [T, 1, D]
        x = self.embed_tokens(input_ids)  # [T, hidden]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv[i], meta)
        return x

    def forward_layers(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor,
                       meta: RaggedMetadata, layers: tuple[int, int], hidden: torch.Tensor | None = None
                       ) -> torch.Tensor:
        """One pipeline stage: layers ``[lo, hi)`` over ``kv`` holding only those layers' KV
        (``kv[j]`` is layer ``lo + j``). The first stage embeds ``input_ids``, a later one takes
        the previous stage's ``hidden`` [T, hidden]; the last stage returns the logits rows, the
        others the hidden state to hand on. Layers outside the range are never touched (a stage
        model may have freed them)."""
        lo, hi = layers
        dtype = self.embed_tokens.weight.dtype
        cos = self.rope_cos.index_select(0, positions).to(dtype).unsqueeze(1)  # [T, 1, D]
        sin = self.rope_sin.index_select(0, positions).to(dtype).unsqueeze(1)  # [T, 1, D]
        x = self.embed_tokens(input_ids) if lo == 0 else hidden  # [T, hidden]
        if x is None:
            raise ValueError(f"layers {lo}..{hi}: a stage after the first needs the previous stage's hidden state")
        for j, i in enumerate(range(lo, hi)):
            x = self.layers[i](x, cos, sin, kv[j], meta)
        if hi == self.config.num_layers:
            return self._logits(x.index_select(0, meta.logits_indices))
        return x

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden)).float()  # [R, vocab]
