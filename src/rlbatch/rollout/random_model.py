"""Throughput-only models: randomly initialized Llama layouts, never downloaded, never trained.

`rlbatch model build --random --size 0.5b` (or `--layout hidden=..,layers=..,...`) writes an
ordinary Hugging Face checkpoint folder (`config.json`, safetensors weights, a tokenizer) that
`AutoModelForCausalLM` / `PreTrainedTokenizerFast` load, so decode-bench, the trainer and the
GPU check accept it like any local checkpoint. Its outputs are noise: use it for time and
memory figures only, with a synthetic reward (no accuracy means anything on it).

Sizes (`SIZES`):

- `tiny`: the built-in tiny model's layout (`tiny_model.TinyRecipe`: hidden 128, 3 layers,
  4 heads, 4 KV heads, MLP 512, vocab 20, tied embeddings), 789,888 parameters, without its
  ~1 minute of warm-start SFT: its step and decode times stand for the tiny model's when EOS
  is ignored (CPU dry runs, and the tiny-model figures of the GPU check).
- `0.5b`: hidden 1024, 24 layers, 16 heads (head_dim 64), 2 KV heads (GQA 8:1), MLP 4864,
  vocab 32,000, untied LM head: 480,822,272 parameters (~0.96 GB in bf16), between
  Qwen2.5-0.5B (hidden 896, vocab 152k) and a Llama-style 32k vocabulary.

The tokenizer is a WordLevel vocabulary (`<pad> <bos> <eos> <unk>` then `w4 .. w{V-1}`) split
on whitespace and built with `tokenizers`, as `tiny_model` builds its character tokenizer.
Weights are drawn with a fixed seed (transformers' own initializer, std 0.02), so a layout
and seed give the same checkpoint on every machine. Builds are cached under
`$RLBATCH_CACHE/models/random-<size>-<hash of layout, seed, dtype>` and written atomically.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlbatch.core.errors import ConfigError
from rlbatch.core.runlog import stable_hash
from rlbatch.rollout.tiny_model import SPECIALS, cache_root, save_model_folder, word_level_tokenizer

RANDOM_VERSION = 1
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LAYOUT_KEYS = ("hidden", "layers", "heads", "kv_heads", "mlp", "vocab")


@dataclass(frozen=True)
class RandomLayout:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int
    vocab: int
    tie_embeddings: bool = False
    max_positions: int = 4096

    def __post_init__(self):
        for name in LAYOUT_KEYS:
            if getattr(self, name) <= 0:
                raise ConfigError(f"--layout: {name} must be a positive integer")
        if self.hidden % self.heads:
            raise ConfigError(f"--layout: hidden ({self.hidden}) must be a multiple of heads "
                              f"({self.heads})")
        if (self.hidden // self.heads) % 2:
            raise ConfigError("--layout: head_dim (hidden / heads) must be even (rotary)")
        if self.heads % self.kv_heads:
            raise ConfigError(f"--layout: heads ({self.heads}) must be a multiple of kv_heads "
                              f"({self.kv_heads})")
        if self.vocab <= len(SPECIALS):
            raise ConfigError(f"--layout: vocab must exceed {len(SPECIALS)} (special tokens)")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self) -> int:
        """Parameter count of the Llama layout (tied embeddings counted once)."""
        kv = self.kv_heads * self.head_dim
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * kv  # q, o; k, v (no biases)
        per_layer = attn + 3 * self.hidden * self.mlp + 2 * self.hidden  # MLP, two RMSNorms
        embed = self.vocab * self.hidden
        head = 0 if self.tie_embeddings else embed
        return self.layers * per_layer + embed + head + self.hidden  # final norm


SIZES = {
    "tiny": RandomLayout(hidden=128, layers=3, heads=4, kv_heads=4, mlp=512, vocab=20,
                         tie_embeddings=True, max_positions=1024),
    "0.5b": RandomLayout(hidden=1024, layers=24, heads=16, kv_heads=2, mlp=4864, vocab=32000),
}


def parse_layout(text: str) -> RandomLayout:
    """'hidden=1024,layers=24,heads=16,kv_heads=2,mlp=4864,vocab=32000[,tie=1]'."""
    values: dict = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, val = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise ConfigError(f"--layout: expected key=value, got '{part}'")
        if key in ("tie", "tie_embeddings"):
            values["tie_embeddings"] = val.strip().lower() in ("1", "true", "yes")
            continue
        if key not in LAYOUT_KEYS + ("max_positions",):
            raise ConfigError(f"--layout: unknown key '{key}'; use {', '.join(LAYOUT_KEYS)}, "
                              "tie, max_positions")
        try:
            values[key] = int(val)
        except ValueError:
            raise ConfigError(f"--layout: {key} must be an integer, got '{val}'") from None
    missing = [k for k in LAYOUT_KEYS if k not in values]
    if missing:
        raise ConfigError(f"--layout: missing {', '.join(missing)}")
    return RandomLayout(**values)


def layout_for(size: str | None, layout: str | None) -> tuple[str, RandomLayout]:
    """(name, layout) from `--size` or `--layout` (exactly one)."""
    if layout:
        if size:
            raise ConfigError("give --size or --layout, not both")
        return "custom", parse_layout(layout)
    size = size or "tiny"
    if size not in SIZES:
        raise ConfigError(f"--size: unknown size '{size}'; use {', '.join(SIZES)}")
    return size, SIZES[size]


def random_key(name: str, layout: RandomLayout, seed: int, dtype: str) -> str:
    return (f"random-{name}-"
            f"{stable_hash([asdict(layout), seed, dtype, RANDOM_VERSION], 10)}")


def build_random_tokenizer(vocab_size: int):
    """Whitespace-separated words `w4`, `w5`, ... after the specials (throughput only)."""
    from tokenizers import pre_tokenizers

    words = SPECIALS + [f"w{i}" for i in range(len(SPECIALS), vocab_size)]
    return word_level_tokenizer(words, pre_tokenizers.WhitespaceSplit())


def build_random_model(layout: RandomLayout, seed: int = 0, dtype: str = "float32"):
    """The randomly initialized LlamaForCausalLM (on CPU) in `dtype`."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype: use one of {', '.join(DTYPES)}, not '{dtype}'")
    cfg = LlamaConfig(
        vocab_size=layout.vocab, hidden_size=layout.hidden, intermediate_size=layout.mlp,
        num_hidden_layers=layout.layers, num_attention_heads=layout.heads,
        num_key_value_heads=layout.kv_heads, max_position_embeddings=layout.max_positions,
        tie_word_embeddings=layout.tie_embeddings, bos_token_id=1, eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    return model.to(DTYPES[dtype])


def random_model_path(name: str, layout: RandomLayout, *, seed: int = 0,
                      dtype: str = "float32", out: Path | None = None,
                      force: bool = False) -> tuple[Path, bool]:
    """(folder, was_cached): the checkpoint under the cache (or `out`), building it if absent."""
    dest = Path(out) if out is not None else cache_root() / "models" / random_key(
        name, layout, seed, dtype)
    if force and dest.exists():
        shutil.rmtree(dest)
    if (dest / "rlbatch_build.json").exists():
        return dest, True
    build_random(name, layout, dest, seed=seed, dtype=dtype)
    return dest, False


def build_random(name: str, layout: RandomLayout, dest: Path, *, seed: int = 0,
                 dtype: str = "float32") -> dict:
    """Build and save the random checkpoint to `dest` atomically; return its build facts."""
    start = time.perf_counter()
    tokenizer = build_random_tokenizer(layout.vocab)
    model = build_random_model(layout, seed, dtype)
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    facts = {"random": True, "size": name, "layout": asdict(layout), "head_dim": layout.head_dim,
             "seed": seed, "dtype": dtype, "parameters": params, "version": RANDOM_VERSION,
             "note": "randomly initialized: for throughput and memory figures only"}
    facts["build_s"] = time.perf_counter() - start
    save_model_folder(model, tokenizer, facts, dest)
    return facts
