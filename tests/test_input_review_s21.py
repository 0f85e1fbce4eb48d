"""Input review (s21): what a job spec and the CLI refuse, and how they say so.

- a built-in resource (cpu, memory, gpu(s), nvidia.com/gpu) under `extended` is refused, naming the
  field and the one to use, instead of a task pending forever ("node has no nvidia.com/gpu");
- a duration as a string of digits ("3600", what `--time 3600` sends) is seconds; zero and negative
  ones are refused as such, not as "not a duration";
- a new job's id starts with a letter or digit ("-x", ".", ".." are refused);
- refusing to delete a node that holds tasks names the --force flag.
"""

import time
from dataclasses import replace
from pathlib import Path

import pytest

from gosched.api.convert import job_from_proto, job_to_proto_spec
from gosched.cli.agent_cmd import BUILTIN_RESOURCES as AGENT_BUILTIN_RESOURCES
from gosched.cli.agent_cmd import parse_extended
from gosched.common.errors import SpecError
from gosched.common.job import Job
from gosched.common.spec import BUILTIN_RESOURCES, generated_job_id, job_from_spec, job_to_spec
from tests.loopback import cli, sim_master


def _refused(spec: dict[str, object], now: float | None = None) -> SpecError:
    with pytest.raises(SpecError) as refused:
        job_from_spec(spec, now=now)
    return refused.value


# == 1. built-in resources under `extended` ========================================================
@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("nvidia.com/gpu", "gpus"),
        ("gpu", "gpus"),
        ("gpus", "gpus"),
        ("GPU", "gpus"),
        ("cpu", "cpu"),
        ("cpus", "cpu"),
        ("CPU", "cpu"),
        ("memory", "memory"),
    ],
)
def test_a_builtin_resource_under_extended_is_refused_naming_the_field_to_use(name: str, field: str) -> None:
    flat = _refused({"command": "true", "cpu": 1, "extended": {name: 1}})
    assert flat.field == f"extended[{name!r}]"
    assert f"{name} is a built-in resource, not an extended one: ask for it with {field} (" in flat.reason
    grouped = _refused({"groups": [{"command": "true", "cpu": 1, "extended": {name: 1}}]})
    assert grouped.field == f"groups[0].extended[{name!r}]"
    nested = _refused({"groups": [{"command": "true", "resources": {"cpu": 1, "extended": {name: 1}}}]})
    assert nested.field == f"groups[0].resources.extended[{name!r}]"


def test_the_gpu_refusal_says_how_to_ask_for_gpus() -> None:
    refused = _refused({"command": "true", "cpu": 1, "extended": {"nvidia.com/gpu": 1}})
    assert "ask for it with gpus (gpus: 1)" in refused.reason


def test_a_real_extended_resource_is_still_taken() -> None:
    job = job_from_spec({"command": "true", "cpu": 1, "extended": {"example.com/fpga": 2, "gpu-x": 1}})
    assert job.groups[0].resources.extended == (("example.com/fpga", 2), ("gpu-x", 1))
    assert job_from_spec(job_to_spec(job)) == job


def _with_extended(name: str, job_id: str = "old") -> Job:
    """A job as one taken before the rule might be stored: built without the spec's checks."""
    job = job_from_spec({"id": "ok", "command": "true", "cpu": 1})
    group = job.groups[0]
    resources = replace(group.resources, extended=((name, 1),))
    return replace(job, id=job_id, groups=(replace(group, resources=resources),))


def test_a_submitted_jobspec_message_is_refused_but_a_stored_job_still_reads_back() -> None:
    message = job_to_proto_spec(_with_extended("nvidia.com/gpu"))
    with pytest.raises(SpecError) as refused:
        job_from_proto(message, now=time.time())  # as the server takes a submission
    assert refused.value.field == "groups[0].resources.extended['nvidia.com/gpu']"
    assert "ask for it with gpus" in refused.value.reason
    # a client reads jobs back through the same function, without `now`: an old one stays readable
    assert job_from_proto(message).groups[0].resources.extended == (("nvidia.com/gpu", 1),)


def test_the_agent_and_the_spec_refuse_the_same_names() -> None:
    assert AGENT_BUILTIN_RESOURCES.keys() == BUILTIN_RESOURCES.keys()
    for name in BUILTIN_RESOURCES:
        with pytest.raises(ValueError, match="is a built-in resource"):
            parse_extended(f"{name}=1")


def test_submit_from_a_file_names_the_extended_field(tmp_path: Path) -> None:
    server = sim_master(tmp_path)
    try:
        spec = tmp_path / "job.yaml"
        spec.write_text('command: "true"\ncpu: 1\nextended: {nvidia.com/gpu: 1}\n')
        refused = cli(server, "submit", "-f", str(spec))
        assert refused.exit_code != 0
        assert "extended['nvidia.com/gpu']" in refused.output and "ask for it with gpus" in refused.output
    finally:
        server.stop()


# == 2. durations as text ==========================================================================
def _limit(value: object) -> dict[str, object]:
    return {"id": "t", "command": "true", "cpu": 1, "time_limit": value}


@pytest.mark.parametrize(
    ("given", "write"),
    [("3600", "write 3600s for seconds, or 60m"), (" 90 ", "write 90s for seconds, or 1.5m")],
)
def test_a_bare_number_as_text_is_refused_saying_how_to_write_either_reading(given: str, write: str) -> None:
    """Slurm's --time 90 is minutes, a spec's 90 is seconds: the text is not guessed, and the
    message says how to write each (it used to say 'give a number of seconds' to a number)."""
    refused = _refused(_limit(given))
    assert "is a bare number, which Slurm reads as minutes" in refused.reason and write in refused.reason
    assert job_from_spec(_limit(3600)).time_limit == 3600.0  # a number in a spec is seconds


def test_a_deadline_from_now_takes_bare_seconds_too() -> None:
    job = job_from_spec({"id": "d", "command": "true", "cpu": 1, "deadline": "now+3600"}, now=1000.0)
    assert job.deadline == 4600.0


@pytest.mark.parametrize("given", ["0", "0s", "-5s", "-5", "-01:00:00", "- 5m"])
def test_a_zero_or_negative_duration_says_it_must_be_more_than_0(given: str) -> None:
    refused = _refused(_limit(given))
    assert refused.field == "time_limit"
    assert f"must be more than 0 seconds, got {given!r}" in refused.reason
    assert "not a duration" not in refused.reason


def test_what_is_not_a_duration_says_what_to_write() -> None:
    refused = _refused(_limit("soon"))
    assert "'soon' is not a duration: give one with a unit (3600s, 45m" in refused.reason
    assert "not a duration" in _refused(_limit("-soon")).reason


def test_submit_time_3600s_runs_and_time_0_says_why_not(tmp_path: Path) -> None:
    server = sim_master(tmp_path)
    try:
        done = cli(server, "submit", "--name", "hourly", "--cpus", "1", "--time", "3600s", "--", "true")
        assert done.exit_code == 0, done.output
        assert "1h per task" in cli(server, "describe", "hourly").output
        for given in ("0", "-5s"):
            refused = cli(server, "submit", "--cpus", "1", "--time", given, "--", "true")
            assert refused.exit_code != 0
            assert "--time-limit" in refused.output and "must be more than 0 seconds" in refused.output
    finally:
        server.stop()


# == 3. job ids ====================================================================================
@pytest.mark.parametrize("job_id", ["-x", ".", "..", "_x", "-", ".hidden", "--force"])
def test_an_id_must_start_with_a_letter_or_digit(job_id: str) -> None:
    refused = _refused({"id": job_id, "command": "true", "cpu": 1})
    assert refused.field == "id"
    assert "start with a letter or digit" in refused.reason
    refused = _refused({"id": job_id, "command": "true", "cpu": 1}, now=time.time())
    assert "start with a letter or digit" in refused.reason


@pytest.mark.parametrize("job_id", ["a", "0", "train-42", "A.b_c-d", "x-", "x..", "9_", "job.v1"])
def test_ids_starting_with_a_letter_or_digit_stay_valid(job_id: str) -> None:
    job = job_from_spec({"id": job_id, "command": "true", "cpu": 1}, now=time.time())
    assert job.id == job_id and job_from_spec(job_to_spec(job)) == job


def test_generated_ids_pass_the_rule() -> None:
    for job_id in (generated_job_id(), generated_job_id("cli-7f3a")):
        assert job_from_spec({"id": job_id, "command": "true", "cpu": 1}).id == job_id
    assert job_from_spec({"command": "true", "cpu": 1}, now=time.time()).id.startswith("job-")


def test_a_stored_job_with_an_old_style_id_still_reads_back() -> None:
    job = replace(job_from_spec({"id": "ok", "command": "true", "cpu": 1}), id="-old")
    message = job_to_proto_spec(job)
    assert job_from_proto(message).id == "-old"  # a client reading it back
    with pytest.raises(SpecError, match="start with a letter or digit"):
        job_from_proto(message, now=time.time())  # submitted anew


# == 4. deleting a node that holds tasks ===========================================================
def test_the_refusal_to_delete_a_busy_node_names_the_force_flag(tmp_path: Path) -> None:
    server = sim_master(tmp_path, nodes=1)
    try:
        done = cli(server, "submit", "--name", "held", "--cpus", "1", "--", "sleep", "600")
        assert done.exit_code == 0, done.output
        deadline = time.monotonic() + 15
        while "sim-00000" not in cli(server, "get", "held", "-o", "json").output:
            assert time.monotonic() < deadline, "the task was never bound"
            time.sleep(0.05)
        refused = cli(server, "delete-node", "sim-00000")
        assert refused.exit_code != 0
        assert "gosched delete-node sim-00000 --force" in refused.output
        assert "with force" not in refused.output
    finally:
        server.stop()
