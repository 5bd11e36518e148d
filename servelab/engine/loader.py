"""Load a HF-format checkpoint folder from disk into ``Model``: config, weights, tokenizer.

Reads ``config.json``, every ``*.safetensors`` shard (through ``model.safetensors.index.json``
when present), ``tokenizer.json`` and, when present, ``generation_config.json``. Nothing is
downloaded. Every failure names the file it is about.

HF tensor names map onto the fused layout of ``servelab.engine.model``: q/k/v projections
(and their biases) concatenate into ``qkv_proj``, gate/up into ``gate_up_proj``. A checkpoint
must provide every tensor the model needs; ``lm_head.weight`` may be absent when embeddings
are tied. Tensors are converted to the requested dtype on load.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from servelab.core.errors import UserError, shown
from servelab.engine.config import ModelConfig
from servelab.engine.device import resolve_device, resolve_dtype
from servelab.engine.model import Model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(UserError):
    """A checkpoint folder or file that cannot be used; the message names the file."""


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None


@dataclass(frozen=True, slots=True, eq=False)
class LoadedModel:
    path: Path
    config: ModelConfig
    model: Model | None  # None when loaded with weights=False (the HTTP side of servelab serve)
    tokenizer: Tokenizer
    generation: GenerationDefaults
    dtype: torch.dtype | None = None  # what the weights are (or would be) loaded in


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"missing file: {path}")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"invalid JSON in {path}: {e}") from None
    except (ValueError, RecursionError) as e:  # a number beyond int's digit limit, deep nesting
        raise CheckpointError(f"{path}: unreadable JSON ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


_INT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "max_position_embeddings", "bos_token_id")
_FLOAT_KEYS = ("rms_norm_eps", "rope_theta")
_MAX_SIZE = 2**31 - 1  # any model dimension or token id fits a C int


def _check_config_types(d: dict, path: Path) -> None:
    """HF config numbers typed strictly: a JSON ``true`` is not 1 layer, nor "64" a width."""
    for key in _INT_KEYS:
        value = d.get(key)
        if value is not None and (type(value) is not int or not 0 <= value <= _MAX_SIZE):
            raise CheckpointError(f"{path}: {key} must be an integer in [0, {_MAX_SIZE:,}], got {shown(value)}")
    for key in _FLOAT_KEYS:
        value = d.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise CheckpointError(f"{path}: {key} must be a finite number > 0, got {shown(value)}")


def load_config(folder: str | Path) -> ModelConfig:
    path = Path(folder) / "config.json"
    d = _read_json(path)
    _check_config_types(d, path)
    try:
        return ModelConfig.from_hf(d)
    except (KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: unsupported or incomplete config ({type(e).__name__}: {e})") from None


def load_tokenizer(folder: str | Path) -> Tokenizer:
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"missing file: {path}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise CheckpointError(f"cannot read tokenizer {path}: {e}") from e


def load_generation_defaults(folder: str | Path, config: ModelConfig) -> GenerationDefaults:
    path = Path(folder) / "generation_config.json"
    d = _read_json(path) if path.is_file() else {}

    def typed(key: str, kinds: tuple[type, ...], default=None):
        value = d.get(key, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            raise CheckpointError(f"{path}: {key} must be {' or '.join(k.__name__ for k in kinds)}, got {shown(value)}")
        return value

    eos = d.get("eos_token_id")
    eos_list = eos if isinstance(eos, list) else [eos]
    if eos is not None and not all(type(e) is int for e in eos_list):
        raise CheckpointError(f"{path}: eos_token_id must be an integer or a list of integers, got {shown(eos)}")
    eos_ids = config.eos_token_ids if eos is None else tuple(eos_list)
    return GenerationDefaults(eos_token_ids=eos_ids, bos_token_id=typed("bos_token_id", (int,), config.bos_token_id),
                              temperature=typed("temperature", (int, float)), top_k=typed("top_k", (int,)),
                              top_p=typed("top_p", (int, float)), max_new_tokens=typed("max_new_tokens", (int,)))


def shard_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(_read_json(index).get("weight_map", {}).values()))
        files = [folder / n for n in names]
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"missing shard {f} (listed in {index})")
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors weights in {folder}")
    return files


def read_tensors(folder: str | Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in shard_files(folder):
        try:
            with safe_open(str(f), framework="pt", device="cpu") as sf:
                for name in sf.keys():
                    tensors[name] = sf.get_tensor(name)
        except Exception as e:  # safetensors raises its own error types on a corrupt header
            raise CheckpointError(f"cannot read weights {f}: {e}") from e
    return tensors


def hf_to_model_state(tensors: dict[str, torch.Tensor], config: ModelConfig, where: str = "") -> dict[str, torch.Tensor]:
    """Rename and fuse HF tensors into this package's ``Model`` state dict."""
    remaining = {k: v for k, v in tensors.items() if not k.endswith(_IGNORED_SUFFIXES)}

    def take(name: str) -> torch.Tensor:
        if name not in remaining:
            raise CheckpointError(f"{where}: missing tensor {name!r}")
        return remaining.pop(name)

    state = {"embed_tokens.weight": take("model.embed_tokens.weight"), "norm.weight": take("model.norm.weight")}
    if "lm_head.weight" in remaining or not config.tie_embeddings:
        state["lm_head.weight"] = take("lm_head.weight")
    for i in range(config.num_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        attn = hf + "self_attn."
        state[ours + "self_attn.qkv_proj.weight"] = torch.cat([take(f"{attn}{p}_proj.weight") for p in "qkv"])
        if config.attention_bias:
            state[ours + "self_attn.qkv_proj.bias"] = torch.cat([take(f"{attn}{p}_proj.bias") for p in "qkv"])
        state[ours + "self_attn.o_proj.weight"] = take(attn + "o_proj.weight")
        state[ours + "mlp.gate_up_proj.weight"] = torch.cat(
            [take(hf + "mlp.gate_proj.weight"), take(hf + "mlp.up_proj.weight")])
        state[ours + "mlp.down_proj.weight"] = take(hf + "mlp.down_proj.weight")
        state[ours + "input_layernorm.weight"] = take(hf + "input_layernorm.weight")
        state[ours + "post_attention_layernorm.weight"] = take(hf + "post_attention_layernorm.weight")
    if remaining:
        raise CheckpointError(f"{where}: unexpected tensors {sorted(remaining)[:5]} (unsupported variant?)")
    return state


_INIT_FUNCTIONS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                   "xavier_normal_", "trunc_normal_", "zeros_", "ones_", "constant_")


@contextmanager
def _allocated_without_init(dtype: torch.dtype, device: torch.device | str):
    """Build modules straight on ``device`` in ``dtype`` with ``torch.nn.init``'s fillers as no-ops.

    Why: the checkpoint overwrites every value, so random init is wasted work; and building on
    the meta device and then ``to_empty`` (the earlier way) runs torch's prims references, whose
    first calls import ``torch._dynamo`` and sympy (about 3 CPU-s on this machine, in every
    process that loads a model: each server, engine process and Ray actor). The default dtype
    makes a bf16 model allocate in bf16 directly (no float32 copy to cast)."""
    saved = {name: getattr(torch.nn.init, name) for name in _INIT_FUNCTIONS}
    default_dtype = torch.get_default_dtype()
    try:
        for name in _INIT_FUNCTIONS:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        if dtype.is_floating_point:
            torch.set_default_dtype(dtype)
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(default_dtype)
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)


def build_model(config: ModelConfig, state: dict[str, torch.Tensor], *, dtype: torch.dtype,
                device: torch.device | str = "cpu", where: str = "", pack: bool = True) -> Model:
    """Allocate without random init, then copy the weights in (converting dtype); on the CPU,
    ``pack`` also keeps oneDNN-packed copies of the projection weights (``Model.pack_linears``)."""
    with _allocated_without_init(dtype, device):
        model = Model(config)
    params = dict(model.named_parameters())
    for name, tensor in state.items():
        param = params.get(name)
        if param is None:
            raise CheckpointError(f"{where}: no parameter for {name!r}")
        if param.shape != tensor.shape:
            raise CheckpointError(f"{where}: {name} has shape {tuple(tensor.shape)}, config implies {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor)
    model.reset_rope()
    model = model.eval().requires_grad_(False)
    if pack:
        model.pack_linears()
    return model


def load_checkpoint(folder: str | Path, *, dtype: str | torch.dtype | None = None,
                    device: torch.device | str = "cpu", weights: bool = True) -> LoadedModel:
    """Load a HF Llama/Qwen2 folder onto ``device`` (``auto``: CUDA when torch sees a GPU).
    ``dtype`` defaults to the checkpoint's ``torch_dtype``, bf16 for a float32 one on CUDA.
    ``weights=False``: config, tokenizer and generation defaults only (``model`` is None), for an
    HTTP front end whose engine process loads the weights itself (loading them in both doubled
    the server's memory)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder not found: {folder}")
    config = load_config(folder)
    try:
        device = resolve_device(device)
    except (ValueError, RuntimeError) as e:
        raise UserError(str(e)) from None
    dtype = resolve_dtype(dtype, config.torch_dtype, device)
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise UserError(f"unsupported dtype {dtype!r}; supported: {sorted(DTYPES)}")
        dtype = DTYPES[dtype]
    model = None
    if weights:
        state = hf_to_model_state(read_tensors(folder), config, where=str(folder))
        model = build_model(config, state, dtype=dtype, device=device, where=str(folder))
    return LoadedModel(path=folder, config=config, model=model, tokenizer=load_tokenizer(folder),
                       generation=load_generation_defaults(folder, config), dtype=dtype)
