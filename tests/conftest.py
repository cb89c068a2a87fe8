"""Shared fixtures. The warm-started tiny model is built once per cache (about a minute on
2 cores) under <repo>/.rlbatch-cache unless RLBATCH_CACHE is set; subprocesses inherit it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("RLBATCH_CACHE", str(REPO / ".rlbatch-cache"))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from rlbatch.rollout.tiny_model import TinyRecipe, tiny_model_path

    return tiny_model_path(TinyRecipe())


@pytest.fixture
def small_llama():
    """A small random Llama (not warm-started) for fast engine and gradient tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=12, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()
