"""Checkpoints for exact resume: weights (safetensors), optimizer states, RNG states, counters.

Written into `<run>/checkpoint.tmp/` and renamed over `<run>/checkpoint/`, so a kill during
the write leaves the previous checkpoint intact. Restoring the torch generator, the global
torch RNG and the counters (including how many task examples were consumed) makes a resumed
CPU run produce the same rows as an uninterrupted one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from rlbatch.core.runlog import atomic_write_json


def save_checkpoint(run_dir: Path, *, model, optimizer, counters: dict,
                    generator: torch.Generator, critic=None, critic_optimizer=None,
                    extra_state: dict | None = None) -> Path:
    final = Path(run_dir) / "checkpoint"
    tmp = Path(run_dir) / "checkpoint.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    state = {"optimizer": optimizer.state_dict(), "generator": generator.get_state(),
             "torch_rng": torch.get_rng_state(), "extra": extra_state or {}}
    if critic is not None:
        save_model(critic, str(tmp / "critic.safetensors"))
        state["critic_optimizer"] = critic_optimizer.state_dict()
    torch.save(state, tmp / "state.pt")
    atomic_write_json(tmp / "counters.json", counters)
    old = Path(run_dir) / "checkpoint.old"
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old)
    return final


def find_checkpoint(run_dir: Path) -> Path | None:
    run_dir = Path(run_dir)
    for name in ("checkpoint", "checkpoint.old"):  # .old survives a kill between renames
        if (run_dir / name / "counters.json").exists():
            return run_dir / name
    return None


def load_checkpoint(path: Path, *, model, optimizer, generator: torch.Generator, critic=None,
                    critic_optimizer=None) -> tuple[dict, dict]:
    """Restore states in place; return (counters, extra_state)."""
    load_model(model, str(path / "model.safetensors"))
    state = torch.load(path / "state.pt", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    if critic is not None:
        load_model(critic, str(path / "critic.safetensors"))
        critic_optimizer.load_state_dict(state["critic_optimizer"])
    counters = json.loads((path / "counters.json").read_text())
    return counters, state.get("extra", {})
