"""Model catalog: transformer shapes from each model's Hugging Face ``config.json``.

Only what serving cost depends on: layer count and widths (weights, FLOPs, KV bytes).
Parameter counts are derived, not stored, and tests check them against the published sizes.
Approximations: norms count one weight vector (two with ``linear_bias``, i.e. LayerNorm with
bias); OPT's learned positional table is ``max_context + 2`` rows (its offset of 2);
rotary tables and buffers hold no parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.core.errors import UnknownNameError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool  # SwiGLU (gate + up + down) rather than up + down
    tied_embeddings: bool  # LM head shares the input embedding
    max_context: int
    source: str
    qkv_bias: bool = False  # Qwen2: bias on Q, K, V only
    linear_bias: bool = False  # OPT: bias on every linear layer, LayerNorm with bias
    learned_positions: bool = False  # OPT: learned absolute position embeddings

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                           "intermediate_size", "vocab_size", "max_context"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"ModelSpec {self.name}: {field_name} must be >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelSpec {self.name}: num_heads {self.num_heads} is not a multiple "
                             f"of num_kv_heads {self.num_kv_heads}")

    # ---- widths ----
    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of K (and of V) per token per layer."""
        return self.num_kv_heads * self.head_dim

    @property
    def mlp_in_size(self) -> int:
        """Output width of the up projection (gate and up fused when gated)."""
        return (2 if self.gated_mlp else 1) * self.intermediate_size

    # ---- parameters ----
    @property
    def linear_params_per_layer(self) -> int:
        """Weight-matrix entries of one layer (QKV, O, MLP); what a token multiplies through."""
        h = self.hidden_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        mlp = h * self.mlp_in_size + self.intermediate_size * h
        return attn + mlp

    @property
    def params_per_layer(self) -> int:
        h = self.hidden_size
        bias = 0
        if self.qkv_bias or self.linear_bias:
            bias += self.q_size + 2 * self.kv_size
        if self.linear_bias:
            bias += h + self.mlp_in_size + h  # O, up, down
        norms = 2 * h * (2 if self.linear_bias else 1)
        return self.linear_params_per_layer + bias + norms

    @property
    def embedding_params(self) -> int:
        positions = (self.max_context + 2) * self.hidden_size if self.learned_positions else 0
        return self.vocab_size * self.hidden_size + positions

    @property
    def lm_head_params(self) -> int:
        """LM head plus the final norm; a tied head adds only the norm."""
        norm = self.hidden_size * (2 if self.linear_bias else 1)
        return norm + (0 if self.tied_embeddings else self.vocab_size * self.hidden_size)

    @property
    def num_params(self) -> int:
        return self.num_layers * self.params_per_layer + self.embedding_params + self.lm_head_params

    def param_bytes(self, dtype_bytes: int = 2) -> int:
        return self.num_params * dtype_bytes

    # ---- KV cache ----
    def kv_bytes_per_token_per_layer(self, dtype_bytes: int = 2) -> int:
        return 2 * self.kv_size * dtype_bytes  # K and V

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return self.num_layers * self.kv_bytes_per_token_per_layer(dtype_bytes)

    # ---- compute ----
    @property
    def flops_per_token(self) -> int:
        """Linear-layer FLOPs of one token through every layer (2 per weight), LM head excluded."""
        return 2 * self.num_layers * self.linear_params_per_layer

    @property
    def lm_head_flops_per_token(self) -> int:
        """FLOPs of projecting one sampled token onto the vocabulary."""
        return 2 * self.hidden_size * self.vocab_size


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


def _llama(name, repo, layers, hidden, heads, kv_heads, inter, vocab, context):
    return ModelSpec(name, layers, hidden, heads, kv_heads, hidden // heads, inter, vocab,
                     gated_mlp=True, tied_embeddings=False, max_context=context, source=_hf(repo))


def _qwen25(name, repo, layers, hidden, heads, inter):
    # Qwen2.5 instruct configs: 8 KV heads, 152064 vocab, QKV bias, 32K native context.
    return ModelSpec(name, layers, hidden, heads, 8, hidden // heads, inter, 152064,
                     gated_mlp=True, tied_embeddings=False, max_context=32768, source=_hf(repo),
                     qkv_bias=True)


def _opt(name, repo, layers, hidden, heads):
    # OPT: MHA, ReLU MLP with ffn_dim = 4 * hidden, 50272 vocab, tied LM head, 2048 learned positions.
    return ModelSpec(name, layers, hidden, heads, heads, hidden // heads, 4 * hidden, 50272,
                     gated_mlp=False, tied_embeddings=True, max_context=2048, source=_hf(repo),
                     linear_bias=True, learned_positions=True)


# (spec, Hugging Face repo ids and other aliases)
_ENTRIES: tuple[tuple[ModelSpec, tuple[str, ...]], ...] = (
    (_llama("Llama-2-7B", "meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 11008, 32000, 4096),
     ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf")),
    (_llama("Llama-2-13B", "meta-llama/Llama-2-13b-hf", 40, 5120, 40, 40, 13824, 32000, 4096),
     ("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf")),
    (_llama("Llama-2-70B", "meta-llama/Llama-2-70b-hf", 80, 8192, 64, 8, 28672, 32000, 4096),
     ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf")),
    (_llama("Llama-3.1-8B", "meta-llama/Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256, 131072),
     ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B",
      "meta-llama/Meta-Llama-3.1-8B-Instruct")),
    (_qwen25("Qwen-2.5-14B", "Qwen/Qwen2.5-14B-Instruct", 48, 5120, 40, 13824),
     ("Qwen/Qwen2.5-14B", "Qwen/Qwen2.5-14B-Instruct")),
    (_qwen25("Qwen-2.5-32B", "Qwen/Qwen2.5-32B-Instruct", 64, 5120, 40, 27648),
     ("Qwen/Qwen2.5-32B", "Qwen/Qwen2.5-32B-Instruct")),
    (_qwen25("Qwen-2.5-72B", "Qwen/Qwen2.5-72B-Instruct", 80, 8192, 64, 29568),
     ("Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct")),
    (_opt("OPT-2.7B", "facebook/opt-2.7b", 32, 2560, 32), ("facebook/opt-2.7b",)),
    (_opt("OPT-6.7B", "facebook/opt-6.7b", 32, 4096, 32), ("facebook/opt-6.7b",)),
    (_opt("OPT-13B", "facebook/opt-13b", 40, 5120, 40), ("facebook/opt-13b",)),
    (_opt("OPT-30B", "facebook/opt-30b", 48, 7168, 56), ("facebook/opt-30b",)),
    (ModelSpec("Phi-3.5-mini", 32, 3072, 32, 32, 96, 8192, 32064, gated_mlp=True, tied_embeddings=False,
               max_context=131072, source=_hf("microsoft/Phi-3.5-mini-instruct")),
     ("microsoft/Phi-3.5-mini-instruct",)),
)

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec, _ in _ENTRIES}


def _key(name: str) -> str:
    """Spelling-insensitive key: case, '-', '_', spaces and a ``-hf`` suffix are ignored."""
    key = name.strip().lower()
    if key.endswith("-hf"):
        key = key[:-3]
    return key.replace("-", "").replace("_", "").replace(" ", "")


_BY_KEY: dict[str, str] = {}
for _spec, _aliases in _ENTRIES:
    for _alias in (_spec.name, *_aliases):
        _BY_KEY[_key(_alias)] = _spec.name
        _BY_KEY[_key(_alias.rsplit("/", 1)[-1])] = _spec.name


def get_model(name: str) -> ModelSpec:
    """Look a model up by catalog name or Hugging Face id, case-insensitively
    ("llama-2-7b", "meta-llama/Llama-2-7b-hf", "qwen2.5-14b")."""
    canonical = _BY_KEY.get(_key(name))
    if canonical is None:
        raise UnknownNameError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[canonical]
