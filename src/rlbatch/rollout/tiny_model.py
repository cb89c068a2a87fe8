"""The built-in default model (`model: tiny`), built offline and warm-started on its task.

A Llama-architecture causal LM (hidden 128, 3 layers, 4 heads, MLP 512, tied embeddings,
~0.8M parameters) with a character-level tokenizer built with `tokenizers`, saved as an
ordinary Hugging Face checkpoint folder (loads with `AutoModelForCausalLM` and
`PreTrainedTokenizerFast`).

Warm start (DESIGN.md calibration facts): RL amplifies a half-formed skill but did not
discover a missing one, and the skill appears in jumps during supervised fine-tuning. So the
build fine-tunes on the task and evaluates held-out greedy accuracy every `check_every`
steps, and keeps the first checkpoint whose accuracy lies inside the warm-start band with
every answer position above `min_position_accuracy` (each sub-skill partly formed) —
chosen by measured accuracy, not by step count. If a jump overshoots the band the build
keeps the checkpoint closest to the band and says so. Builds are cached by a hash of the
recipe under `$RLBATCH_CACHE` (default `~/.cache/rlbatch`) and written atomically.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from rlbatch.core.runlog import atomic_write_json, stable_hash
from rlbatch.rollout.tasks import BUILTIN_TASKS, Example, answer_tokens, take

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = "0123456789+=rev:"
RECIPE_VERSION = 2


@dataclass(frozen=True)
class TinyRecipe:
    task: str = "addition"
    digits: int = 3
    hidden: int = 128
    layers: int = 3
    heads: int = 4
    mlp: int = 512
    seed: int = 0
    sft_lr: float = 1e-3
    sft_examples_per_step: int = 128
    max_sft_steps: int = 3000
    check_every: int = 20
    check_prompts: int = 512
    band_low: float = 0.25
    band_high: float = 0.40
    min_position_accuracy: float = 0.3
    version: int = RECIPE_VERSION

    def key(self) -> str:
        return f"tiny-{self.task}{self.digits}-{stable_hash(asdict(self), 10)}"


def cache_root() -> Path:
    return Path(os.environ.get("RLBATCH_CACHE", Path.home() / ".cache" / "rlbatch"))


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(CHARS))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<unk>",
    )


def build_model(recipe: TinyRecipe, vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=recipe.hidden, intermediate_size=recipe.mlp,
        num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.heads, max_position_embeddings=128,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(recipe.seed)
    return LlamaForCausalLM(cfg)


def _encode(tokenizer, examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed-length built-in tasks: (N, Tp) prompt ids and (N, Ta+1) answer ids + EOS."""
    prompts = torch.tensor([tokenizer(e.prompt)["input_ids"] for e in examples])
    eos = tokenizer.eos_token_id
    answers = torch.tensor(
        [tokenizer(e.answer, add_special_tokens=False)["input_ids"] + [eos] for e in examples]
    )
    return prompts, answers


@torch.no_grad()
def greedy_accuracy(model, tokenizer, examples: list[Example]) -> tuple[float, list[float]]:
    """Held-out exact-match accuracy under greedy decoding, and per-position accuracy."""
    prompts, answers = _encode(tokenizer, examples)  # (N, Tp), (N, Ta+1)
    model.eval()
    seq = prompts
    for _ in range(answers.shape[1]):
        logits = model(input_ids=seq).logits[:, -1]  # (N, V)
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    pred = seq[:, prompts.shape[1]:]  # (N, Ta+1)
    hit = pred == answers
    per_pos = hit[:, :-1].float().mean(0).tolist()
    return hit.all(1).float().mean().item(), per_pos


def _sft_step(model, opt, tokenizer, examples: list[Example]) -> float:
    prompts, answers = _encode(tokenizer, examples)
    seq = torch.cat([prompts, answers], dim=1)  # (N, T)
    logits = model(input_ids=seq[:, :-1]).logits  # (N, T-1, V)
    tp = prompts.shape[1]
    pred = logits[:, tp - 1:]  # positions predicting the answer and EOS
    loss = torch.nn.functional.cross_entropy(pred.reshape(-1, pred.shape[-1]), answers.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def _in_band(acc: float, per_pos: list[float], r: TinyRecipe) -> bool:
    return r.band_low <= acc <= r.band_high and min(per_pos) >= r.min_position_accuracy


def warm_start(model, tokenizer, recipe: TinyRecipe,
               progress: Callable[[int, float, float | None], None] | None = None) -> dict:
    """Fine-tune until held-out accuracy enters the band; restore the chosen checkpoint."""
    task = BUILTIN_TASKS[recipe.task](digits=recipe.digits)
    held_out = task.eval_set(recipe.check_prompts)
    stream = task.train_stream(recipe.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.sft_lr, weight_decay=0.0)
    best: tuple[float, int, dict, float, list[float]] | None = None  # (distance, step, state, acc, pos)
    history = []
    for step in range(1, recipe.max_sft_steps + 1):
        model.train()
        loss = _sft_step(model, opt, tokenizer, take(stream, recipe.sft_examples_per_step))
        acc = None
        # Check often once the jump starts (accuracy >= 0.1), so the band is not skipped.
        every = recipe.check_every if not history or history[-1]["accuracy"] < 0.1 else 5
        if step % every == 0:
            acc, per_pos = greedy_accuracy(model, tokenizer, held_out)
            history.append({"step": step, "accuracy": acc, "position_accuracy": per_pos})
            center = (recipe.band_low + recipe.band_high) / 2
            dist = 0.0 if _in_band(acc, per_pos, recipe) else abs(acc - center)
            if best is None or dist < best[0]:
                state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                best = (dist, step, state, acc, per_pos)
            if dist == 0.0 or acc > recipe.band_high + 0.15:
                if progress:
                    progress(step, loss, acc)
                break
        if progress:
            progress(step, loss, acc)
    assert best is not None, "max_sft_steps must be >= check_every"
    model.load_state_dict(best[2])
    return {"sft_steps": best[1], "accuracy_check": best[3], "position_accuracy": best[4],
            "in_band": best[0] == 0.0, "history": history}


def tiny_model_path(recipe: TinyRecipe, *, build: bool = True,
                    progress: Callable[[int, float, float | None], None] | None = None) -> Path:
    """Folder of the cached checkpoint for `recipe`, building it first when absent."""
    final = cache_root() / "models" / recipe.key()
    if (final / "rlbatch_build.json").exists():
        return final
    if not build:
        raise FileNotFoundError(final)
    build_tiny(recipe, final, progress=progress)
    return final


def build_tiny(recipe: TinyRecipe, dest: Path,
               progress: Callable[[int, float, float | None], None] | None = None) -> dict:
    """Build, warm-start and save the tiny model to `dest` atomically; return build facts."""
    torch.manual_seed(recipe.seed)
    start = time.perf_counter()
    tokenizer = build_tokenizer()
    model = build_model(recipe, len(tokenizer))
    facts = warm_start(model, tokenizer, recipe, progress=progress)
    task = BUILTIN_TASKS[recipe.task](digits=recipe.digits)
    acc, per_pos = greedy_accuracy(model, tokenizer, task.eval_set(1024))
    facts.update({
        "recipe": asdict(recipe), "parameters": sum(p.numel() for p in model.parameters()),
        "build_s": time.perf_counter() - start, "accuracy": acc, "position_accuracy_1024": per_pos,
        "answer_tokens": answer_tokens(recipe.task, recipe.digits), "eval_prompts": 1024,
    })
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / "rlbatch_build.json", facts)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return facts


def read_build_facts(path: Path) -> dict:
    return json.loads((Path(path) / "rlbatch_build.json").read_text())
