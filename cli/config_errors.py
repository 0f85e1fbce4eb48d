"""Configuration errors told as the config is written: one line per error, with the field's path
(queues[1].policy), the reason in the config's own words, not pydantic's, and where the value came
from (the YAML file, a GOSCHED_* variable, a command's flag). Only the CLI tells them."""

import difflib
import itertools
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel
from pydantic_settings import EnvSettingsSource

from gosched.common.config import NAME_PATTERN, Settings, env_has_settings


def _near_key(loc: Sequence[str | int]) -> str | None:
    """The known key of the section of `loc` (an unknown key's path) nearest its last part."""
    *section, key = loc
    model: Any = Settings
    for part in section:  # down the section's path: a field's model, or a list's items'
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        model = next(
            (
                a
                for a in (field.annotation, *get_args(field.annotation))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            None,
        )
        if model is None:
            return None
    known = list(getattr(model, "model_fields", {}))
    near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    return near[0] if near else None


def field_path(loc: Sequence[str | int]) -> str:
    """A setting's path as the config file reads: ("queues", 1, "policy") is queues[1].policy."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


# -- where a setting came from, and its errors told one a line ------------------------------------


class SettingsSources:
    """Where each value of merged settings came from, highest first: a command's flags, GOSCHED_*
    env, the YAML file, the command's own defaults (load_settings's layers, read again: only to
    tell an error's source, so a file or env that cannot be read is simply not counted).
    `flag_names` maps a top-level key to its flag where that is not --<key with dashes>."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        defaults: Mapping[str, Any] | None = None,
        overrides: Mapping[str, Any] | None = None,
        flag_names: Mapping[str, str] | None = None,
    ) -> None:
        self.path = str(path) if path else None
        self.file_values: dict[str, Any] = {}
        if self.path:
            try:
                loaded = yaml.safe_load(Path(self.path).read_text()) or {}
            except (OSError, yaml.YAMLError):
                loaded = {}
            self.file_values = loaded if isinstance(loaded, dict) else {}
        self.env_values: dict[str, Any] = {}
        if env_has_settings():
            try:
                self.env_values = dict(EnvSettingsSource(Settings)())
            except Exception:  # an env value that does not even parse: told by the load itself
                self.env_values = {}
        self.flags = {k: v for k, v in (overrides or {}).items() if v is not None}
        self.flag_names = dict(flag_names or {})
        self.defaults = dict(defaults or {})

    def source_of(self, loc: Sequence[str | int]) -> str | None:
        """Where the value at `loc` came from, as an error names it ("in gosched.yaml", "from
        GOSCHED_SHARDS", "from --shards"), or None (a default of the model, or no such value)."""
        if not loc:
            return None
        if _holds(self.flags, loc):
            key = str(loc[0])
            return f"from {self.flag_names.get(key, '--' + key.replace('_', '-'))}"
        if _holds(self.env_values, loc):
            return f"from {_env_name(loc)}"
        if self.path and _holds(self.file_values, loc):
            return f"in {self.path}"
        if _holds(self.defaults, loc):
            return "this command's default"
        return None

    def error_lines(self, errors: Sequence[Mapping[str, Any]]) -> list[str]:
        """One line per error of pydantic's `errors` (ValidationError.errors()): the field's path,
        the reason, the source: "queues[1].policy: must be one of fifo, priority, drf, fair,
        deadline; got 'lifo' (in gosched.yaml)". No pydantic wording or links."""
        lines = []
        for err in errors:
            loc: tuple[str | int, ...] = tuple(err.get("loc", ()))
            reason = _reason(err)
            last = loc[-1] if loc else None
            if isinstance(last, str) and re.match(rf"{re.escape(last)}\b", reason):
                where = field_path(loc[:-1])  # the reason names its field: "tenant_weights['A']: ..."
                text = f"{where}.{reason}" if where else reason
            elif loc:
                text = f"{field_path(loc)}: {reason}"
            else:  # a check across fields: its message starts with the one it is about
                text = reason
                loc = leading_path(reason)
            source = self.source_of(loc)
            lines.append(f"{text} ({source})" if source else text)
        return lines

    def described(self, message: str) -> str:
        """`message` (a check's, naming its field first: "profile.filters[1]: ...") with the
        source of that field."""
        source = self.source_of(leading_path(message))
        return f"{message} ({source})" if source else message


def _holds(values: Any, loc: Sequence[str | int]) -> bool:
    """`values` (one layer) sets the value at `loc`: it has every key down the path, or a list or
    a value on the way (a list is replaced whole: its items are that layer's)."""
    node = values
    for part in loc:
        if not isinstance(node, dict):
            return node is not values
        if part not in node:
            return False
        node = node[part]
    return True


def _env_name(loc: Sequence[str | int]) -> str:
    """The GOSCHED_* variable that set `loc`: the longest one of its path that is set."""
    keys = [str(p) for p in itertools.takewhile(lambda p: isinstance(p, str), loc)]  # a list: whole
    names = {k.upper(): k for k in os.environ}
    for n in range(len(keys), 0, -1):
        wanted = "GOSCHED_" + "__".join(keys[:n]).upper()
        if wanted in names:
            return names[wanted]
    return "GOSCHED_" + "__".join(keys).upper()


_LEADING_PATH = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*|\[\d+\])*)")


def leading_path(message: str) -> tuple[str | int, ...]:
    """The setting a message starts with ("node_timeout_s (1.0) must ...", "profile.filters[1]:
    ..."), as a path, if its first key is a setting; else ()."""
    match = _LEADING_PATH.match(message)
    if match is None:
        return ()
    parts: list[str | int] = []
    for name, index in re.findall(r"([a-z_][a-z0-9_]*)|\[(\d+)\]", match[1]):
        parts.append(int(index) if index else name)
    return tuple(parts) if parts and parts[0] in Settings.model_fields else ()


_BOUNDS = {
    "greater_than_equal": ("at least", "ge"),
    "greater_than": ("greater than", "gt"),
    "less_than_equal": ("at most", "le"),
    "less_than": ("less than", "lt"),
}
_KINDS = {
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "finite_number": "a finite number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping (key: value)",
    "model_type": "a section (a mapping of keys)",
    "model_attributes_type": "a section (a mapping of keys)",
}


def _got(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _reason(err: Mapping[str, Any]) -> str:
    """Why pydantic refused a value, in the words of the config's own messages."""
    kind = str(err.get("type", ""))
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    got = _got(err.get("input"))
    if kind == "extra_forbidden":
        near = _near_key(err["loc"])
        return f"did you mean {near!r}? there is no such key" if near else "there is no such key"
    if kind == "missing":
        return "is required"
    if kind in ("enum", "literal_error"):
        options = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return f"must be one of {', '.join(options)}; got {got}"
    if kind in _BOUNDS:
        words, key = _BOUNDS[kind]
        return f"must be {words} {ctx.get(key)}; got {got}"
    if kind in _KINDS:
        return f"must be {_KINDS[kind]}; got {got}"
    if kind == "string_pattern_mismatch":
        if ctx.get("pattern") == NAME_PATTERN:
            return (
                "must be a name of lowercase letters, digits, '-', '_' and '.', starting and ending "
                f"with a letter or digit; got {got}"
            )
        return f"must match {ctx.get('pattern')}; got {got}"
    if kind == "string_too_short":
        return f"must be at least {ctx.get('min_length')} character(s) long; got {got}"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters long; got {got}"
    msg = str(err.get("msg", ""))
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg.removeprefix(prefix)
    if msg.startswith("Input should be "):
        return f"must be {msg.removeprefix('Input should be ')}; got {got}"
    return f"{msg[:1].lower()}{msg[1:]}" if msg else kind
