"""Load the policy: the built-in tiny model (`model: tiny`) or any local HF checkpoint.

No hub access: a path that is not a local folder with a `config.json` is a one-line
`ConfigError` naming the `model` field. A damaged checkpoint is one line too, naming the folder
and what is wrong: the cheap structural checks of `checkpoint_problem` (JSON files that do not
parse, a `*.safetensors` file cut short or overwritten) run before a run directory exists; a
checkpoint that passes them and still cannot be loaded (weights of other shapes, a tokenizer
file of the wrong form) fails in `load_model_and_tokenizer`, after the run directory exists,
which the trainer then marks `failed` with the same line. A folder of rlbatch's own model cache
gets a hint how to rebuild it (`rebuild_hint`); nothing is rebuilt automatically.

Prompts are encoded with the tokenizer's chat template when it has one (messages from a
chat-format dataset row, else one user turn), otherwise as plain text with the tokenizer's
own special tokens (the tiny tokenizer adds `<bos>`).
"""

from __future__ import annotations

import json
import logging
import re
import struct
from collections.abc import Callable
from pathlib import Path

from rlbatch.core.errors import ConfigError, Terminated, sanitize
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
    problem = checkpoint_problem(path)
    if problem:
        raise ConfigError(f"model: checkpoint '{model}' is damaged: {problem}{rebuild_hint(path)}")
    return path


_JSON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json", "model.safetensors.index.json", "rlbatch_build.json")


def checkpoint_problem(path: Path) -> str | None:
    """What makes the checkpoint folder `path` unusable, in a few words, or None.

    Structural checks that cost a few reads: every JSON file of the checkpoint that is there
    parses to an object (`config.json` must be there), and every `*.safetensors` file is
    exactly as long as its own header says (a truncated, emptied or overwritten weights file
    fails here; the safetensors loader demands the same). Weights of the wrong shapes pass and
    fail later, in `load_model_and_tokenizer`."""
    for name in _JSON_FILES:
        file = Path(path) / name
        if not file.exists() and name != "config.json":
            continue
        try:
            doc = json.loads(file.read_bytes())
        except OSError as exc:
            return f"{name} cannot be read ({type(exc).__name__})"
        except ValueError:
            return f"{name} is not valid JSON"
        if not isinstance(doc, dict):
            return f"{name} is not a JSON object"
    for file in sorted(Path(path).glob("*.safetensors")):
        problem = _safetensors_problem(file)
        if problem:
            return f"{file.name} {problem}"
    return None


def _safetensors_problem(file: Path) -> str | None:
    """A safetensors file is an 8-byte little-endian header length, a JSON header giving each
    tensor's byte range, then the data; None when the file has exactly that length."""
    if not file.is_file():
        return "is not a file"
    size = file.stat().st_size
    with file.open("rb") as fh:
        head = fh.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if length is None or length > size - 8:
            return f"is cut short ({size:,} bytes, less than its header)"
        try:
            header = json.loads(fh.read(length))
            end = max((int(v["data_offsets"][1]) for k, v in header.items()
                       if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "has a damaged header"
    if 8 + length + end != size:
        return (f"is {size:,} bytes where its header describes {8 + length + end:,} "
                "(cut short or overwritten)")
    return None


def rebuild_hint(path: Path) -> str:
    """For a folder of rlbatch's model cache, how to get a good copy back ('' otherwise)."""
    from rlbatch.rollout.tiny_model import cache_root

    path = Path(path)
    if path.resolve().parent != (cache_root() / "models").resolve():
        return ""
    tiny = re.fullmatch(r"tiny-([a-z]+)(\d+)-[0-9a-f]+", path.name)
    if tiny:
        return ("; delete that folder (it is rebuilt on next use) or run `rlbatch model build "
                f"--task {tiny[1]} --digits {tiny[2]} --force`")
    return ("; it is in rlbatch's model cache: delete that folder and build it again with the "
            "same `rlbatch model build` options")


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
    the weights; None keeps what `from_pretrained` picks for the checkpoint. A checkpoint that
    cannot be loaded is one `ConfigError` line; transformers' log lines during the load are
    held back and printed only when the load works (a failed one is said in that line)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch_dtype = torch_dtype_of(dtype)
    kwargs = {} if torch_dtype is None else {"dtype": torch_dtype}
    with _HeldLogs() as held:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True,
                                                         **kwargs)
        except Terminated:
            raise
        # The checkpoint's files can make the loaders raise almost anything (SafetensorError,
        # RuntimeError for weights of other shapes, KeyError for a tokenizer file of another
        # form): each is a fault of the checkpoint, given as one line.
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(f"model: cannot load '{path}': {_load_error(exc, held.text())}"
                              f"{rebuild_hint(path)}") from None
        held.release()
    return model.to(device), tokenizer


class _HeldLogs(logging.Filter):
    """Holds back the records that transformers' log handlers would print while active."""

    def __enter__(self) -> _HeldLogs:  # noqa: PYI034  (typing.Self needs 3.11)
        self.records: list[logging.LogRecord] = []
        self.root = logging.getLogger("transformers")
        self.handlers = list(self.root.handlers)
        for handler in self.handlers:
            handler.addFilter(self)
        return self

    def filter(self, record: logging.LogRecord) -> bool:
        if all(r is not record for r in self.records):
            self.records.append(record)
        return False

    def text(self) -> str:
        return "\n".join(r.getMessage() for r in self.records)

    def release(self) -> None:
        """Print what was held (the load worked: its warnings still matter)."""
        self.__exit__()
        for record in self.records:  # text from the checkpoint's files: control codes escaped
            record.msg, record.args = sanitize(record.getMessage(), multiline=True), None
            self.root.handle(record)
        self.records = []

    def __exit__(self, *exc) -> None:
        for handler in self.handlers:
            handler.removeFilter(self)


def _load_error(exc: Exception, logged: str) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    if "ignore_mismatched_sizes" in text:  # the shapes are in the report transformers logged
        rows = sorted(re.findall(  # the report's row order varies: name the first by name
            r"^\s*(\S.*?)\s*\|\s*MISMATCH\b.*?ckpt: torch\.Size\((\[[^]]*\])\) vs model: ?"
            r"torch\.Size\((\[[^]]*\])\)", logged, re.MULTILINE))
        shapes = (f": {rows[0][0]} is {rows[0][1]} in the weights, {rows[0][2]} by config.json"
                  + (f" (+{len(rows) - 1} more)" if len(rows) > 1 else "") if rows else "")
        return f"its weights have other shapes than its config.json gives{shapes}"
    if isinstance(exc, (OSError, ValueError)) and text:  # transformers' own explanations
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
