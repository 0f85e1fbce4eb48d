"""common/strict_yaml: every document of a YAML stream, a key given twice refused in any of them."""

import pytest
import yaml

from gosched.common.strict_yaml import DuplicateKeyError, load_yaml, load_yaml_all


def test_load_yaml_all_keeps_every_document_in_order_an_empty_one_as_none() -> None:
    assert load_yaml_all("a: 1\n---\n---\n- b\n") == [{"a": 1}, None, ["b"]]
    assert load_yaml_all("") == []
    assert load_yaml_all("a: 1\n") == [load_yaml("a: 1\n")]


def test_load_yaml_all_refuses_a_key_given_twice_naming_it_and_its_line() -> None:
    with pytest.raises(DuplicateKeyError, match=r"^duplicate key 'x' \(line 5\)$"):
        load_yaml_all("a: 1\n---\nb: 2\nx: 1\nx: 2\n")


def test_load_yaml_all_keeps_merge_keys_and_raises_yaml_errors() -> None:
    assert load_yaml_all("base: &b {x: 1}\nuse:\n  <<: *b\n  x: 2\n")[0]["use"] == {"x": 2}
    with pytest.raises(yaml.YAMLError):
        load_yaml_all("a: 1\n---\n[unclosed\n")
