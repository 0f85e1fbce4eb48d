"""YAML read strictly: a key given twice in one mapping is an error naming the key and its line
(PyYAML keeps the last one without a word, so a constraint or a setting would be lost). For the
job files `gosched submit` reads and the config file."""

from collections.abc import Hashable
from typing import Any

import yaml


class DuplicateKeyError(ValueError):
    """A key given twice in one mapping: the last would silently win."""

    def __init__(self, key: object, line: int | None = None) -> None:
        super().__init__(f"duplicate key {key!r}" + (f" (line {line})" if line is not None else ""))


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses duplicate keys (PyYAML keeps the last one without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<": overriding merged keys is its purpose
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable: the base class reports it
                continue
            if duplicate:
                raise DuplicateKeyError(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """The YAML document in `text` as plain data; DuplicateKeyError or yaml.YAMLError."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # safe: a SafeLoader subclass


def load_yaml_all(text: str) -> list[Any]:
    """Every YAML document in `text` (a stream may hold several, between `---` lines) as plain
    data, in order, an empty one as None; a key given twice is refused as in load_yaml.
    DuplicateKeyError or yaml.YAMLError, raised before any document is returned."""
    return list(yaml.load_all(text, Loader=_UniqueKeyLoader))  # safe: a SafeLoader subclass
