"""Load a `Config` from YAML files, presets and `--set a.b=c` overrides.

Every value remembers where it came from (`file:line` or `--set key`), so a validation error
is one line naming the field and its origin (docs/design.md, house rule 10). `extends:` names
a preset (`grpo-tiny`) or a YAML file relative to the extending file; the child is deep-merged
over it. A `derived:` section (as written to a run's config.yaml) is ignored on load: it is
recomputed. A key given twice in one mapping is an error at its second occurrence (YAML
parsers keep the last silently); types, bounds and finiteness are checked by `core/config.py`.
"""

from __future__ import annotations

import difflib
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlbatch.core.config import Config
from rlbatch.core.errors import ConfigError

Origins = dict[tuple, str]


def preset_names() -> list[str]:
    root = resources.files("rlbatch.core") / "presets"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def _preset_text(name: str) -> str:
    path = resources.files("rlbatch.core") / "presets" / f"{name}.yaml"
    if not path.is_file():
        close = difflib.get_close_matches(name, preset_names(), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; presets: {', '.join(preset_names())}"
        raise ConfigError(f"unknown preset '{name}'{hint}")
    return path.read_text()


def _parse_yaml(text: str, source: str) -> tuple[dict, Origins]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"YAML syntax error: {problem}", where=f"{source}{line}") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping of keys to values", where=f"{source}:1")
    origins: Origins = {}
    _walk(node, (), source, origins)
    return data, origins


def _walk(node: Any, path: tuple, source: str, origins: Origins) -> None:
    origins[path] = f"{source}:{node.start_mark.line + 1}"
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:  # PyYAML keeps the last silently; a config must say one thing
                name = ".".join(map(str, path + (key,)))
                raise ConfigError(f"duplicate key '{name}'",
                                  where=f"{source}:{key_node.start_mark.line + 1}")
            seen.add(key)
            origins[path + (key,)] = f"{source}:{key_node.start_mark.line + 1}"
            _walk(value_node, path + (key,), source, origins)
            origins[path + (key,)] = f"{source}:{key_node.start_mark.line + 1}"


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _load_layer(text: str, source: str, base_dir: Path | None, depth: int = 0) -> tuple[dict, Origins]:
    if depth > 8:
        raise ConfigError("`extends:` chain is deeper than 8 (a cycle?)", where=source)
    data, origins = _parse_yaml(text, source)
    parent = data.pop("extends", None)
    data.pop("derived", None)
    if parent is None:
        return data, origins
    if not isinstance(parent, str):
        raise ConfigError("`extends` must be a preset name or a file path", where=origins[("extends",)])
    candidate = (base_dir / parent) if base_dir is not None else None
    if candidate is not None and (parent.endswith((".yaml", ".yml")) or candidate.is_file()):
        if not candidate.is_file():
            raise ConfigError(f"extended file not found: {parent}", where=origins[("extends",)])
        pdata, porig = _load_layer(candidate.read_text(), str(candidate), candidate.parent, depth + 1)
    else:
        pdata, porig = _load_layer(_preset_text(parent), f"preset:{parent}", None, depth + 1)
    return _merge(pdata, data), {**porig, **origins}


def parse_override(item: str) -> tuple[tuple, Any]:
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got '{item}'")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set has an empty key in '{item}'")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return tuple(key.split(".")), value


def _apply_override(data: dict, path: tuple, value: Any) -> dict:
    out = dict(data)
    cursor = out
    for part in path[:-1]:
        child = cursor.get(part)
        child = dict(child) if isinstance(child, dict) else {}
        cursor[part] = child
        cursor = child
    cursor[path[-1]] = value
    return out


def load_config(
    path: str | Path | None = None,
    *,
    preset: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> Config:
    """Resolve a config from a file or preset plus `a.b=c` overrides; raise ConfigError."""
    if path is not None and preset is not None:
        raise ConfigError("give a config file or --preset, not both")
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file: {exc.__class__.__name__}", where=str(path))
        data, origins = _load_layer(text, str(path), p.parent)
    elif preset is not None:
        data, origins = _load_layer(_preset_text(preset), f"preset:{preset}", None)
    else:
        data, origins = {}, {}
    for item in overrides:
        key, value = parse_override(item)
        data = _apply_override(data, key, value)
        origins[key] = f"--set {'.'.join(key)}"
    return validate_config(data, origins)


def validate_config(data: dict, origins: Origins | None = None) -> Config:
    origins = origins or {}
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, origins)) from None


def _describe(exc: ValidationError, origins: Origins) -> str:
    errors = exc.errors()
    first = errors[0]
    loc = tuple(str(x) for x in first["loc"])
    where = _origin(loc, origins)
    field = ".".join(loc) if loc else "config"
    if first["type"] == "extra_forbidden":
        message = f"unknown key '{field}'" + _suggest(loc)
    elif first["type"] == "missing":
        message = f"{field}: required field is missing"
    elif first["type"] == "value_error":
        # Cross-field checks name their fields in the message; point at the first one named.
        message = first["msg"].removeprefix("Value error, ")
        for name in re.findall(r"[a-z_]+\.[a-z_.]+", message):
            key = tuple(name.split("."))
            if key in origins:
                where = origins[key]
                break
    else:
        got = first.get("input")
        shown = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
        message = f"{field}: {first['msg']}{shown}"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    text = f"{where}: {message}{more}" if where else f"{message}{more}"
    return " ".join(text.split())


def _origin(loc: tuple, origins: Origins) -> str | None:
    for n in range(len(loc), -1, -1):
        if loc[:n] in origins:
            return origins[loc[:n]]
    return None


def _suggest(loc: tuple) -> str:
    model: type[BaseModel] = Config
    for part in loc[:-1]:
        field = model.model_fields.get(part)
        sub = getattr(field, "annotation", None) if field else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return ""
        model = sub
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(model.model_fields)}"


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.resolved_dict(), sort_keys=False)
