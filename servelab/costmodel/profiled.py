"""Profile-driven step cost: measured operator tables, a named attention kernel, measured
collectives and a measured per-step CPU overhead (issue 23; Vidur's approach, kept exact).

    step = layers * (ops(T) + all_reduce(T) + attention) + embed(T) + pp_sends(T)
           + lm_head(rows) + cpu_overhead(rows) + swaps

- ``ops(T)``: the layer's non-attention operators from the GPU family's measured tables
  (``op_profiles``; each op says measured / same-shape / scaled), the roofline only for what
  no profile covers (the LM head, a family without profiles); summed over T, then made
  non-decreasing by a running maximum (a bigger chunk never costs less);
- ``all_reduce(T)``: two per layer at TP > 1 over [T, hidden], ``pp_sends``: one per stage
  boundary, both from the measured NCCL tables (``collectives``);
- ``attention``: the decode kernel named by ``CostOptions.attention_kernel`` (``attention``)
  plus FlashAttention-style prefill chunks from FLOPs;
- ``cpu_overhead(rows)``: ``cpu_overhead`` (measured by batch size and TP, flat, or off).

Speed: everything that depends only on T or rows is summed once per instance into dense
lists (``TOKEN_TABLE_MAX`` tokens, ``ROW_TABLE_MAX`` rows; beyond them the same functions are
evaluated on demand), so a step is two list lookups plus the attention arithmetic, and
``decode_step_times_s`` is the same expression over numpy arrays, bit for bit equal to the
scalar step (the fast-forward contract of ``base.CostModel``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servelab.catalog.instance import InstanceSpec, kv_bytes_per_block, kv_bytes_per_token
from servelab.core.plan import StepShape
from servelab.costmodel.attention import coefficients_for, default_kernel, make_kernel
from servelab.costmodel.base import StepArraysMixin, register_cost_model
from servelab.costmodel.collectives import all_reduce_table, send_recv_table
from servelab.costmodel.cpu_overhead import cpu_overhead_for, default_mode
from servelab.costmodel.links import LinkSpec
from servelab.costmodel.op_resolve import TokenFn, resolve_embed, resolve_layer_ops, roofline_fn
from servelab.costmodel.ops import RooflineParams, lm_head_shape
from servelab.costmodel.options import CostOptions

TOKEN_TABLE_MAX = 16384
ROW_TABLE_MAX = 2048


class ProfiledCostModel(StepArraysMixin):
    def __init__(self, instance: InstanceSpec, options: CostOptions, params: RooflineParams, data_dir: Path,
                 kernel_profile=None) -> None:
        self.instance, self.options, self.params = instance, options, params
        gpu, model = instance.gpu_spec, instance.model_spec
        self._layers = instance.num_layers_held
        self._kv_bytes_per_token = kv_bytes_per_token(instance)
        self._block_bytes = kv_bytes_per_block(instance)
        self._swap_link = LinkSpec(gpu.pcie_bandwidth_bytes_per_s * instance.num_gpus * params.swap_efficiency,
                                   params.comm_latency_s)
        self.sources: dict[str, str] = {}
        ops = resolve_layer_ops(instance, params, data_dir, kernel_profile)
        self.sources.update({f"op {s.op}": f"{s.kind}: {s.detail}" for _, _, _, s in ops})
        self._layer_fns: list[tuple[int, TokenFn]] = [(count, fn) for _, count, fn, _ in ops]
        self._init_collectives(data_dir)
        self._init_tail(data_dir)
        kernel_name = options.attention_kernel or default_kernel(gpu.name)
        coefficients = coefficients_for(gpu, model, instance.tp, instance.dtype_bytes)
        if kernel_profile is not None:
            coefficients = kernel_profile.coefficients(kernel_name, instance, coefficients)
        self.kernel = make_kernel(kernel_name, coefficients)
        why = "named" if options.attention_kernel else f"default for {gpu.name}"
        self.sources["attention"] = f"{kernel_name} ({why}); {coefficients.source}"
        mode = options.cpu_overhead or default_mode(gpu.name)
        self.overhead = cpu_overhead_for(mode, gpu.name, float(model.num_params), instance.tp, data_dir)
        if kernel_profile is not None and options.cpu_overhead is None:
            self.overhead = kernel_profile.overhead()
        self.sources["cpu_overhead"] = self.overhead.detail
        tokens = np.arange(TOKEN_TABLE_MAX + 1, dtype=float)
        # running maximum: measured GEMMs dip at tile boundaries, but a step of more tokens never costs less
        self._layer_list = np.maximum.accumulate(self._layer_fn(tokens)).tolist()
        self._tail_list = np.maximum.accumulate(self._tail_fn(tokens)).tolist()
        self._row_list = self._rows_fn(np.arange(ROW_TABLE_MAX + 1, dtype=float)).tolist()

    def _init_collectives(self, data_dir: Path) -> None:
        inst, gpu = self.instance, self.instance.gpu_spec
        from servelab.costmodel.op_profiles import GPU_FAMILIES

        family, profiled = GPU_FAMILIES.get(gpu.name, (None, None))
        scale = 1.0
        if profiled is not None:
            from servelab.catalog.gpus import get_gpu

            scale = get_gpu(profiled).nvlink_bandwidth_bytes_per_s / gpu.nvlink_bandwidth_bytes_per_s
        message = inst.model_spec.hidden_size * inst.dtype_bytes  # bytes per token of [T, hidden]
        self._message_bytes = message
        self._all_reduce = None
        if inst.tp > 1:
            self._all_reduce = all_reduce_table(family, inst.tp, str(data_dir), scale) if family else None
            self.sources["all_reduce"] = (self._all_reduce.detail if self._all_reduce else
                                          f"roofline ring formula (no measured all-reduce for {inst.tp} GPUs)")
        self._pp_send = None
        if inst.pp > 1:
            kind = "nvlink" if inst.num_gpus <= 8 else "network"
            table_scale = scale if kind == "nvlink" else 1.0
            self._pp_send = send_recv_table(family, kind, str(data_dir), table_scale) if family else None
            self.sources["pp_send"] = (self._pp_send.detail if self._pp_send else
                                       "roofline link formula (no measured send/recv)")

    def _init_tail(self, data_dir: Path) -> None:
        inst, p = self.instance, self.params
        gpu, model, d = inst.gpu_spec, inst.model_spec, inst.dtype_bytes
        self._embed = None
        if inst.holds_first_layer:
            self._embed, source = resolve_embed(inst, p, data_dir)
            self.sources["op embed"] = f"{source.kind}: {source.detail}"
        self._lm_head = roofline_fn(lm_head_shape(model.hidden_size, model.vocab_size, inst.tp, d), p.op("lm_head"),
                                    gpu) if inst.holds_last_layer else None
        if self._lm_head is not None:
            self.sources["lm_head"] = "roofline (the profiles hold no LM head)"

    # ---- functions of T and rows, evaluated once into the dense lists ----
    def _layer_fn(self, tokens: np.ndarray) -> np.ndarray:
        t = np.zeros_like(tokens)
        for count, fn in self._layer_fns:
            t = t + count * fn(tokens)
        if self.instance.tp > 1:
            t = t + 2 * self._all_reduce_s(tokens * self._message_bytes)
        return np.where(tokens > 0, t, 0.0)

    def _all_reduce_s(self, num_bytes: np.ndarray) -> np.ndarray:
        if self._all_reduce is not None:
            return self._all_reduce.time_s(num_bytes)
        p, tp = self.params, self.instance.tp
        bw = self.instance.gpu_spec.nvlink_bandwidth_bytes_per_s * p.comm_efficiency
        return np.where(num_bytes > 0, p.comm_latency_s + 2 * (tp - 1) / tp * num_bytes / bw, 0.0)

    def _tail_fn(self, tokens: np.ndarray) -> np.ndarray:
        t = np.zeros_like(tokens)
        if self._embed is not None:
            t = t + self._embed(tokens)
        pp = self.instance.pp
        if pp > 1:
            num_bytes = tokens * self._message_bytes
            if self._pp_send is not None:
                send = self._pp_send.time_s(num_bytes)
            else:
                gpu, p = self.instance.gpu_spec, self.params
                bw = (gpu.nvlink_bandwidth_bytes_per_s if self.instance.num_gpus <= 8
                      else gpu.network_bandwidth_bytes_per_s) * p.comm_efficiency
                send = p.comm_latency_s + num_bytes / bw
            t = t + (pp - 1) * send
        return np.where(tokens > 0, t, 0.0)

    def _rows_fn(self, rows: np.ndarray) -> np.ndarray:
        t = np.asarray(self.overhead.dense(int(rows[-1])), dtype=float)[rows.astype(int)]
        if self._lm_head is not None:
            t = t + self._lm_head(rows)
        return np.where(rows > 0, t, 0.0)

    def _layer_at(self, num_tokens: int) -> float:
        if num_tokens <= TOKEN_TABLE_MAX:
            return self._layer_list[num_tokens]
        return max(float(self._layer_fn(np.array([float(num_tokens)]))[0]), self._layer_list[-1])

    def _tail_at(self, num_tokens: int) -> float:
        if num_tokens <= TOKEN_TABLE_MAX:
            return self._tail_list[num_tokens]
        return max(float(self._tail_fn(np.array([float(num_tokens)]))[0]), self._tail_list[-1])

    def _rows_at(self, rows: int) -> float:
        if rows <= ROW_TABLE_MAX:
            return self._row_list[rows]
        return float(self._rows_fn(np.arange(rows + 1, dtype=float))[rows])

    # ---- the CostModel protocol ----
    def step_time_s(self, shape: StepShape) -> float:
        swap = self.swap_time_s(shape.swap_blocks) if shape.swap_blocks else 0.0
        pad = shape.padding
        if pad is None and not shape.prefill_tokens:
            if shape.num_decodes == 0:
                return swap
            return self._decode_s(shape.num_decodes, shape.decode_context_sum, shape.decode_context_max) + swap
        c = self.kernel.coefficients
        if pad is not None:  # a dense rectangle the policy padded itself: every row attends to the padded context
            rows = pad.num_rows
            num_tokens = rows * pad.row_tokens
            if pad.row_tokens == 1:
                attn = c.floor_s + c.row_s * rows + c.kv_read_s * (rows * pad.context_tokens)
            else:
                attn = c.floor_s + rows * c.chunk_s(pad.row_tokens, pad.context_tokens,
                                                    pad.row_tokens * pad.context_tokens)
        else:
            rows = len(shape.prefill_tokens) + shape.num_decodes
            num_tokens = shape.num_tokens
            attn = c.floor_s
            for chunk, context in zip(shape.prefill_tokens, shape.prefill_context):
                attn += c.chunk_s(chunk, context, chunk * context - chunk * (chunk - 1) // 2)
            if shape.num_decodes:
                attn += self.kernel.decode_s(shape.num_decodes, shape.decode_context_sum, shape.decode_context_max)
        return (self._layers * (self._layer_at(num_tokens) + attn) + self._tail_at(num_tokens)
                + self._rows_at(rows) + swap)

    def _decode_s(self, num_decodes, context_sum, context_max):
        """Pure-decode step; the contexts may be arrays (the same operations either way)."""
        attn = self.kernel.decode_s(num_decodes, context_sum, context_max)
        return (self._layers * (self._layer_at(num_decodes) + attn) + self._tail_at(num_decodes)
                + self._rows_at(num_decodes))

    def describe(self) -> dict[str, str]:
        """Where every term comes from, for a run's ``context`` block."""
        return {"kind": "profile", "gpu": self.instance.gpu, "model": self.instance.model,
                "tp": str(self.instance.tp), "pp": str(self.instance.pp), **self.sources}


@register_cost_model("profile")
def profiled_for_instance(instance: InstanceSpec, options: CostOptions | None = None,
                          data_dir: str | Path | None = None) -> ProfiledCostModel:
    from servelab.costmodel.profile_fit import params_for_gpu
    from servelab.paths import default_data_dir

    options = options if options is not None else CostOptions()
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    profile = None
    if options.kernel_profile:
        from servelab.costmodel.kernel_profile import KernelProfile

        profile = KernelProfile.load(options.kernel_profile)
    return ProfiledCostModel(instance, options, params_for_gpu(instance.gpu), root, profile)
