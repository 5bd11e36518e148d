"""Analytical roofline cost model: a step's time from FLOPs and bytes, layer by layer.

Per layer and TP rank, every linear layer and elementwise op is a kernel timed by
``ops.op_times_s`` (weights read once per step, activations per token); attention is
timed per request from its own context: a decode reads its KV (memory-bound), a prefill
chunk of c tokens ending at context L does the causal c*L - c(c-1)/2 query-key pairs and
reads L tokens of KV.

The iteration bubble: a decode attention kernel gives each (request, KV head) pair
``decode_kv_splits`` thread blocks, each on one SM at 1/num_SMs of the GPU's bandwidth, so
the longest request alone needs ``max_ctx * num_SMs / (kv_heads * splits)`` context-tokens'
worth of full-GPU time. Decode attention per layer is therefore

    per_ctx_s * max(sum of contexts, longest context * num_SMs / (kv_heads * splits))

which is the sum when the batch is large and mixed, and the longest request when a few long
ones dominate a small batch (AlignedServe's premise; vLLM's split-KV kernel shrinks it). TP divides the work over ranks and adds two all-reduces per layer
over NVLink; PP adds one activation send between consecutive stages (NVLink within a
node of 8 GPUs, the network beyond). The LM head runs on one row per scheduled request.

What ``step_time_s`` means: the latency of one step through every pipeline stage (the sum
of the stages plus the sends), which is what a scheduler running one batch at a time sees.
With PP the throughput bound is the slowest stage, about ``step_time_s / pp`` when the
pipeline is kept full of micro-batches; this model does not overlap them.

Cost: all coefficients are precomputed in ``__init__``; ``step_time_s`` is scalar Python
arithmetic (a few microseconds) and ``decode_step_times_s`` is one numpy expression that is
bit-for-bit the scalar formula applied to an array.
"""
from __future__ import annotations


from servelab.catalog.instance import InstanceSpec, kv_bytes_per_block, kv_bytes_per_token
from servelab.core.plan import StepShape
from servelab.costmodel.attention.base import bubble_work
from servelab.costmodel.base import StepArraysMixin, register_cost_model
from servelab.costmodel.links import LinkSpec
from servelab.costmodel.ops import (
    OpEfficiency,
    OpShape,
    RooflineParams,
    embed_shape,
    layer_op_shapes,
    lm_head_shape,
)
from servelab.costmodel.profile_fit import params_for_gpu


class RooflineCostModel(StepArraysMixin):
    def __init__(self, instance: InstanceSpec, params: RooflineParams | None = None) -> None:
        self.instance = instance
        self.params = params if params is not None else RooflineParams()
        self._num_layers = instance.num_layers_held
        self._kv_bytes_per_token = kv_bytes_per_token(instance)
        self._block_bytes = kv_bytes_per_block(instance)
        gpu = instance.gpu_spec
        self._swap_link = LinkSpec(gpu.pcie_bandwidth_bytes_per_s * instance.num_gpus * self.params.swap_efficiency,
                                   self.params.comm_latency_s)
        self._init_layer()
        self._init_attention()
        self._init_tail()

    def _init_layer(self) -> None:
        """Per layer: t(T) = fixed + per_token * T + sum over GEMMs of max(cf * T, cw + ca * T)."""
        p, inst = self.params, self.instance
        gpu, model, tp, d = inst.gpu_spec, inst.model_spec, inst.tp, inst.dtype_bytes
        fixed, per_token, gemms = p.attention.floor_s + p.layer_overhead_s, 0.0, []
        for shape in layer_op_shapes(model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim,
                                     model.intermediate_size, model.gated_mlp, tp, d):
            f, cf, cw, ca = _coefficients(shape, p.op(shape.name), gpu.peak_flops, gpu.hbm_bandwidth_bytes_per_s)
            fixed += f
            if cf == 0.0 and cw == 0.0:
                per_token += ca
            else:
                gemms.append((cf, cw, ca))
        if tp > 1:  # two ring all-reduces of [T, hidden] per layer
            nvlink = LinkSpec(gpu.nvlink_bandwidth_bytes_per_s * p.comm_efficiency, p.comm_latency_s)
            fixed += 2 * nvlink.latency_s
            per_token += 2 * 2 * (tp - 1) / tp * model.hidden_size * d / nvlink.bandwidth_bytes_per_s
        self._layer_fixed_s = fixed
        self._layer_per_token_s = per_token
        self._gemms = tuple(gemms)

    def _init_attention(self) -> None:
        """Per layer and rank: seconds per query-key pair, per KV token read, per query token."""
        attn, inst = self.params.attention, self.instance
        gpu, model, d = inst.gpu_spec, inst.model_spec, inst.dtype_bytes
        heads, kv_heads = model.num_heads // inst.tp, max(1, model.num_kv_heads // inst.tp)
        compute, memory = gpu.peak_flops * attn.compute, gpu.hbm_bandwidth_bytes_per_s * attn.memory
        self._pair_s = 4.0 * heads * model.head_dim / compute  # QK^T and PV, 2 FLOPs per MAC
        self._kv_read_s = 2.0 * kv_heads * model.head_dim * d / memory
        self._q_io_s = 2.0 * heads * model.head_dim * d / memory  # read Q, write O (negligible for decodes)
        self._decode_per_ctx_s = max(self._pair_s, self._kv_read_s)
        self._longest_factor = gpu.num_sms / (kv_heads * self.params.decode_kv_splits)

    def _init_tail(self) -> None:
        """Once per step: CPU overhead, embedding, LM head over sampled rows, PP sends."""
        p, inst = self.params, self.instance
        gpu, model, d = inst.gpu_spec, inst.model_spec, inst.dtype_bytes
        fixed, per_token = p.step_overhead_s, 0.0
        if inst.holds_first_layer:
            f, _, _, ca = _coefficients(embed_shape(model.hidden_size, d), p.op("embed"), gpu.peak_flops,
                                        gpu.hbm_bandwidth_bytes_per_s)
            fixed, per_token = fixed + f, ca
        self._lm_head = None
        if inst.holds_last_layer:
            self._lm_head = _coefficients(lm_head_shape(model.hidden_size, model.vocab_size, inst.tp, d),
                                          p.op("lm_head"), gpu.peak_flops, gpu.hbm_bandwidth_bytes_per_s)
        if inst.pp > 1:  # stages in one node talk over NVLink, beyond 8 GPUs over the network
            link_bw = gpu.nvlink_bandwidth_bytes_per_s if inst.num_gpus <= 8 else gpu.network_bandwidth_bytes_per_s
            send = LinkSpec(link_bw * p.comm_efficiency, p.comm_latency_s)
            fixed += (inst.pp - 1) * send.latency_s
            per_token += (inst.pp - 1) * model.hidden_size * d / send.bandwidth_bytes_per_s
        self._tail_fixed_s = fixed
        self._tail_per_token_s = per_token

    # ---- the CostModel protocol ----
    def step_time_s(self, shape: StepShape) -> float:
        swap = self.swap_time_s(shape.swap_blocks) if shape.swap_blocks else 0.0
        pad = shape.padding
        if pad is None and not shape.prefill_tokens:
            if shape.num_decodes == 0:
                return swap
            return self._decode_s(shape.num_decodes, shape.decode_context_sum, shape.decode_context_max) + swap
        if pad is not None:
            rows = pad.num_rows
            num_tokens = rows * pad.row_tokens
            if pad.row_tokens == 1:
                attn = self._decode_per_ctx_s * (rows * pad.context_tokens)
            else:  # dense rectangle: every row attends to the whole padded context
                attn = rows * self._chunk_s(pad.row_tokens, pad.context_tokens, pad.row_tokens * pad.context_tokens)
        else:
            rows = len(shape.prefill_tokens) + shape.num_decodes
            num_tokens = shape.num_tokens
            longest = shape.decode_context_max * self._longest_factor
            ctx = shape.decode_context_sum
            attn = self._decode_per_ctx_s * (ctx if ctx > longest else longest)
            for chunk, context in zip(shape.prefill_tokens, shape.prefill_context):
                attn += self._chunk_s(chunk, context, chunk * context - chunk * (chunk - 1) // 2)
        return self._num_layers * (self._layer_s(num_tokens) + attn) + self._tail_s(num_tokens, rows) + swap

    # ---- pieces ----
    def _decode_s(self, num_decodes, context_sum, context_max):
        """Pure-decode step; the contexts may be arrays (the same operations either way)."""
        work = bubble_work(context_sum, context_max * self._longest_factor)
        layer = self._layer_s(num_decodes) + self._decode_per_ctx_s * work
        return self._num_layers * layer + self._tail_s(num_decodes, num_decodes)

    def _layer_s(self, num_tokens: int) -> float:
        t = self._layer_fixed_s + self._layer_per_token_s * num_tokens
        for cf, cw, ca in self._gemms:
            compute, memory = cf * num_tokens, cw + ca * num_tokens
            t += compute if compute > memory else memory
        return t

    def _chunk_s(self, chunk: int, context: int, pairs: int) -> float:
        compute = self._pair_s * pairs
        memory = self._kv_read_s * context + self._q_io_s * chunk
        return compute if compute > memory else memory

    def _tail_s(self, num_tokens: int, num_rows: int) -> float:
        t = self._tail_fixed_s + self._tail_per_token_s * num_tokens
        if self._lm_head is not None:
            floor, cf, cw, ca = self._lm_head
            compute, memory = cf * num_rows, cw + ca * num_rows
            t += floor + (compute if compute > memory else memory)
        return t


def _coefficients(shape: OpShape, eff: OpEfficiency, peak: float, bw: float) -> tuple[float, float, float, float]:
    """(fixed_s, compute_s_per_token, weight_s, memory_s_per_token), summed over ``shape.count``."""
    n = shape.count
    return (n * eff.floor_s, n * shape.flops_per_token / (peak * eff.compute),
            n * shape.weight_bytes / (bw * eff.memory), n * shape.bytes_per_token / (bw * eff.memory))


@register_cost_model("roofline")
def roofline_for_instance(instance: InstanceSpec, params: RooflineParams | None = None) -> RooflineCostModel:
    """The roofline with ``params``, or else the GPU's profile-fitted ones (``params_for_gpu``)."""
    return RooflineCostModel(instance, params if params is not None else params_for_gpu(instance.gpu))


def roofline_for(gpu_name: str, model_name: str, tp: int = 1, pp: int = 1) -> RooflineCostModel:
    """Roofline for a catalog GPU and model, fitted to the profiles of its GPU family when
    they exist (A100 / H100 families) and on the documented defaults otherwise."""
    return roofline_for_instance(InstanceSpec(gpu=gpu_name, model=model_name, tp=tp, pp=pp))
