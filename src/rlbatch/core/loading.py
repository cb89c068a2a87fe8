"""Load a `Config` from YAML files, presets and `--set a.b=c` overrides.

Every value remembers where it came from (`file:line` or `--set key`), so a validation error
is one line naming the field and its origin (docs/design.md, house rule 10). `extends:` names
a preset (`grpo-tiny`) or a YAML file relative to the extending file; the child is deep-merged
over it. A `derived:` section (as written to a run's config.yaml) is ignored on load: it is
recomputed. A key given twice in one mapping is an error at its second occurrence (YAML
parsers keep the last silently); types, bounds and finiteness are checked by `core/config.py`.
An error caused by a `--set` names the `--set`: what an override replaces or creates takes its
origin (a key under a value, `batch.prompts_per_step.x=3`, is refused at the override). A
config path that is a directory says so rather than "not found".
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
from rlbatch.core.errors import ConfigError, missing
from rlbatch.core.runlog import YAML_LOADER

MAX_CONFIG_BYTES = 1 << 20  # a config file or one --set value; real configs are a few kB

Origins = dict[tuple, str]


def preset_names() -> list[str]:
    root = resources.files("rlbatch.core") / "presets"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def preset_summary(name: str) -> str:
    """What a preset is for, in one line: the first sentence or clause of its leading
    comment (a leading "`command` (note):" is dropped)."""
    lines = []
    for line in _preset_text(name).splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(lines)
    text = re.sub(r"^`[^`]*`\s*(\([^)]*\))?\s*:\s*", "", text)
    head = re.split(r":\s|\.\s|;\s", text, maxsplit=1)[0].rstrip(".")
    if len(head) > 72:
        head = head.split(", ")[0]
    return head[:1].upper() + head[1:]


def _preset_text(name: str) -> str:
    path = resources.files("rlbatch.core") / "presets" / f"{name}.yaml"
    if not path.is_file():
        close = difflib.get_close_matches(name, preset_names(), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; presets: {', '.join(preset_names())}"
        raise ConfigError(f"unknown preset '{name}'{hint}")
    return path.read_text()


def _parse_yaml(text: str, source: str) -> tuple[dict, Origins]:
    try:
        loader = YAML_LOADER(text)  # libyaml where built: a config bomb is refused in seconds
        try:
            node = loader.get_single_node()
            data = None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"YAML syntax error: {problem}", where=f"{source}{line}") from None
    except RecursionError:
        raise ConfigError("YAML nested too deep", where=source) from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping of keys to values", where=f"{source}:1")
    origins: Origins = {}
    try:
        _walk(node, (), source, origins)
    except RecursionError:
        raise ConfigError("YAML nested too deep", where=source) from None
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
    if candidate is not None and (parent.endswith((".yaml", ".yml")) or candidate.exists()):
        text = _read_config_file(candidate, f"extended file {parent}", origins[("extends",)])
        pdata, porig = _load_layer(text, str(candidate), candidate.parent, depth + 1)
    else:
        try:
            text = _preset_text(parent)
        except ConfigError as exc:  # an unknown preset: the `extends:` line that names it
            raise ConfigError(str(exc), where=origins[("extends",)]) from None
        pdata, porig = _load_layer(text, f"preset:{parent}", None, depth + 1)
    return _merge(pdata, data), {**porig, **origins}


def _read_config_file(path: Path, what: str, where: str | None = None) -> str:
    """The text of a YAML config file; a missing path, a directory or an unreadable file is
    one line saying which (a directory is not reported as missing)."""
    if path.is_dir():
        raise ConfigError(f"{what} is a directory, not a YAML file", where=where)
    if not path.exists():
        raise ConfigError(missing(path, what), where=where)
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{what} is {size:,} bytes; a config is at most "
                              f"{MAX_CONFIG_BYTES:,} bytes", where=where)
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what}: {exc.__class__.__name__}", where=where) from None


_NOT_SETTABLE = {"extends": "`extends` names a preset or file inside a config file; give the "
                 "file (or --preset) instead",
                 "derived": "`derived` values are computed from the config, not set"}


def parse_override(item: str) -> tuple[tuple, Any]:
    """`a.b=c` -> (('a', 'b'), value parsed as YAML); errors name the `--set` item."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got '{item}'")
    key, raw = item.split("=", 1)
    key = key.strip()
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"the value is {len(raw):,} characters; a value is at most "
                          f"{MAX_CONFIG_BYTES:,}", where=f"--set {key[:80]}")
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set has an empty key in '{item}'")
    top = key.split(".")[0]
    if top in _NOT_SETTABLE:
        raise ConfigError(_NOT_SETTABLE[top], where=f"--set {key}")
    try:
        value = yaml.load(raw, Loader=YAML_LOADER) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return tuple(key.split(".")), value


def _apply_override(data: dict, path: tuple, value: Any, origins: Origins) -> dict:
    """`data` with `path` set to `value`. Sections on the way are created when absent; a key
    on the way that holds a value (`batch.prompts_per_step.x=3`) is an error naming the
    `--set`, not the line that set the value. `origins` is updated in place: what the
    override replaced no longer points at its old lines, and what it created points at it."""
    where = f"--set {'.'.join(path)}"
    out = dict(data)
    cursor = out
    for n, part in enumerate(path[:-1], start=1):
        child = cursor.get(part)
        if child is not None and not isinstance(child, dict):
            name, was = ".".join(path[:n]), origins.get(path[:n])
            raise ConfigError(f"{name} is {child!r}{f' ({was})' if was else ''}, not a section; "
                              f"it has no key '{path[n]}'", where=where)
        child = dict(child) if isinstance(child, dict) else {}
        cursor[part] = child
        cursor = child
    cursor[path[-1]] = value
    for key in [k for k in origins if k[:len(path)] == path]:
        del origins[key]
    for n in range(1, len(path) + 1):
        origins.setdefault(path[:n], where)
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
        text = _read_config_file(p, "config file", str(path))
        data, origins = _load_layer(text, str(path), p.parent)
    elif preset is not None:
        data, origins = _load_layer(_preset_text(preset), f"preset:{preset}", None)
    else:
        data, origins = {}, {}
    for item in overrides:
        key, value = parse_override(item)
        data = _apply_override(data, key, value, origins)
    return validate_config(data, origins)


def validate_config(data: dict, origins: Origins | None = None) -> Config:
    origins = origins or {}
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        err = ConfigError(_describe(exc, origins))
        err.all_errors = [str(ConfigError(_one(e, origins))) for e in exc.errors()]
        raise err from None


def _describe(exc: ValidationError, origins: Origins) -> str:
    """The first error in one line, and how many more there are."""
    errors = exc.errors()
    more = f" (+{len(errors) - 1} more; `rlbatch config check` lists them)" \
        if len(errors) > 1 else ""
    return _one(errors[0], origins) + more


def _one(first: dict, origins: Origins) -> str:
    """One validation error in one line, naming its field and where it was set."""
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
        # `--set a.b: a.b: ...` would name the field twice
        named = "" if where == f"--set {field}" else f"{field}: "
        message = f"{named}{first['msg']}{shown}"
    text = f"{where}: {message}" if where else message
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
