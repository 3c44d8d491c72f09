"""Reading configs: strict YAML (UTF-8, no duplicate keys, ``1e-4`` is a number), typed coercion
of ``key=value`` strings, and the flat view of a config used to compare two of them."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path

import yaml

__all__ = ["read_yaml", "parse_value", "coerce", "flatten", "diff"]


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader for which a repeated key in one mapping is an error, not a silent
    last-one-wins."""


def _mapping_without_duplicates(loader, node, deep=False):
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise ValueError(f"line {line}: duplicate key {key!r} (first set at line {seen[key]})")
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
# YAML 1.1 reads ``1e-4`` (no dot) as a string; in a config that is always a number
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def _load(text: str):
    return yaml.load(text, Loader=_UniqueKeyLoader)


def parse_value(text: str, key: str = "value"):
    """A ``key=value`` override's value read as YAML (``[1, 10]``, ``{k: 4}``, ``1e-4``); malformed
    YAML or a repeated key is a ``ValueError`` naming ``key``."""
    try:
        return _load(text)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(
            f"{key}: cannot read {text!r} as a YAML value ({problem}); quote an override whose "
            "value has spaces: 'task.params={a: 1, b: 2}'"
        ) from None
    except ValueError as e:
        raise ValueError(f"{key}: {e}") from None


def _key_lines(text: str) -> dict[str, int]:
    """``section.key -> line`` of a config file's two top levels (for messages)."""
    out: dict[str, int] = {}
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(root, yaml.MappingNode):
        return out
    for sec_key, sec in root.value:
        out[str(sec_key.value)] = sec_key.start_mark.line + 1
        if isinstance(sec, yaml.MappingNode):
            for k, _ in sec.value:
                out[f"{sec_key.value}.{k.value}"] = k.start_mark.line + 1
    return out


def read_yaml(path: str | Path) -> tuple[dict, dict[str, int]]:
    """A YAML config file as ``(data, key -> line)``; errors name the file and the line."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"config file {str(p)!r} does not exist" + (" (it is a folder)" if p.is_dir() else ""))
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ValueError(
            f"config file {str(p)!r}, line {line}: not UTF-8 text (byte {raw[e.start]:#04x} at "
            f"offset {e.start}); save the file as UTF-8"
        ) from None
    try:
        data = _load(text)
        lines = _key_lines(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f", line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"config file {str(p)!r}{at}: not valid YAML: {e}") from None
    except ValueError as e:
        raise ValueError(f"config file {str(p)!r}, {e}") from None
    return (data if data is not None else {}), lines


def coerce(value, tp, key: str):
    """Coerce ``value`` (from YAML or a ``key=value`` string) to the annotated type ``tp``; a value
    that does not fit is a ``ValueError`` naming ``key``. A type without a coercer passes as is."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):  # X | None
        return _coerce_union(value, tp, key)
    if tp is bool:
        return _coerce_bool(value, key)
    if tp in (int, float):
        return _coerce_number(value, tp, key)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{key}: expected a string, got {value!r}")
        return value
    if origin is tuple:
        return _coerce_tuple(value, typing.get_args(tp), key)
    if tp is list or origin is list:
        return _coerce_list(value, typing.get_args(tp), key)
    if tp is dict or origin is dict:
        value = _yaml_if_str(value, key)
        if not isinstance(value, dict):
            raise ValueError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    return value


def _coerce_union(value, tp, key: str):
    """``X | None``: ``None`` (or the strings ``none``/``null``) when ``None`` is allowed, else the
    first member type that takes ``value``."""
    args = typing.get_args(tp)
    if type(None) in args and (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))):
        return None
    for a in args:
        if a is not type(None):
            try:
                return coerce(value, a, key)
            except ValueError:
                pass
    raise ValueError(f"{key}: cannot interpret {value!r} as {tp}")


def _coerce_bool(value, key: str) -> bool:
    """A YAML boolean, or one of the strings true/1/yes and false/0/no (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ValueError(f"{key}: expected true/false, got {value!r}")


def _coerce_number(value, tp: type, key: str):
    """``int`` or ``float``: a boolean is neither (YAML's ``true`` is not 1), and an int takes no
    fractional part (``2.5`` is an error, not a silent 2)."""
    if isinstance(value, bool):
        raise ValueError(f"{key}: expected {tp.__name__}, got {value!r}")
    try:
        out = tp(value) if not isinstance(value, str) else tp(float(value)) if tp is float else int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: expected {tp.__name__}, got {value!r}") from None
    if tp is int and isinstance(value, float) and value != int(value):
        raise ValueError(f"{key}: expected int, got {value!r}")
    return out


def _coerce_tuple(value, args: tuple, key: str) -> tuple:
    """``tuple[X, Y, ...]``: a YAML list of exactly ``len(args)`` values, each coerced to its type."""
    value = _yaml_if_str(value, key)
    if not isinstance(value, (list, tuple)) or len(value) != len(args):
        raise ValueError(f"{key}: expected a list of {len(args)} values, got {value!r}")
    return tuple(coerce(v, a, key) for v, a in zip(value, args))


def _coerce_list(value, args: tuple, key: str) -> list:
    """``list[X]``: a YAML list (or a tuple), each item coerced to X (a bare ``list``: as is)."""
    value = _yaml_if_str(value, key)
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise ValueError(f"{key}: expected a list, got {value!r}")
    return [coerce(v, args[0], key) for v in value] if args else value


def _yaml_if_str(value, key: str):
    """A ``key=value`` override's string read as YAML (``[1, 10]``, ``{k: 4}``); other values as they are."""
    return parse_value(value, key) if isinstance(value, str) else value


def flatten(d: dict, prefix: str = "") -> dict:
    """``{"algo": {"eps_low": 0.2}} -> {"algo.eps_low": 0.2}`` (dict-valued params flattened too)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            sub = flatten(v, key + ".")
            out.update(sub if sub else {key: {}})
        else:
            out[key] = list(v) if isinstance(v, tuple) else v
    return out


def diff(old: dict, new: dict) -> dict[str, tuple]:
    """Keys whose values differ between two config dicts: ``key -> (old, new)``."""
    a, b = flatten(old), flatten(new)
    missing = object()
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k, missing) != b.get(k, missing)}
