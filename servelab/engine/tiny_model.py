"""Write a random-weight Llama/Qwen2 checkpoint in HF format, with a locally trained tokenizer.

Tests and benchmarks need a real checkpoint folder without downloads: this writes
``config.json``, ``generation_config.json``, ``model.safetensors`` (HF tensor names),
``tokenizer.json`` (byte-level BPE trained with ``tokenizers`` on GSM8K question + answer
text, or on the given texts) and ``tokenizer_config.json`` (with a simple chat template). HF
transformers loads the folder with ``from_pretrained``, so it is also the reference our engine
is tested against.

Weights are seeded, with std 1/sqrt(fan_in) (embeddings std 1), so every layer changes the
residual stream noticeably and logits spread over a few units: greedy argmax has clear
winners and a wrong attention path changes the output. Special tokens: ``<s>`` = 0,
``</s>`` = 1, ``<unk>`` = 2. The tokenizer prepends ``<s>`` when encoding with special tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from servelab.engine.config import ModelConfig, RopeScaling
from servelab.paths import gsm8k_path

# the shared data folder sits next to the repository (see ../shared/data/README.md)
GSM8K_PATH = gsm8k_path()
SPECIAL_TOKENS = ("<s>", "</s>", "<unk>")
# A plain role-tagged chat format (HF Jinja, as ``tokenizer_config.json`` carries it): the
# server's /v1/chat/completions renders it; the random model has no chat training anyway.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")

# ~196M parameters: for decode benchmarks on CPU (0.78 GB of fp32 weights).
BENCH_200M = dict(hidden_size=1024, num_layers=16, num_heads=16, num_kv_heads=4, intermediate_size=2816,
                  vocab_size=8192, max_position=4096)
# ~30M parameters: for whole-workload engine runs (policy comparisons) that must finish in minutes on CPU.
BENCH_30M = dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=2, intermediate_size=1408,
                 vocab_size=8192, max_position=4096)


def gsm8k_texts(path: Path = GSM8K_PATH, limit: int | None = None) -> list[str]:
    texts = []
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            texts.append(row["question"] + "\n" + row["answer"])
            if limit is not None and len(texts) >= limit:
                break
    return texts


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 0)])
    return tok


def random_hf_weights(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int, scale: float | None = None) -> torch.Tensor:
        # default: variance-preserving (std = fan_in ** -0.5), so every layer moves the residual
        return torch.randn(*shape, generator=gen) * (shape[-1] ** -0.5 if scale is None else scale)

    h, q, kv = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    w = {"model.embed_tokens.weight": normal(config.vocab_size, h, scale=1.0),
         "model.norm.weight": 1.0 + normal(h, scale=0.1)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = normal(q, h)
        w[p + "self_attn.k_proj.weight"] = normal(kv, h)
        w[p + "self_attn.v_proj.weight"] = normal(kv, h)
        w[p + "self_attn.o_proj.weight"] = normal(h, q)
        if config.attention_bias:
            for name, n in (("q", q), ("k", kv), ("v", kv)):
                w[p + f"self_attn.{name}_proj.bias"] = normal(n, scale=0.1)
        w[p + "mlp.gate_proj.weight"] = normal(config.intermediate_size, h)
        w[p + "mlp.up_proj.weight"] = normal(config.intermediate_size, h)
        w[p + "mlp.down_proj.weight"] = normal(h, config.intermediate_size)
        w[p + "input_layernorm.weight"] = 1.0 + normal(h, scale=0.1)
        w[p + "post_attention_layernorm.weight"] = 1.0 + normal(h, scale=0.1)
    if not config.tie_embeddings:
        w["lm_head.weight"] = normal(config.vocab_size, h)
    return w


def make_tiny_model(out_dir: str | Path, *, arch: str = "llama", hidden_size: int = 64, num_layers: int = 2,
                    num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 128, vocab_size: int = 512,
                    max_position: int = 2048, tie_embeddings: bool = False, rope_theta: float = 10000.0,
                    rope_scaling: dict | None = None, seed: int = 0, dtype: str = "float32",
                    texts: Iterable[str] | None = None, tokenizer: Tokenizer | None = None) -> Path:
    """Write the checkpoint folder and return its path.

    ``vocab_size`` is the tokenizer's target vocabulary and the model's embedding rows; if the
    text yields fewer BPE merges, the extra rows are simply never produced by the tokenizer.
    Pass ``tokenizer`` to reuse one already trained (tests train it once).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = ModelConfig(arch=arch, vocab_size=vocab_size, hidden_size=hidden_size,
                         intermediate_size=intermediate_size, num_layers=num_layers, num_heads=num_heads,
                         num_kv_heads=num_kv_heads, head_dim=hidden_size // num_heads, max_position=max_position,
                         rope_theta=rope_theta, rope_scaling=RopeScaling.from_hf(rope_scaling),
                         tie_embeddings=tie_embeddings, attention_bias=arch == "qwen2", bos_token_id=0,
                         eos_token_ids=(1,), torch_dtype=dtype)
    if tokenizer is None:
        tokenizer = train_tokenizer(gsm8k_texts() if texts is None else texts, vocab_size)
    if tokenizer.get_vocab_size() > vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.get_vocab_size()} tokens, model vocab_size is {vocab_size}")
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": max_position, "chat_template": CHAT_TEMPLATE}, indent=2))
    (out / "config.json").write_text(json.dumps(config.to_hf(), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 1, "do_sample": False}, indent=2))
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    weights = {k: v.to(torch_dtype).contiguous() for k, v in random_hf_weights(config, seed).items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
