"""Model configuration for the Llama-family decoder, parsed from a HF ``config.json`` dict.

Plain Python, no torch: the loader builds a ``ModelConfig`` from a checkpoint folder and the
tiny-model writer builds one from keyword arguments, then serialises it back to HF fields.
Supported: ``LlamaForCausalLM`` (Llama-2/3) and ``Qwen2ForCausalLM`` (Qwen2/2.5: q/k/v
bias). RoPE scaling: default, ``linear``, ``llama3``, and ``dynamic`` (identical to default
within ``max_position_embeddings``, which is also the length of our RoPE table).

Invariants: ``num_heads % num_kv_heads == 0``; ``head_dim`` is even; ``rope_scaling`` is
validated for the type it names.
"""

from __future__ import annotations

from dataclasses import dataclass

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
ROPE_TYPES = ("default", "linear", "dynamic", "llama3")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position: int = 8192  # llama3 only

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope_scaling type {self.rope_type!r}; supported: {ROPE_TYPES}")
        if not self.factor > 0:
            raise ValueError(f"rope_scaling factor must be > 0, got {self.factor}")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError("llama3 rope_scaling needs high_freq_factor > low_freq_factor")

    @classmethod
    def from_hf(cls, d: dict | None) -> RopeScaling | None:
        if not d:
            return None
        rope_type = d.get("rope_type", d.get("type", "default"))
        if rope_type == "default":
            return None
        return cls(rope_type=rope_type, factor=float(d.get("factor", 1.0)),
                   low_freq_factor=float(d.get("low_freq_factor", 1.0)),
                   high_freq_factor=float(d.get("high_freq_factor", 4.0)),
                   original_max_position=int(d.get("original_max_position_embeddings", 8192)))

    def to_hf(self) -> dict:
        d: dict = {"rope_type": self.rope_type, "factor": self.factor}
        if self.rope_type == "llama3":
            d.update(low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor,
                     original_max_position_embeddings=self.original_max_position)
        return d


@dataclass(frozen=True, slots=True)
class ModelConfig:
    arch: str = "llama"  # "llama" | "qwen2"
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    max_position: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (always on for qwen2)
    bos_token_id: int | None = 0
    eos_token_ids: tuple[int, ...] = (1,)
    torch_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES.values():
            raise ValueError(f"unsupported arch {self.arch!r}; supported: {sorted(ARCHITECTURES.values())}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.torch_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"unsupported torch_dtype {self.torch_dtype!r}")

    @property
    def num_params(self) -> int:
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = self.hidden_size * (q + 2 * kv) + q * self.hidden_size + (q + 2 * kv) * self.attention_bias
        mlp = 3 * self.hidden_size * self.intermediate_size
        per_layer = attn + mlp + 2 * self.hidden_size
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)
        return self.num_layers * per_layer + embed + self.hidden_size

    @classmethod
    def from_hf(cls, d: dict) -> ModelConfig:
        archs = d.get("architectures") or []
        known = [a for a in archs if a in ARCHITECTURES]
        if not known:
            raise ValueError(f"unsupported architectures {archs}; supported: {sorted(ARCHITECTURES)}")
        arch = ARCHITECTURES[known[0]]
        num_heads = d["num_attention_heads"]
        rope = d.get("rope_parameters") or {}  # transformers 5 format: theta inside
        rope_theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
        scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
        return cls(
            arch=arch, vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_layers=d["num_hidden_layers"],
            num_heads=num_heads, num_kv_heads=d.get("num_key_value_heads") or num_heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // num_heads,
            max_position=d.get("max_position_embeddings", 2048), rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta, rope_scaling=RopeScaling.from_hf(scaling),
            tie_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2" or bool(d.get("attention_bias", False)),
            bos_token_id=d.get("bos_token_id"), eos_token_ids=eos_ids,
            torch_dtype=d.get("torch_dtype") or d.get("dtype") or "float32",
        )

    def to_hf(self) -> dict:
        d = {
            "architectures": ["LlamaForCausalLM" if self.arch == "llama" else "Qwen2ForCausalLM"],
            "model_type": self.arch,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "hidden_act": "silu", "max_position_embeddings": self.max_position,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.to_hf() if self.rope_scaling else None,
            "tie_word_embeddings": self.tie_embeddings, "initializer_range": 0.02,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else list(self.eos_token_ids),
            "torch_dtype": self.torch_dtype, "use_cache": True,
        }
        if self.arch == "llama":
            d.update(attention_bias=self.attention_bias, mlp_bias=False, pretraining_tp=1)
        else:
            d.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_layers)
        return d
