"""Checkpoints for exact resume: weights, optimizer states, RNG states, counters.

One checkpoint is the folder `<run>/checkpoints/step-<step, 8 digits>/`: `model.safetensors`
(and `critic.safetensors` for PPO), `state.pt` (optimizer and RNG states, noise-scale EMA
numbers), `counters.json` and, written last, `checksums.json`. Restoring the generators and
the counters makes a resumed CPU run write the same rows as an uninterrupted one. Saves are
atomic (a temporary folder renamed into place) and keep the newest two checkpoints;
`load_checkpoint` verifies a checkpoint completely before applying anything and falls back
to the previous one; `state.pt` is read with `weights_only=True`, so a copied run directory
cannot run code on `--resume`. The layout, the write order and the failure cases:
docs/design.md, "Module notes".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_model

from rlbatch.core.errors import DataError, OutputError, output_error
from rlbatch.core.runlog import dumps_strict

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"  # the folder under the run directory
KEEP = 2  # the latest and the previous checkpoint
CHECKSUMS = "checksums.json"
FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")
_CHUNK = 1 << 20


# ---------------------------------------------------------------- saving

def _digest(path: Path, *, sync: bool = False) -> dict:
    """Size and SHA-256 of a file; with sync, fsync it too (after it was written)."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
        if sync:
            os.fsync(fh.fileno())
    return {"bytes": size, "sha256": h.hexdigest()}


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # platforms without directory fds
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove(path: Path) -> None:
    """Delete a folder: renamed to a `.trash-*` name first, so a kill part-way through the
    deletion never leaves a half-deleted folder under a loadable name."""
    trash = path.with_name(f".trash-{path.name}")
    if trash.exists():
        shutil.rmtree(trash)
    os.rename(path, trash)
    shutil.rmtree(trash)


def _remove_leftovers(root: Path) -> None:
    """Temporary and trash folders of a save that was killed."""
    for p in root.iterdir():
        if p.name.startswith((".tmp-", ".trash-")) and p.is_dir():
            shutil.rmtree(p)


def _output_error(exc: BaseException, path: Path) -> OutputError | None:
    """The OutputError (naming `path`) of a save that failed for want of space or permission:
    an OSError, in the chain of torch's RuntimeError, or safetensors' `(os error N)`."""
    seen = exc
    while seen is not None and not isinstance(seen, OSError):
        seen = seen.__cause__ or seen.__context__
    if seen is None and (m := re.search(r"\(os error (\d+)\)", str(exc))):
        seen = OSError(int(m.group(1)), "os error")
    return output_error(seen, path)


def save_checkpoint(run_dir: Path, *, model, optimizer, counters: dict,
                    generator: torch.Generator, critic=None, critic_optimizer=None,
                    extra_state: dict | None = None, keep: int = KEEP) -> Path:
    """Write a checkpoint of step `counters["step"]` atomically; keep the newest `keep`
    checkpoints (at least 1). Returns the checkpoint folder. A failed save leaves the older
    checkpoints as they were; want of space or permission is an `OutputError` naming it."""
    root = Path(run_dir) / CHECKPOINTS
    name = f"step-{int(counters['step']):08d}"
    tmp, final, replaced = root / f".tmp-{name}", root / name, root / f".trash-{name}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(root)
        tmp.mkdir()
        save_model(model, str(tmp / "model.safetensors"))
        state = {"optimizer": optimizer.state_dict(), "generator": generator.get_state(),
                 "torch_rng": torch.get_rng_state(), "extra": extra_state or {}}
        if critic is not None:
            save_model(critic, str(tmp / "critic.safetensors"))
            state["critic_optimizer"] = critic_optimizer.state_dict()
        with open(tmp / "state.pt", "wb") as fh:
            torch.save(state, fh)
        (tmp / "counters.json").write_text(dumps_strict(counters, indent=2) + "\n")
        files = {p.name: _digest(p, sync=True) for p in sorted(tmp.iterdir())}
        (tmp / CHECKSUMS).write_text(json.dumps({"format": FORMAT, "step": int(counters["step"]),
                                                 "files": files}, indent=2) + "\n")
        _digest(tmp / CHECKSUMS, sync=True)
        _fsync_dir(tmp)
        if final.exists():  # the same step saved again (the older checkpoints stay meanwhile)
            os.rename(final, replaced)
        os.rename(tmp, final)  # the commit point
    except Exception as exc:  # nothing half-written stays; a kill (not an Exception) may
        shutil.rmtree(tmp, ignore_errors=True)  # leave .tmp-*, which the next save removes
        if replaced.exists() and not final.exists():
            os.rename(replaced, final)
        if (err := _output_error(exc, final)) is None:
            raise
        raise err from None
    _fsync_dir(root)
    if replaced.exists():
        shutil.rmtree(replaced)
    for old in list_checkpoints(run_dir)[max(1, keep):]:
        _remove(old)
    _fsync_dir(root)
    return final


# ---------------------------------------------------------------- finding

def list_checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoint folders, newest first (not verified)."""
    root = Path(run_dir) / CHECKPOINTS
    found = []
    if root.is_dir():
        for p in root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found, reverse=True)]


def find_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint folder of a run, or None when it has none."""
    found = list_checkpoints(run_dir)
    return found[0] if found else None


# ---------------------------------------------------------------- loading

class _Unusable(Exception):
    """A checkpoint that cannot be loaded; `problems` lists (file name, reason)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{f}: {why}" for f, why in problems))


@dataclass
class _Loaded:
    model: dict
    critic: dict | None
    state: dict
    counters: dict


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    text = text[0] if text else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def _verify_files(path: Path, need: list[str]) -> None:
    """Sizes and SHA-256 of the files against checksums.json; raises _Unusable."""
    sums_path = path / CHECKSUMS
    if not sums_path.is_file():
        raise _Unusable([(CHECKSUMS, "missing (the save did not finish)")])
    try:
        sums = json.loads(sums_path.read_text())
        files = sums["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _Unusable([(CHECKSUMS, f"unreadable ({_first_line(exc)})")]) from None
    problems = []
    for name in need:
        if name not in files:
            problems.append((name, f"not listed in {CHECKSUMS}"))
            continue
        try:
            want_size, want_sha = int(files[name]["bytes"]), str(files[name]["sha256"])
        except (KeyError, TypeError, ValueError):
            problems.append((name, f"bad entry in {CHECKSUMS}"))
            continue
        p = path / name
        if not p.is_file():
            problems.append((name, "missing"))
            continue
        size = p.stat().st_size
        if size != want_size:
            what = ("empty" if size == 0 else "truncated" if size < want_size
                    else "longer than written")
            problems.append((name, f"{what}: {size} bytes, expected {want_size}"))
            continue
        if _digest(p)["sha256"] != want_sha:
            problems.append((name, "corrupt: SHA-256 does not match checksums.json"))
    if problems:
        raise _Unusable(problems)


def _check_weights(module, tensors: dict) -> str | None:
    """Why `tensors` cannot be loaded into `module` (names, shapes), or None."""
    own = module.state_dict()
    unexpected = sorted(set(tensors) - set(own))
    if unexpected:
        return f"unexpected tensor '{unexpected[0]}' ({len(unexpected)} in all)"
    present = {own[k].untyped_storage().data_ptr() for k in tensors if own[k].numel()}
    for k, v in own.items():
        if k not in tensors and not (v.numel() and v.untyped_storage().data_ptr() in present):
            return f"tensor '{k}' is missing"  # tied weights (shared storage) are saved once
    for k, v in tensors.items():
        if tuple(v.shape) != tuple(own[k].shape):
            return f"tensor '{k}' has shape {tuple(v.shape)}, the model {tuple(own[k].shape)}"
    return None


def _check_optimizer(saved, optimizer) -> str | None:
    if not isinstance(saved, dict) or not {"state", "param_groups"} <= set(saved):
        return "not an optimizer state dict"
    groups = saved["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        return "parameter groups do not match the optimizer"
    for g, own in zip(groups, optimizer.param_groups):
        if not isinstance(g, dict) or len(g.get("params", ())) != len(own["params"]):
            return "parameter groups do not match the optimizer"
    return None


def _check_rng(value, like: torch.Tensor) -> bool:
    return (isinstance(value, torch.Tensor) and value.dtype == torch.uint8
            and value.shape == like.shape)


def _read(path: Path, *, model, optimizer, generator, critic, critic_optimizer) -> _Loaded:
    """Verify and parse one checkpoint into memory; change nothing. Raises _Unusable."""
    need = ["model.safetensors", "state.pt", "counters.json"]
    if critic is not None:
        need.insert(1, "critic.safetensors")
    _verify_files(path, need)
    problems = []

    def weights(name, module):
        try:
            tensors = load_file(str(path / name), device="cpu")
        except Exception as exc:  # noqa: BLE001 (safetensors raises its own error types)
            problems.append((name, f"unreadable ({_first_line(exc)})"))
            return None
        why = _check_weights(module, tensors)
        if why:
            problems.append((name, f"does not fit the model: {why}"))
        return tensors

    model_sd = weights("model.safetensors", model)
    critic_sd = weights("critic.safetensors", critic) if critic is not None else None
    state = None
    try:
        # weights_only: the restricted unpickler (tensors, containers, numbers); never run code
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (UnpicklingError, RuntimeError, EOFError, ...)
        problems.append(("state.pt", f"refused or unreadable ({_first_line(exc)})"))
    if state is not None:
        why = None
        if not isinstance(state, dict):
            why = "not a state dict"
        elif (w := _check_optimizer(state.get("optimizer"), optimizer)) is not None:
            why = f"optimizer: {w}"
        elif critic is not None and (
                w := _check_optimizer(state.get("critic_optimizer"), critic_optimizer)) is not None:
            why = f"critic optimizer: {w}"
        elif not _check_rng(state.get("generator"), generator.get_state()):
            why = "generator state is missing or of the wrong size"
        elif not _check_rng(state.get("torch_rng"), torch.get_rng_state()):
            why = "torch RNG state is missing or of the wrong size"
        elif not isinstance(state.get("extra", {}), dict):
            why = "'extra' is not a dict"
        if why:
            problems.append(("state.pt", why))
    counters = None
    try:
        counters = json.loads((path / "counters.json").read_text())
        if not isinstance(counters, dict) or not all(
                isinstance(counters.get(k), int) for k in ("step", "consumed")):
            raise ValueError("no integer 'step' and 'consumed'")
    except (OSError, ValueError) as exc:
        problems.append(("counters.json", f"unreadable ({_first_line(exc)})"))
    if problems:
        raise _Unusable(problems)
    return _Loaded(model_sd, critic_sd, state, counters)


def _apply(loaded: _Loaded, *, model, optimizer, generator, critic, critic_optimizer) -> None:
    model.load_state_dict(loaded.model, strict=False)  # checked: only tied names are absent
    optimizer.load_state_dict(loaded.state["optimizer"])
    if critic is not None:
        critic.load_state_dict(loaded.critic, strict=False)
        critic_optimizer.load_state_dict(loaded.state["critic_optimizer"])
    generator.set_state(loaded.state["generator"])
    torch.set_rng_state(loaded.state["torch_rng"])


def _candidates(path: Path) -> tuple[Path, list[Path]]:
    """(run directory, checkpoints to try newest first) for a run directory or a checkpoint
    folder; a checkpoint folder is tried first, then the older checkpoints of its run."""
    path = Path(path)
    if path.parent.name == CHECKPOINTS and _STEP_DIR.match(path.name):
        run_dir = path.parent.parent
        mine = int(_STEP_DIR.match(path.name).group(1))
        older = [p for p in list_checkpoints(run_dir) if p != path and not (
            _STEP_DIR.match(p.name) and int(_STEP_DIR.match(p.name).group(1)) > mine)]
        return run_dir, [path] + older
    if (path / CHECKSUMS).exists():
        return path.parent, [path]
    return path, list_checkpoints(path)


def load_checkpoint(path: Path, *, model, optimizer, generator: torch.Generator, critic=None,
                    critic_optimizer=None) -> tuple[dict, dict]:
    """Restore states in place from the checkpoint at `path` (a checkpoint folder, as
    `find_checkpoint` returns, or a run directory: its newest checkpoint); return
    (counters, extra_state).

    A checkpoint that fails verification is logged as a one-line warning naming the file, and
    the run's previous checkpoint is tried. Nothing is changed until one verified completely.
    Raises DataError (naming the run directory and the failed files) when none loads."""
    run_dir, candidates = _candidates(path)
    failed: list[str] = []
    for i, ckpt in enumerate(candidates):
        try:
            loaded = _read(ckpt, model=model, optimizer=optimizer, generator=generator,
                           critic=critic, critic_optimizer=critic_optimizer)
            _apply(loaded, model=model, optimizer=optimizer, generator=generator,
                   critic=critic, critic_optimizer=critic_optimizer)
        except _Unusable as exc:
            problems = exc.problems
        except Exception as exc:  # noqa: BLE001 (applying failed despite the checks; an
            # older checkpoint, applied in full, overwrites whatever was changed)
            problems = [("(restore)", _first_line(exc))]
        else:
            return loaded.counters, loaded.state.get("extra", {})
        text = "; ".join(f"{ckpt / f}: {why}" for f, why in problems)
        failed.append("; ".join(f"{ckpt.name}/{f}: {why}" for f, why in problems))
        nxt = (f"trying the previous checkpoint {candidates[i + 1]}" if i + 1 < len(candidates)
               else "no older checkpoint to try")
        log.warning("checkpoint unusable: %s; %s", text, nxt)
    if not candidates:
        raise DataError("no checkpoint to resume from", where=str(run_dir))
    raise DataError("no loadable checkpoint (" + "; ".join(failed)
                    + "); start over with --fresh", where=str(run_dir))
