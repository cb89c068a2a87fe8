"""Checkpoints: exact round trip, two kept, atomic saves, fallback from a corrupt latest
checkpoint, DataError when none loads, and no code execution from a crafted state.pt."""

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from rlbatch.algos.noise_scale import NoiseScaleEMA
from rlbatch.backends.builtin import checkpoint as ck
from rlbatch.backends.builtin.checkpoint import (
    find_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from rlbatch.core.errors import DataError

LOGGER = "rlbatch.backends.builtin.checkpoint"


@dataclass
class Rig:
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    critic: torch.nn.Module
    critic_opt: torch.optim.Optimizer
    gen: torch.Generator

    def kw(self) -> dict:
        return {"model": self.model, "optimizer": self.opt, "generator": self.gen,
                "critic": self.critic, "critic_optimizer": self.critic_opt}


def _train_step(rig: Rig, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 12, (2, 6), generator=g)
    rig.model.train()
    loss = rig.model(input_ids=ids, labels=ids).loss
    rig.opt.zero_grad()
    loss.backward()
    rig.opt.step()
    x = torch.randn(3, 4, generator=g)
    rig.critic_opt.zero_grad()
    rig.critic(x).pow(2).mean().backward()
    rig.critic_opt.step()
    torch.randn(5, generator=rig.gen)  # advance the trainer's generator and the global RNG
    torch.randn(5)


@pytest.fixture
def rig(small_llama) -> Rig:
    torch.manual_seed(1)
    critic = torch.nn.Linear(4, 1)
    r = Rig(small_llama, torch.optim.AdamW(small_llama.parameters(), lr=1e-2),
            critic, torch.optim.AdamW(critic.parameters(), lr=1e-2),
            torch.Generator().manual_seed(7))
    _train_step(r, 0)  # optimizer state exists
    return r


def _fresh(r: Rig) -> Rig:
    """Same architecture, other weights, empty optimizers, other generator state."""
    model, critic = copy.deepcopy(r.model), copy.deepcopy(r.critic)
    with torch.no_grad():
        for p in list(model.parameters()) + list(critic.parameters()):
            p.add_(1.0)
    return Rig(model, torch.optim.AdamW(model.parameters(), lr=1e-2), critic,
               torch.optim.AdamW(critic.parameters(), lr=1e-2), torch.Generator().manual_seed(99))


def _weights(m: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _counters(step: int) -> dict:
    return {"step": step, "consumed": 8 * step, "samples": 64 * step, "train_s": 0.5 * step,
            "target": None, "status": "running"}


def _save(run: Path, r: Rig, step: int, extra: dict | None = None) -> Path:
    return save_checkpoint(run, counters=_counters(step), extra_state=extra, **r.kw())


def _snapshot(r: Rig) -> dict:
    return {"model": _weights(r.model), "critic": _weights(r.critic),
            "opt": copy.deepcopy(r.opt.state_dict()),
            "critic_opt": copy.deepcopy(r.critic_opt.state_dict()),
            "gen": r.gen.get_state(), "rng": torch.get_rng_state()}


def _matches(r: Rig, snap: dict) -> bool:
    return (_same(_weights(r.model), snap["model"]) and _same(_weights(r.critic), snap["critic"])
            and _same(r.opt.state_dict(), snap["opt"])
            and _same(r.critic_opt.state_dict(), snap["critic_opt"])
            and torch.equal(r.gen.get_state(), snap["gen"]))


def _two_checkpoints(tmp_path: Path, r: Rig) -> tuple[Path, dict]:
    run = tmp_path / "run"
    _save(run, r, 1)
    snap1 = _snapshot(r)
    _train_step(r, 1)
    _save(run, r, 2)
    return run, snap1


# ---------------------------------------------------------------- round trip, layout

def test_round_trip_restores_weights_optimizer_rng_counters_extra(rig, tmp_path):
    ema = NoiseScaleEMA(0.9)
    ema.update(4.0, 3.0, 8, 64)
    ema.update(5.0, 2.5, 8, 64)
    extra = {"actor_noise": ema.state_dict(), "critic_noise": NoiseScaleEMA(0.8).state_dict()}
    path = _save(tmp_path, rig, 3, extra)
    snap = _snapshot(rig)
    after_gen = torch.randn(4, generator=rig.gen)
    after_rng = torch.randn(4)

    other = _fresh(rig)
    torch.manual_seed(12345)  # the global RNG moves on; the checkpoint must restore it
    assert not _matches(other, snap)
    counters, got_extra = load_checkpoint(find_checkpoint(tmp_path), **other.kw())
    assert find_checkpoint(tmp_path) == path
    assert _matches(other, snap)
    assert torch.equal(torch.get_rng_state(), snap["rng"])
    assert torch.equal(torch.randn(4, generator=other.gen), after_gen)
    assert torch.equal(torch.randn(4), after_rng)
    assert counters == _counters(3)
    assert got_extra == extra
    restored = NoiseScaleEMA()
    restored.load_state_dict(got_extra["actor_noise"])
    assert restored.b_simple == ema.b_simple and restored.count == 2
    # training goes on identically from the restored state
    _train_step(rig, 5)
    _train_step(other, 5)
    assert _same(_weights(other.model), _weights(rig.model))


def test_layout_and_two_checkpoints_kept(rig, tmp_path):
    for step in (1, 2, 3, 4):
        _train_step(rig, step)
        _save(tmp_path, rig, step)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-00000003", "step-00000004"]
    assert list_checkpoints(tmp_path) == [root / "step-00000004", root / "step-00000003"]
    files = sorted(p.name for p in (root / "step-00000004").iterdir())
    assert files == ["checksums.json", "counters.json", "critic.safetensors",
                     "model.safetensors", "state.pt"]
    sums = json.loads((root / "step-00000004" / "checksums.json").read_text())
    assert set(sums["files"]) == set(files) - {"checksums.json"} and sums["step"] == 4
    counters, _ = load_checkpoint(tmp_path, **_fresh(rig).kw())  # a run directory works too
    assert counters["step"] == 4


def test_grpo_checkpoint_without_critic(small_llama, tmp_path):
    opt = torch.optim.AdamW(small_llama.parameters())
    gen = torch.Generator().manual_seed(0)
    save_checkpoint(tmp_path, model=small_llama, optimizer=opt, counters=_counters(1),
                    generator=gen)
    assert not (find_checkpoint(tmp_path) / "critic.safetensors").exists()
    counters, extra = load_checkpoint(find_checkpoint(tmp_path), model=small_llama,
                                      optimizer=opt, generator=gen)
    assert counters["step"] == 1 and extra == {}


# ---------------------------------------------------------------- corruption and fallback

def _corrupt(path: Path, kind: str) -> None:
    data = path.read_bytes()
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "missing":
        path.unlink()
    elif kind == "flipped":  # same size, one byte changed
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])


CASES = [(f, k) for f in ("state.pt", "model.safetensors", "critic.safetensors",
                          "counters.json", "checksums.json")
         for k in ("empty", "truncated", "missing", "flipped")
         if (f, k) != ("checksums.json", "flipped")]  # that one names the file it mismatches


@pytest.mark.parametrize("name,kind", CASES)
def test_corrupt_latest_falls_back_to_previous(rig, tmp_path, caplog, name, kind):
    run, snap1 = _two_checkpoints(tmp_path, rig)
    latest = find_checkpoint(run)
    assert latest.name == "step-00000002"
    _corrupt(latest / name, kind)
    other = _fresh(rig)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        counters, _ = load_checkpoint(latest, **other.kw())  # the trainer's call
    assert counters["step"] == 1
    assert _matches(other, snap1)
    msgs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(msgs) == 1, msgs
    assert "\n" not in msgs[0]
    assert str(latest / name) in msgs[0]
    assert str(run / "checkpoints" / "step-00000001") in msgs[0]  # what it falls back to


def test_empty_state_pt_never_reaches_torch(rig, tmp_path, monkeypatch):
    """A 0-byte state.pt made torch print "Aborted."; the size check must catch it first."""
    run, _ = _two_checkpoints(tmp_path, rig)
    (find_checkpoint(run) / "state.pt").write_bytes(b"")
    real_load, seen = torch.load, []

    def spy(f, *a, **k):
        seen.append(Path(f))
        return real_load(f, *a, **k)

    monkeypatch.setattr(torch, "load", spy)
    counters, _ = load_checkpoint(find_checkpoint(run), **_fresh(rig).kw())
    assert counters["step"] == 1
    assert seen == [run / "checkpoints" / "step-00000001" / "state.pt"]


def test_no_loadable_checkpoint_raises_data_error_and_changes_nothing(rig, tmp_path):
    run, _ = _two_checkpoints(tmp_path, rig)
    latest, previous = list_checkpoints(run)
    _corrupt(latest / "state.pt", "empty")  # its weights are fine, its state is not
    _corrupt(previous / "counters.json", "truncated")  # weights and state fine
    other = _fresh(rig)
    before = _snapshot(other)
    with pytest.raises(DataError) as info:
        load_checkpoint(latest, **other.kw())
    text = str(info.value)
    assert info.value.where == str(run)
    assert text.startswith(f"{run}: no loadable checkpoint")
    assert "step-00000002/state.pt" in text and "step-00000001/counters.json" in text
    assert "\n" not in text
    assert _matches(other, before)  # no half-restored model or optimizer


def test_mismatched_model_is_rejected_before_anything_changes(rig, tmp_path):
    path = _save(tmp_path, rig, 1)
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    bigger = LlamaForCausalLM(LlamaConfig(vocab_size=12, hidden_size=48, intermediate_size=64,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2))
    other = _fresh(rig)
    other.model, other.opt = bigger, torch.optim.AdamW(bigger.parameters())
    before = _weights(bigger)
    with pytest.raises(DataError, match=r"model\.safetensors: does not fit the model"):
        load_checkpoint(path, **other.kw())
    assert _same(_weights(bigger), before)


def test_no_checkpoint(rig, tmp_path):
    assert find_checkpoint(tmp_path) is None
    with pytest.raises(DataError, match="no checkpoint to resume from"):
        load_checkpoint(tmp_path, **rig.kw())


# ---------------------------------------------------------------- safety

class Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"echo pwned > '{self.marker}'",))


def _forge_checksum(ckpt: Path, name: str) -> None:
    """What an attacker would do: make checksums.json match the crafted file."""
    sums = json.loads((ckpt / "checksums.json").read_text())
    sums["files"][name] = ck._digest(ckpt / name)
    (ckpt / "checksums.json").write_text(json.dumps(sums))


@pytest.mark.parametrize("fmt", ["torch.save", "pickle"])
def test_malicious_state_pt_is_not_executed(rig, tmp_path, caplog, fmt):
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Evil(control)))  # the payload does run when unpickled plainly
    assert control.exists()

    marker = tmp_path / "pwned"
    run, snap1 = _two_checkpoints(tmp_path, rig)
    latest = find_checkpoint(run)
    payload = {"optimizer": Evil(marker)}
    if fmt == "torch.save":
        torch.save(payload, latest / "state.pt")
    else:
        (latest / "state.pt").write_bytes(pickle.dumps(payload, protocol=2))
    _forge_checksum(latest, "state.pt")
    other = _fresh(rig)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        counters, _ = load_checkpoint(latest, **other.kw())
    assert not marker.exists()
    assert counters["step"] == 1 and _matches(other, snap1)
    msg = next(r.getMessage() for r in caplog.records if r.name == LOGGER)
    assert f"{latest / 'state.pt'}: refused or unreadable" in msg

    shutil.rmtree(run / "checkpoints" / "step-00000001")  # the only checkpoint is the crafted one
    with pytest.raises(DataError, match=r"step-00000002/state\.pt: refused or unreadable"):
        load_checkpoint(latest, **_fresh(rig).kw())
    assert not marker.exists()


# ---------------------------------------------------------------- killed saves

def test_kill_before_rename_leaves_previous_checkpoint(rig, tmp_path, monkeypatch, caplog):
    run = tmp_path / "run"
    _save(run, rig, 1)
    snap1 = _snapshot(rig)
    _train_step(rig, 1)

    def killed(src, dst):
        raise KeyboardInterrupt("killed")  # the process dies here: nothing after runs

    monkeypatch.setattr(ck.os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        _save(run, rig, 2)
    monkeypatch.undo()
    tmp = run / "checkpoints" / ".tmp-step-00000002"
    assert (tmp / "checksums.json").exists()  # the new checkpoint was completely written
    assert list_checkpoints(run) == [run / "checkpoints" / "step-00000001"]
    other = _fresh(rig)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        counters, _ = load_checkpoint(find_checkpoint(run), **other.kw())
    assert counters["step"] == 1 and _matches(other, snap1)
    assert not [r for r in caplog.records if r.name == LOGGER]

    _save(run, rig, 2)  # the next successful save leaves no temporary folder behind
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step-00000001", "step-00000002"]


def test_kill_while_writing_files_and_while_pruning(rig, tmp_path, monkeypatch):
    run = tmp_path / "run"
    _save(run, rig, 1)
    _train_step(rig, 1)
    _save(run, rig, 2)
    snap2 = _snapshot(rig)
    _train_step(rig, 2)

    real_torch_save = torch.save

    def killed_mid_write(obj, f, *a, **k):
        f.write(b"PK\x03\x04 partial")
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(torch, "save", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        _save(run, rig, 3)
    monkeypatch.setattr(torch, "save", real_torch_save)
    counters, _ = load_checkpoint(find_checkpoint(run), **_fresh(rig).kw())
    assert counters["step"] == 2

    # killed while deleting the oldest checkpoint: the new and the previous one are intact
    real_rmtree = shutil.rmtree

    def killed_rmtree(path, *a, **k):
        if Path(path).name.startswith(".trash-step"):
            raise KeyboardInterrupt("killed")
        return real_rmtree(path, *a, **k)

    monkeypatch.setattr(ck.shutil, "rmtree", killed_rmtree)
    with pytest.raises(KeyboardInterrupt):
        _save(run, rig, 3)
    monkeypatch.setattr(ck.shutil, "rmtree", real_rmtree)
    snap3 = _snapshot(rig)
    names = [p.name for p in list_checkpoints(run)]
    assert names == ["step-00000003", "step-00000002"]
    other = _fresh(rig)
    counters, _ = load_checkpoint(find_checkpoint(run), **other.kw())
    assert counters["step"] == 3 and _matches(other, snap3)
    shutil.rmtree(run / "checkpoints" / "step-00000003")
    other = _fresh(rig)
    counters, _ = load_checkpoint(run, **other.kw())
    assert counters["step"] == 2 and _matches(other, snap2)


def test_saving_the_same_step_again_replaces_it(rig, tmp_path):
    _save(tmp_path, rig, 1)
    _train_step(rig, 1)
    _save(tmp_path, rig, 2)
    _train_step(rig, 2)
    _save(tmp_path, rig, 2)
    snap = _snapshot(rig)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-00000001", "step-00000002"]
    other = _fresh(rig)
    counters, _ = load_checkpoint(tmp_path, **other.kw())
    assert counters["step"] == 2 and _matches(other, snap)
