"""User-facing fixes from a review of the CLI, config and API surface, each against the real parts:
a profile must keep the filters the binder checks again; a deadline past year 9999 is refused (and
one stored before shown, not a traceback); `--timeout` is a finite number and the client's long
waits do not overflow gRPC's deadline; a submission id's retry must name the first job's id or
none; the README's one-word script example runs as written; tenant_weights keys are tenant names."""

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from typer.testing import CliRunner, Result

from gosched import Client
from gosched.api import convert, errors
from gosched.api.client import MAX_TIMEOUT_S, _grpc_timeout, _spec_message
from gosched.api.server import ServerHandle
from gosched.cli.main import app
from gosched.cli.output import describe_view
from gosched.common.config import MINIMAL_PROFILE, ProfileConfig, Settings, load_settings
from gosched.common.errors import SpecError
from gosched.common.job import Job
from gosched.common.node import Node, NodeState
from gosched.common.spec import MAX_DEADLINE, generated_job_id, job_from_spec
from gosched.common.states import JobState
from gosched.dispatcher.dispatcher import same_request
from gosched.proto.v1 import jobs_pb2, jobs_pb2_grpc
from gosched.runtime.pipeline import Pipeline
from gosched.scheduler_shard.framework.profile import REQUIRED_FILTERS, check_profile
from tests.builders import make_job, make_node
from tests.loopback import cli, sim_master

ROOT = Path(__file__).resolve().parent.parent
GOSCHED = Path(sys.executable).parent / "gosched"
NOW = 1_700_000_000.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """A master on loopback whose simulated tasks run for a moment and succeed."""
    handle = sim_master(
        tmp_path_factory.mktemp("surface"), task_seconds=0.3, log_dir=tmp_path_factory.mktemp("logs")
    )
    yield handle
    handle.stop()


def config_show(tmp_path: Path, text: str) -> Result:
    path = tmp_path / "gosched.yaml"
    path.write_text(text)
    return CliRunner().invoke(app, ["config", "show", "-c", str(path)])


# == 1. a profile keeps the filters the binder checks again =========================================
@pytest.mark.parametrize(
    ("filters", "missing"),
    [
        ("[]", "resources_fit, node_ready, anti_affinity"),
        ("[node_ready, anti_affinity]", "resources_fit"),
        ("[resources_fit, anti_affinity, gpu_model]", "node_ready"),
        ("[node_ready, resources_fit]", "anti_affinity"),
    ],
)
def test_a_profile_without_a_filter_the_binder_checks_again_is_refused(
    tmp_path: Path, filters: str, missing: str
) -> None:
    result = config_show(tmp_path, f"profile:\n  filters: {filters}\n")
    assert result.exit_code == 2, result.output
    assert f"profile.filters: must include {missing} (the binder checks" in result.stderr
    assert "retried at once, without end" in result.stderr


def test_the_master_refuses_such_a_profile_before_it_starts(tmp_path: Path) -> None:
    path = tmp_path / "gosched.yaml"
    path.write_text(f"profile:\n  filters: []\nstore_path: {tmp_path / 'gs.db'}\n")
    command = [
        str(GOSCHED),
        "master",
        "--in-process",
        "-c",
        str(path),
        "--grpc-port",
        "0",
        "--http-port",
        "0",
    ]
    # A master that took the profile would run (until the timeout kills it and fails the test).
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "profile.filters: must include resources_fit" in result.stderr
    assert not (tmp_path / "gs.db").exists()


def test_the_shipped_profiles_keep_them(tmp_path: Path) -> None:
    for profile in (ProfileConfig(), MINIMAL_PROFILE):
        check_profile(profile)
    assert (
        config_show(tmp_path, "profile:\n  filters: [node_ready, resources_fit, anti_affinity]\n").exit_code
        == 0
    )
    example = CliRunner().invoke(app, ["config", "show", "-c", str(ROOT / "deploy" / "gosched.example.yaml")])
    assert example.exit_code == 0, example.output


def _scenario(name: str) -> tuple[list[Node], Job]:
    """Nodes and a job on which `name`'s filter decides: without it the shard proposes what the
    binder refuses."""
    if name == "resources_fit":
        return [make_node("n0").build()], make_job("j").cpu("64").build()
    if name == "node_ready":
        return [make_node("n0").state(NodeState.CORDONED).build()], make_job("j").cpu("1").build()
    assert name == "anti_affinity"
    return [make_node("n0").build()], make_job("j").cpu("1").replicas(2).anti_affinity("node").build()


@pytest.mark.parametrize("name", sorted(REQUIRED_FILTERS))
def test_each_required_filter_is_one_the_binder_checks_again(tmp_path: Path, name: str) -> None:
    """Each required filter is one a stage of the binder repeats: without it the binder refuses
    every attempt and the job is retried at once, round after round; with it the job waits,
    refused by no one. (A profile of these three alone is accepted: test_the_shipped_profiles...)"""
    refusals = {}
    for kept in (True, False):
        filters = [f for f in ProfileConfig().filters if kept or f != name]
        settings = Settings(
            store_path=str(tmp_path / f"{kept}.db"), shards=1, profile=ProfileConfig(filters=filters)
        )
        nodes, job = _scenario(name)
        p = Pipeline(settings, nodes=nodes)
        p.submit(job)
        for _ in range(30):
            p.step()
        refusals[kept] = p.stats.rejected_units
        p.close()
    assert refusals[True] == 0
    assert refusals[False] >= 20  # a refusal every round: the loop the check prevents


def test_the_minimal_profile_waits_instead_of_looping_on_anti_affinity(tmp_path: Path) -> None:
    """`minimal` (gosched bench --profile minimal) lacked anti_affinity: two tasks that repel each
    other on one node were proposed together and refused every round, without end."""
    p = Pipeline(
        Settings(store_path=str(tmp_path / "gs.db"), shards=1, profile=MINIMAL_PROFILE),
        nodes=[make_node("n0").build()],
    )
    p.submit(make_job("spread").cpu("1").replicas(2).anti_affinity("node").build())
    for _ in range(30):
        p.step()
    assert p.stats.rejected_units == 0
    assert p.stats.bound_tasks == 1  # the other waits for a second node
    p.close()


# == 2. a deadline past year 9999 ===================================================================
@pytest.mark.parametrize("deadline", [1e12, 1e20, MAX_DEADLINE + 1, "9999-12-31T23:59:59-05:00"])
def test_a_deadline_past_year_9999_is_refused_at_submission(deadline: object) -> None:
    with pytest.raises(SpecError) as err:
        job_from_spec({"command": ["true"], "cpu": "1", "deadline": deadline}, now=NOW)
    assert err.value.field == "deadline"
    assert "past 9999-12-31T23:59:59Z" in err.value.reason


def test_the_last_second_of_year_9999_is_a_deadline() -> None:
    for deadline in (MAX_DEADLINE, "9999-12-31T23:59:59Z"):
        job = job_from_spec({"command": ["true"], "cpu": "1", "deadline": deadline}, now=NOW)
        assert job.deadline == MAX_DEADLINE


def test_submit_refuses_a_far_deadline_naming_the_field(server: ServerHandle) -> None:
    result = cli(server, "submit", "-f", "-", input='{"command": ["true"], "cpu": "10m", "deadline": 1e20}')
    assert result.exit_code == 2, result.output
    assert "deadline: 1e+20 is past 9999-12-31T23:59:59Z" in result.stderr


def test_describe_shows_a_deadline_stored_before_the_check(server: ServerHandle, client: Client) -> None:
    """A job taken before deadlines were bounded (here: handed to the service, past the API's
    check) is still read back and described, its deadline as the number it is."""
    far = make_job("far-deadline").cpu("1").gpus(16).deadline(1e20).build()  # stays pending
    server.service.submit(far)
    try:
        result = cli(server, "describe", "far-deadline")
        assert result.exit_code == 0, result.output
        assert re.search(r"Deadline:\s+1e\+20 \(unix seconds\)", result.stdout), result.stdout
        assert cli(server, "get", "far-deadline").exit_code == 0
        assert "1e+20" in describe_view(client.get("far-deadline"), "")
    finally:
        client.cancel("far-deadline")


# == 3. --timeout and the client's long waits ======================================================
@pytest.mark.parametrize("value", ["inf", "1e400"])
def test_submit_wait_refuses_an_infinite_timeout_before_submitting(
    server: ServerHandle, client: Client, value: str
) -> None:
    before = len(client.list())
    result = cli(server, "submit", "--wait", "--timeout", value, "--cpus", "1", "--", "true")
    assert result.exit_code == 2, result.output
    assert "--timeout: must be a finite number of seconds >= 0, got inf" in result.stderr
    assert len(client.list()) == before


def test_submit_wait_with_a_huge_timeout_waits(server: ServerHandle) -> None:
    result = cli(
        server, "submit", "--wait", "--timeout", "1e10", "--cpus", "1", "--name", "long-wait", "--", "true"
    )
    assert result.exit_code == 0, result.output
    assert "job long-wait succeeded" in result.stderr


@pytest.mark.parametrize("timeout", [float("inf"), 1e10, 1e20])
def test_the_client_takes_infinite_and_huge_timeouts(client: Client, timeout: float) -> None:
    job_id = client.submit({"command": ["true"], "cpu": "1"})
    info = client.wait(job_id, timeout=timeout)  # gave up at once: gRPC's deadline overflowed
    assert info.state is JobState.SUCCEEDED
    assert client.status(timeout=timeout)["ready"]
    assert list(client.logs(job_id, timeout=timeout)) is not None


def test_the_grpc_timeout_is_none_or_capped() -> None:
    assert _grpc_timeout(None) is None
    assert _grpc_timeout(float("inf")) is None
    assert _grpc_timeout(1e10) == MAX_TIMEOUT_S
    assert _grpc_timeout(2.5) == 2.5
    with pytest.raises(ValueError, match="timeout"):
        _grpc_timeout(float("nan"))


# == 4. a submission id's retry names the first job's id or none ===================================
def test_the_client_leaves_an_unnamed_id_to_the_server() -> None:
    assert _spec_message({"command": ["true"], "cpu": "1"}).id == ""
    assert _spec_message({"id": "mine", "command": ["true"], "cpu": "1"}).id == "mine"


def test_the_generated_id_of_a_submission_is_the_same_for_every_retry() -> None:
    assert generated_job_id("run-17") == generated_job_id("run-17") != generated_job_id("run-18")
    assert re.fullmatch(r"job-[0-9a-f]{12}", generated_job_id("run-17"))
    assert generated_job_id() != generated_job_id()  # no submission id: random
    spec = {"command": ["true"], "cpu": "1", "submission_id": "run-17"}
    assert job_from_spec(spec).id == generated_job_id("run-17")


def test_same_request_ignores_only_a_generated_id() -> None:
    first = job_from_spec({"id": "mine", "command": ["true"], "cpu": "1", "submission_id": "k"})
    unnamed = job_from_spec({"command": ["true"], "cpu": "1", "submission_id": "k"})
    renamed = job_from_spec({"id": "other", "command": ["true"], "cpu": "1", "submission_id": "k"})
    assert same_request(first, first) and same_request(unnamed, first)
    assert not same_request(renamed, first)
    # A deadline is part of the request: a retry repeats it (there is no relative deadline).
    later = job_from_spec({"command": ["true"], "cpu": "1", "submission_id": "k", "deadline": 4e9})
    earlier = job_from_spec({"command": ["true"], "cpu": "1", "submission_id": "k", "deadline": 3e9})
    assert same_request(later, later) and not same_request(earlier, later)


def test_a_retry_naming_another_job_is_refused(server: ServerHandle, client: Client) -> None:
    big = ("--cpus", "1", "--gpus", "16", "--", "sleep", "1")  # fits nowhere: stays pending
    first = cli(server, "submit", "--submission-id", "sid-a", *big)
    assert first.exit_code == 0, first.output
    job_id = first.stdout.strip()
    again = cli(server, "submit", "--submission-id", "sid-a", *big)
    assert (again.exit_code, again.stdout.strip()) == (0, job_id)  # named none: a retry
    other = cli(server, "submit", "--submission-id", "sid-a", "--name", "sid-a-other", *big)
    assert other.exit_code == 2, other.output
    assert "submission_id (--submission-id): 'sid-a' was first used for job " + job_id in other.stderr
    assert "this request names job sid-a-other" in other.stderr
    with pytest.raises(errors.NotFound):
        client.get("sid-a-other")
    # A job named explicitly: a retry names it again, or names none.
    named = cli(server, "submit", "--submission-id", "sid-b", "--name", "sid-b-job", *big)
    assert named.stdout.strip() == "sid-b-job", named.output
    for retry in (("--name", "sid-b-job"), ()):
        result = cli(server, "submit", "--submission-id", "sid-b", *retry, *big)
        assert (result.exit_code, result.stdout.strip()) == (0, "sid-b-job"), result.output
    refused = cli(server, "submit", "--submission-id", "sid-b", "--name", "sid-b-two", *big)
    assert refused.exit_code == 2 and "names job sid-b-two" in refused.stderr
    for jid in (job_id, "sid-b-job"):
        client.cancel(jid)


def test_a_client_that_sends_an_id_still_works(server: ServerHandle, client: Client) -> None:
    """Clients before this fix (and other languages) send the id in the spec: it is taken, and a
    retry with it is answered with the job."""
    job = job_from_spec({"id": "raw-named", "command": ["true"], "cpu": "1", "gpus": 16})
    spec = convert.job_to_proto_spec(job, submit_time=False)
    with grpc.insecure_channel(server.target) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        replies = [
            stub.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec, submission_id="raw-1"), timeout=5)
            for _ in range(2)
        ]
        batch = stub.SubmitJobs(
            jobs_pb2.SubmitJobsRequest(
                jobs=[
                    jobs_pb2.SubmitJobRequest(
                        spec=convert.job_to_proto_spec(job, submit_time=False, job_id=False),
                        submission_id="raw-2",
                    )
                    for _ in range(2)
                ]
            ),
            timeout=5,
        )
    assert [(r.job_id, r.created) for r in replies] == [("raw-named", True), ("raw-named", False)]
    assert list(batch.job_ids) == [generated_job_id("raw-2")] * 2 and list(batch.created) == [True, False]
    for jid in ("raw-named", generated_job_id("raw-2")):
        client.cancel(jid)


# == 5. the README's examples ======================================================================
def test_the_readme_one_word_script_example_runs_as_written(server: ServerHandle) -> None:
    readme = (ROOT / "README.md").read_text()
    examples = re.findall(r"`gosched submit ([^`]*'make && \./run'[^`]*)`", readme)
    assert examples, "the README's example of a one-word script"
    for example in examples:
        result = cli(server, "submit", "--wait", *shlex.split(example))
        assert result.exit_code == 0, (example, result.output)


# == 6. tenant_weights keys ==========================================================================
@pytest.mark.parametrize("key", ["Team-A", "", "a b", "-a", "x" * 64])
def test_a_tenant_weight_for_a_name_no_tenant_can_have_is_refused(tmp_path: Path, key: str) -> None:
    text = f'queues:\n  - {{name: default, policy: drf, tenant_weights: {{"{key}": 2}}}}\n'
    path = tmp_path / "gosched.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"tenant_weights[{key!r}]: not a valid tenant name")):
        load_settings(path)
    result = config_show(tmp_path, text)
    assert result.exit_code == 2, result.output
    assert "queues[0].tenant_weights[" in result.stderr and "not a valid tenant name" in result.stderr


def test_tenant_weights_of_tenant_names_load(tmp_path: Path) -> None:
    path = tmp_path / "gosched.yaml"
    path.write_text("queues:\n  - {name: default, policy: fair, tenant_weights: {team-a: 2, b.c_d: 0.5}}\n")
    assert load_settings(path).queues[0].tenant_weights == {"team-a": 2.0, "b.c_d": 0.5}
    # a tenant a job can name is one the weights can name
    assert job_from_spec({"command": ["true"], "cpu": "1", "tenant": "b.c_d"}).tenant == "b.c_d"
