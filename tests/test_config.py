"""load_settings: the YAML file, GOSCHED_* env vars and flags, merged section by section."""

import re
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


@pytest.mark.parametrize(
    ("profile", "error"),
    [
        ("filters: [node_ready, nope]", r"profile\.filters\[1\]: unknown plugin 'nope'"),
        ("scores: [{name: most_alocated}]", r"profile\.scores\[0\]: unknown plugin 'most_alocated'"),
        ("locating: [resources_fit]", r"profile\.locating\[0\]: unknown plugin 'resources_fit'"),  # a filter
        # a unit filter is a filter too
        ("filters: [node_ready, resources_fit, anti_affinity, taint_toleration]", None),
    ],
)
def test_config_show_checks_the_profile_plugin_names(tmp_path: Path, profile: str, error: str | None) -> None:
    from typer.testing import CliRunner

    from gosched.cli.main import app

    path = tmp_path / "gosched.yaml"
    path.write_text(f"profile:\n  {profile}\n")
    result = CliRunner().invoke(app, ["config", "show", "-c", str(path)])
    if error is None:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 2
        assert re.search(error, result.stderr) and "invalid configuration" in result.stderr


def test_an_empty_queue_list_is_refused(tmp_path: Path) -> None:
    # Every job names a queue ("default" unless it says otherwise): with none, no submission could pass.
    path = tmp_path / "gosched.yaml"
    path.write_text("queues: []\n")
    with pytest.raises(ValueError, match=r"queues\n.*at least one queue"):
        load_settings(path)
    from typer.testing import CliRunner

    from gosched.cli.main import app

    result = CliRunner().invoke(app, ["config", "show", "-c", str(path)])
    assert result.exit_code == 2, result.output
    assert "invalid configuration" in result.stderr and "at least one queue" in result.stderr


def test_env_values_are_checked_with_the_files_not_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node_timeout_s must be at least twice heartbeat_interval_s: an env value is judged against
    the file's other value, not against the default it would have on its own."""
    path = tmp_path / "gosched.yaml"
    path.write_text("heartbeat_interval_s: 0.2\n")
    monkeypatch.setenv("GOSCHED_NODE_TIMEOUT_S", "1")
    settings = load_settings(path)
    assert (settings.heartbeat_interval_s, settings.node_timeout_s) == (0.2, 1.0)
    monkeypatch.setenv("GOSCHED_NODE_TIMEOUT_S", "0.3")  # and still refused when the pair is wrong
    with pytest.raises(ValueError, match="node_timeout_s"):
        load_settings(path)


def test_a_commands_defaults_sit_below_the_file_and_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gosched up runs 4 shards and keeps its store in its work dir, unless the file, the env or a
    flag says otherwise."""
    defaults = {"shards": 4, "store_path": "/work/dir/gosched.db"}
    assert load_settings(None, defaults=defaults).shards == 4
    path = tmp_path / "gosched.yaml"
    path.write_text("shards: 3\nstore_path: /data/gs.db\n")
    from_file = load_settings(path, defaults=defaults)
    assert (from_file.shards, from_file.store_path) == (3, "/data/gs.db")
    monkeypatch.setenv("GOSCHED_SHARDS", "6")
    assert load_settings(path, defaults=defaults).shards == 6
    assert load_settings(path, defaults=defaults, shards=2).shards == 2


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("queues: [{name: default, policy: drf, tenant_weights: {alice: .nan}}]", "tenant_weights", "finite"),
        ("queues: [{name: default, aging_per_s: .inf}]", "aging_per_s", "finite number"),
        ("retry_backoff_s: .nan", "retry_backoff_s", "finite number"),
        ("retry_backoff_s: 10\nretry_backoff_max_s: 1", "retry_backoff_max_s", "below retry_backoff_s"),
    ],
)
def test_settings_that_could_never_work_are_refused_naming_the_field(
    tmp_path: Path, text: str, field: str, reason: str
) -> None:
    path = tmp_path / "gosched.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ValueError) as err:
        load_settings(path)
    assert field in str(err.value) and reason in str(err.value)


def test_a_gosched_env_name_that_is_no_setting_is_named_with_the_nearest(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GOSCHED_SHARD", "8")  # a typo: ignored, so say so
    monkeypatch.setenv("GOSCHED_MASTER", "localhost:9090")  # the client's, not a setting: fine
    monkeypatch.setenv("GOSCHED_PROFILE__PREEMPTION", "false")  # a nested setting: fine
    with caplog.at_level("WARNING", logger="gosched.common.config"):
        settings = load_settings(None)
    assert settings.shards != 8 and settings.profile.preemption is False
    assert caplog.messages == ["GOSCHED_SHARD is not a setting and is ignored (did you mean GOSCHED_SHARDS?)"]


@pytest.mark.parametrize(
    ("text", "hints"),
    [
        ("shard: 4\n", ["shard: did you mean 'shards'?"]),
        ("queues:\n  - name: default\n    polcy: fifo\n", ["queues[0].polcy: did you mean 'policy'?"]),
        (
            "profile:\n  scores:\n    - {name: most_allocated, wieght: 2}\n",
            ["profile.scores[0].wieght: did you mean 'weight'?"],
        ),
        (
            "admission:\n  max_pending_job: 5\n",
            ["admission.max_pending_job: did you mean 'max_pending_jobs'?"],
        ),
        ("zzz_unrelated: 1\n", []),  # nothing near: no guess
    ],
)
def test_an_unknown_config_key_gets_the_known_key_it_most_likely_stands_for(
    tmp_path: Path, text: str, hints: list[str]
) -> None:
    from typer.testing import CliRunner

    from gosched.cli.main import app

    path = tmp_path / "gosched.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["config", "show", "-c", str(path)])
    assert result.exit_code == 2, result.output
    assert f"(settings from {path}, GOSCHED_* variables and flags)" in result.stderr
    for hint in hints:
        assert hint in result.stderr
    if not hints:
        assert "did you mean" not in result.stderr
