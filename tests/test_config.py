"""load_settings: the YAML file, GOSCHED_* env vars and flags, merged section by section."""

from pathlib import Path

import pytest

from gosched.common.config import load_settings

FILE = """
shards: 3
admission:
  tenant_burst: 7
  max_pending_jobs: 50
profile:
  filters: [node_ready, resources_fit]
  scores: []
  preemption: true
"""


@pytest.mark.parametrize(
    ("env", "flags", "expect"),
    [
        # One nested env key changes that key only; the file's others stay.
        (
            {"GOSCHED_ADMISSION__MAX_PENDING_JOBS": "9"},
            {},
            {("admission", "max_pending_jobs"): 9, ("admission", "tenant_burst"): 7, ("shards",): 3},
        ),
        # The file's trimmed plugin chain survives a change to another profile key.
        (
            {"GOSCHED_PROFILE__PREEMPTION": "false"},
            {},
            {("profile", "preemption"): False, ("profile", "filters"): ["node_ready", "resources_fit"]},
        ),
        # Flags over env over the file.
        ({"GOSCHED_SHARDS": "5"}, {}, {("shards",): 5, ("admission", "tenant_burst"): 7}),
        ({"GOSCHED_SHARDS": "5"}, {"shards": 8}, {("shards",): 8}),
        ({}, {"shards": None}, {("shards",): 3}),  # a flag not given does not clear the file's value
    ],
)
def test_env_and_flags_override_the_file_key_by_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], flags: dict, expect: dict
) -> None:
    path = tmp_path / "gosched.yaml"
    path.write_text(FILE)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(path, **flags)
    for keys, want in expect.items():
        got: object = settings
        for key in keys:
            got = getattr(got, key)
        assert got == want, keys
    assert settings.profile.scores == []  # never put back to the defaults by a merge


def test_a_yaml_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("shards: [1,\n")
    with pytest.raises(ValueError, match=r"broken\.yaml: not valid YAML"):
        load_settings(path)
