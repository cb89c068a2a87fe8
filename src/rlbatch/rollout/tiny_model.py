"""The built-in default model (`model: tiny`), built offline and warm-started on its task.

A Llama-architecture causal LM (hidden 128, 3 layers, 4 heads, MLP 512, tied embeddings,
~0.8M parameters) with a character-level tokenizer built with `tokenizers`, saved as an
ordinary Hugging Face checkpoint folder. RL amplifies a half-formed skill but does not
discover a missing one (docs/design.md, calibration), so the build fine-tunes on the task
and keeps the first checkpoint whose held-out greedy accuracy lies inside the warm-start
band with every answer position partly formed: chosen by accuracy, not by step count. An
overshoot past the band is retried from the last check below it at half the learning rate
(`BandSearch`); failing that, `WarmStartError`, and nothing is kept. Builds are cached by a
hash of the recipe under `$RLBATCH_CACHE` (default `~/.cache/rlbatch`), written atomically.
The per-task recipes (`recipe_for`) and where the bands come from: docs/design.md,
"Module notes".
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from rlbatch.core.errors import UserError
from rlbatch.core.runlog import atomic_write_json, stable_hash
from rlbatch.rollout.sft import greedy_accuracy, sft_step
from rlbatch.rollout.tasks import BUILTIN_TASKS, answer_tokens, take

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = "0123456789+=rev:"  # addition and reverse share this vocabulary (never change it)
# Tasks with characters of their own get their own vocabulary, so the default models keep theirs.
TASK_CHARS = {"runsum": BUILTIN_TASKS["runsum"].alphabet}
RECIPE_VERSION = 3


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
    check_prompts: int = 1024
    band_low: float = 0.25
    band_high: float = 0.40
    min_position_accuracy: float = 0.3
    max_backtracks: int = 4
    version: int = RECIPE_VERSION
    # Fields added after version 3 enter the cache key only when they differ from the values
    # in _LATE_FIELDS (the recipe as it was before each field existed; see `key`).
    max_positions: int = 128  # max_position_embeddings: prompt + longest answer must fit
    position_share: float = 0.5  # variable-length answers: positions checked (see below)
    report_prompts: int = 1024  # held-out prompts of the accuracy recorded after the build
    near_accuracy: float = 0.1  # checks every 5 steps from this accuracy on (see BandSearch)
    screen_prompts: int = 256  # held-out prompts of a check while accuracy is far below the band

    def key(self) -> str:
        d = {k: v for k, v in asdict(self).items()
             if k not in _LATE_FIELDS or v != _LATE_FIELDS[k]}
        return f"tiny-{self.task}{self.digits}-{stable_hash(d, 10)}"


_LATE_FIELDS = {"max_positions": 128, "position_share": 0.5, "report_prompts": 1024,
                "near_accuracy": 0.1, "screen_prompts": 0}

# Per-task recipe settings (the rest are TinyRecipe's defaults). runsum: longer sequences
# (prompts up to 54 tokens, answers up to 134 + EOS) and a band that leaves RL room.
TASK_RECIPES: dict[str, dict] = {
    "runsum": {"max_positions": 256, "band_low": 0.35, "band_high": 0.50,
               "near_accuracy": 0.25},
}


# Test-only (tests/README.md): `low` or `high` narrows the warm-start band to its lowest or
# highest BAND_END_WIDTH, so that the suite can be run against models at both ends of it.
BAND_ENV = "RLBATCH_TINY_BAND"
BAND_END_WIDTH = 0.03


# Test-only (tests/conftest.py): a file to which every use of a warm-started model appends
# the running test's name, so that the suite can check that such tests are marked `trained`.
USE_LOG_ENV = "RLBATCH_MODEL_USE_LOG"


def _note_use(what: str) -> None:
    log = os.environ.get(USE_LOG_ENV)
    if log:  # PYTEST_CURRENT_TEST is pytest's own variable; subprocesses inherit it
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": test, "use": what}) + "\n")


def recipe_for(task: str, digits: int) -> TinyRecipe:
    """The build recipe of the tiny model for a built-in task (narrowed by `BAND_ENV`)."""
    return band_end(TinyRecipe(task=task, digits=digits, **TASK_RECIPES.get(task, {})))


def band_end(r: TinyRecipe, end: str | None = None) -> TinyRecipe:
    """`r` with its band narrowed to one end (`end`, default `$RLBATCH_TINY_BAND`): 'low' keeps
    band_low .. band_low + BAND_END_WIDTH, 'high' band_high - BAND_END_WIDTH .. band_high."""
    end = os.environ.get(BAND_ENV, "") if end is None else end
    if not end:
        return r
    if end == "low":
        return replace(r, band_high=round(r.band_low + BAND_END_WIDTH, 6))
    if end == "high":
        return replace(r, band_low=round(r.band_high - BAND_END_WIDTH, 6))
    raise UserError(f"{BAND_ENV}={end!r}: expected 'low' or 'high' (or unset)")


def chars_for(task: str) -> str:
    return TASK_CHARS.get(task, CHARS)


def cache_root() -> Path:
    return Path(os.environ.get("RLBATCH_CACHE", Path.home() / ".cache" / "rlbatch"))


def build_tokenizer(chars: str = CHARS):
    """The tiny model's character tokenizer: one token per character."""
    from tokenizers import decoders, pre_tokenizers

    return word_level_tokenizer(SPECIALS + list(chars), pre_tokenizers.Split("", "isolated"),
                                decoders.Fuse())


def word_level_tokenizer(tokens: list[str], pre_tokenizer, decoder=None):
    """A `PreTrainedTokenizerFast` over a fixed word list (SPECIALS first), built offline:
    `<bos>` prepended to every encoding, `<eos>`/`<pad>`/`<unk>` as the special tokens."""
    from tokenizers import Tokenizer, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(tokens)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizer
    if decoder is not None:
        tk.decoder = decoder
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
        num_key_value_heads=recipe.heads, max_position_embeddings=recipe.max_positions,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(recipe.seed)
    return LlamaForCausalLM(cfg)


def _in_band(acc: float, per_pos: list[float], r: TinyRecipe) -> bool:
    return r.band_low <= acc <= r.band_high and min(per_pos) >= r.min_position_accuracy


class WarmStartError(UserError):
    """The warm start could not end inside its band."""


class BandSearch:
    """The warm start's decisions, apart from the training they steer (so that they can be
    tested on recorded accuracy trajectories).

    Checks come every `check_every` steps while accuracy is below `near_accuracy` (0.1; 0.25
    for runsum, whose accuracy sits near 0.19 long before its jump), then every 5 steps (the
    jump has started). While accuracy is below `near_accuracy` (and before any return), a
    check screens the first `screen_prompts` held-out prompts only; a screen at or above
    `near_accuracy` (or `band_low`) is repeated at once on all `check_prompts`, so that every
    decision near the band rests on the full check. A check below the band is the restore
    point. A check inside the band (with every answer position at least
    `min_position_accuracy`) is accepted. A check above it means the jump skipped the band
    between two checks: go back to the restore point, halve the learning rate and check after
    every step; after `max_backtracks` such returns, or after `max_sft_steps` steps in all,
    the build fails.
    """

    def __init__(self, recipe: TinyRecipe):
        self.r = recipe
        self.backtracks = 0
        self.lr_scale = 1.0
        self.last_accuracy = 0.0

    def every(self) -> int:
        if self.backtracks:
            return 1
        return self.r.check_every if self.last_accuracy < self.r.near_accuracy else 5

    def prompts(self) -> int:
        """Held-out prompts of the next check (`screen_prompts` while far below the band)."""
        far = not self.backtracks and self.last_accuracy < self.r.near_accuracy
        if far and 0 < self.r.screen_prompts < self.r.check_prompts:
            return self.r.screen_prompts
        return self.r.check_prompts

    def decide(self, acc: float, per_pos: list[float]) -> str:
        """'accept', 'continue' (this check is the new restore point when below the band),
        'backtrack' or 'fail'."""
        self.last_accuracy = acc
        if _in_band(acc, per_pos, self.r):
            return "accept"
        if acc <= self.r.band_high:
            return "continue"
        if self.backtracks >= self.r.max_backtracks:
            return "fail"
        self.backtracks += 1
        self.lr_scale *= 0.5
        return "backtrack"


def run_band_search(recipe: TinyRecipe, sft) -> dict:
    """Drive `sft` (an object with step() -> loss, check(n) -> (accuracy, position accuracy)
    on the first n held-out prompts, snapshot() -> state, restore(state), set_lr_scale(x))
    until a check lands in the band.
    Returns the accepted check; raises WarmStartError when the band cannot be reached."""
    search = BandSearch(recipe)
    restore = (0, sft.snapshot())
    history: list[dict] = []
    steps, since = 0, 0  # SFT steps taken in all (backtracked ones included), since last check
    position = 0  # steps on the current trajectory
    while steps < recipe.max_sft_steps:
        sft.step()
        steps, since, position = steps + 1, since + 1, position + 1
        if since < search.every():
            continue
        since = 0
        n = search.prompts()
        acc, per_pos = sft.check(n)
        if n < recipe.check_prompts and acc >= min(recipe.near_accuracy, recipe.band_low):
            n = recipe.check_prompts
            acc, per_pos = sft.check(n)
        history.append({"step": steps, "position": position, "accuracy": acc,
                        "position_accuracy": per_pos, "lr_scale": search.lr_scale,
                        "prompts": n})
        action = search.decide(acc, per_pos)
        if action == "accept":
            return {"sft_steps": steps, "trajectory_steps": position, "accuracy_check": acc,
                    "position_accuracy": per_pos, "backtracks": search.backtracks,
                    "lr_scale": search.lr_scale, "in_band": True, "history": history}
        if action == "continue" and acc < recipe.band_low:
            restore = (position, sft.snapshot())
        elif action == "backtrack":
            position = restore[0]
            sft.restore(restore[1])
            sft.set_lr_scale(search.lr_scale)
        elif action == "fail":
            raise WarmStartError(_band_failure(recipe, history, "it overshot the band "
                                               f"{search.backtracks + 1} times"))
    raise WarmStartError(_band_failure(recipe, history, f"max_sft_steps={recipe.max_sft_steps} "
                                       "reached"))


def _band_failure(r: TinyRecipe, history: list[dict], why: str) -> str:
    last = history[-1] if history else None
    reached = (f"last check {last['accuracy']:.3f} at SFT step {last['step']}"
               if last else "no check")
    return (f"warm start of the tiny {r.task} model could not land in the accuracy band "
            f"{r.band_low}-{r.band_high} (every answer position >= {r.min_position_accuracy}): "
            f"{why}; {reached}. No model was kept; change the recipe (e.g. --digits) or "
            "report this machine's build history")


class _SftRun:
    """The real SFT run behind `run_band_search`: AdamW steps on the task's training stream,
    greedy held-out checks, and in-memory snapshots of model and optimizer state."""

    def __init__(self, model, tokenizer, recipe: TinyRecipe, progress=None):
        task = BUILTIN_TASKS[recipe.task](digits=recipe.digits)
        self.model, self.tok, self.r, self.progress = model, tokenizer, recipe, progress
        self.task = task
        self.held_out = task.eval_set(recipe.check_prompts)
        self.stream = task.train_stream(recipe.seed + 1)
        self.opt = torch.optim.AdamW(model.parameters(), lr=recipe.sft_lr, weight_decay=0.0)
        self.steps, self.loss = 0, math.nan

    def step(self) -> None:
        self.model.train()
        self.loss = sft_step(self.model, self.opt, self.tok,
                              take(self.stream, self.r.sft_examples_per_step))
        self.steps += 1
        if self.progress:
            self.progress(self.steps, self.loss, None)

    def check(self, n: int) -> tuple[float, list[float]]:
        acc, per_pos = greedy_accuracy(self.model, self.tok, self.held_out[:n], self.task,
                                       self.r.position_share)
        if self.progress:
            self.progress(self.steps, self.loss, acc)
        return acc, per_pos

    def snapshot(self) -> dict:
        return copy.deepcopy({"model": self.model.state_dict(), "opt": self.opt.state_dict()})

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(copy.deepcopy(state["opt"]))

    def set_lr_scale(self, scale: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = self.r.sft_lr * scale


def warm_start(model, tokenizer, recipe: TinyRecipe,
               progress: Callable[[int, float, float | None], None] | None = None) -> dict:
    """Fine-tune `model` in place until held-out accuracy lies in the band (BandSearch);
    raises WarmStartError when it cannot."""
    _note_use(f"warm start of {recipe.key()}")
    return run_band_search(recipe, _SftRun(model, tokenizer, recipe, progress))


def tiny_model_path(recipe: TinyRecipe, *, build: bool = True,
                    progress: Callable[[int, float, float | None], None] | None = None) -> Path:
    """Folder of the cached checkpoint for `recipe`, building it first when absent. A cached
    folder that fails `models.checkpoint_problem` (a weights file cut short, a JSON file that
    does not parse) is one line saying how to rebuild it; it is not rebuilt silently."""
    final = cache_root() / "models" / recipe.key()
    _note_use(final.name)
    if (final / "rlbatch_build.json").exists():
        from rlbatch.rollout.models import checkpoint_problem, rebuild_hint

        problem = checkpoint_problem(final)
        if problem:
            raise UserError(f"model: the cached tiny model {final} is damaged: {problem}"
                            f"{rebuild_hint(final)}")
        return final
    if not build:
        raise FileNotFoundError(final)
    with _build_lock(final):  # a second process waits for the first's build, then reads it
        if not (final / "rlbatch_build.json").exists():
            build_tiny(recipe, final, progress=progress)
    return final


@contextlib.contextmanager
def _build_lock(final: Path):
    """An exclusive flock beside the cached folder, held while one process builds it."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def build_tiny(recipe: TinyRecipe, dest: Path,
               progress: Callable[[int, float, float | None], None] | None = None) -> dict:
    """Build, warm-start and save the tiny model to `dest` atomically; return build facts."""
    torch.manual_seed(recipe.seed)
    start = time.perf_counter()
    tokenizer = build_tokenizer(chars_for(recipe.task))
    model = build_model(recipe, len(tokenizer))
    facts = warm_start(model, tokenizer, recipe, progress=progress)
    task = BUILTIN_TASKS[recipe.task](digits=recipe.digits)
    n = recipe.report_prompts
    if n == recipe.check_prompts:  # the accepted check measured this model on these prompts
        acc, per_pos = facts["accuracy_check"], facts["position_accuracy"]
    else:
        acc, per_pos = greedy_accuracy(model, tokenizer, task.eval_set(n), task,
                                       recipe.position_share)
    facts.update({
        "recipe": asdict(recipe), "parameters": sum(p.numel() for p in model.parameters()),
        "build_s": time.perf_counter() - start, "accuracy": acc, "position_accuracy_1024": per_pos,
        "answer_tokens": answer_tokens(recipe.task, recipe.digits), "eval_prompts": n,
    })
    save_model_folder(model, tokenizer, facts, dest)
    return facts


def save_model_folder(model, tokenizer, facts: dict, dest: Path) -> None:
    """Save a Hugging Face checkpoint folder with its `rlbatch_build.json` atomically: written
    beside `dest` under a temporary name, then renamed over it (a kill leaves no half folder)."""
    dest = Path(dest)
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


def read_build_facts(path: Path) -> dict:
    file = Path(path) / "rlbatch_build.json"
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the model's build facts ({type(exc).__name__})",
                        where=str(file)) from None
