"""Load the policy: the built-in tiny model (`model: tiny`) or any local HF checkpoint.

No hub access: a path that is not a local folder with a `config.json` is a one-line
`ConfigError` naming the `model` field. Prompts are encoded with the tokenizer's chat template
when it has one (messages from a chat-format dataset row, else one user turn), otherwise as
plain text with the tokenizer's own special tokens (the tiny tokenizer adds `<bos>`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlbatch.core.errors import ConfigError
from rlbatch.rollout.engine import eos_ids_of, pad_id_of
from rlbatch.rollout.tasks import BUILTIN_TASKS, Example


def tiny_recipe_for(task_name: str, digits: int):
    from rlbatch.rollout.tiny_model import recipe_for

    if task_name not in BUILTIN_TASKS:
        raise ConfigError(
            "model: 'tiny' is warm-started on a built-in task (addition, reverse, runsum); "
            "give a local checkpoint path for task.name=dataset"
        )
    return recipe_for(task_name, digits)


def resolve_model_path(model: str, task_name: str, digits: int,
                       progress: Callable | None = None) -> Path:
    if model == "tiny":
        from rlbatch.rollout.tiny_model import tiny_model_path

        return tiny_model_path(tiny_recipe_for(task_name, digits), progress=progress)
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ConfigError(f"model: no such local checkpoint folder '{model}' (hub downloads are off)")
    if not (path / "config.json").is_file():
        raise ConfigError(f"model: '{model}' has no config.json; not a Hugging Face checkpoint")
    return path


MODEL_DTYPES = ("float32", "bfloat16", "float16")


def torch_dtype_of(dtype):
    """None, a torch.dtype, or one of MODEL_DTYPES -> torch.dtype (or None)."""
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in MODEL_DTYPES:
        raise ConfigError(f"dtype: use one of {', '.join(MODEL_DTYPES)}, not '{dtype}'")
    return getattr(torch, dtype)


def load_model_and_tokenizer(path: Path, device: str = "cpu", dtype=None):
    """(model on `device`, tokenizer). `dtype` ('float32', 'bfloat16', a torch.dtype) casts
    the weights; None keeps what `from_pretrained` picks for the checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch_dtype = torch_dtype_of(dtype)
    kwargs = {} if torch_dtype is None else {"dtype": torch_dtype}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, **kwargs)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model: cannot load '{path}': {str(exc).splitlines()[0]}") from None
    return model.to(device), tokenizer


def encode_prompt(tokenizer, example: Example) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        messages = example.meta.get("messages") or [{"role": "user", "content": example.prompt}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer(example.prompt)["input_ids"])


def make_engine(name: str, model, tokenizer):
    eos, pad = eos_ids_of(model, tokenizer), pad_id_of(tokenizer)
    if name == "builtin":
        from rlbatch.rollout.builtin_engine import BuiltinEngine

        return BuiltinEngine(model, eos, pad)
    if name == "hf":
        from rlbatch.rollout.hf_engine import HFEngine

        return HFEngine(model, eos, pad)
    if name == "vllm":
        from rlbatch.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model, tokenizer, eos, pad)
    raise ConfigError(f"rollout.engine: unknown engine '{name}'")
