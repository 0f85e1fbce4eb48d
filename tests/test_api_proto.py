"""The generated gosched.v1 modules are current, and the proto <-> model conversions round-trip."""

import subprocess
import sys
from pathlib import Path

import pytest

from gosched.api import convert
from gosched.common.errors import SpecError
from gosched.common.states import JobState, TaskState
from gosched.proto import generate
from gosched.proto.v1 import types_pb2 as pb
from gosched.runtime.simulation import mixed_jobs, sim_nodes
from tests.builders import make_job

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert written, "nothing generated"
    committed = sorted(
        p.name for p in generate.SOURCES_DIR.iterdir() if p.name.endswith(generate.GENERATED_SUFFIXES)
    )
    assert sorted(p.name for p in written) == committed
    stale = [p.name for p in written if p.read_text() != (generate.SOURCES_DIR / p.name).read_text()]
    assert not stale, f"regenerate with `python -m gosched.proto.generate`: {stale} differ"


def test_generated_imports_live_under_the_namespace() -> None:
    text = (generate.SOURCES_DIR / "jobs_pb2_grpc.py").read_text()
    assert "from gosched.proto.v1 import jobs_pb2" in text


def test_import_gosched_stays_light() -> None:
    code = "import sys, gosched; assert 'grpc' not in sys.modules; from gosched import Client; print(Client)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "gosched.api.client.Client" in out.stdout


def test_job_round_trip_through_proto() -> None:
    jobs = [*mixed_jobs(40, seed=3)]
    jobs.append(
        make_job("rich")
        .cpu("1500m")
        .mem("3Gi")
        .gpu_share(250)
        .gpu_memory(40960)
        .extended("example.com/fpga", 2)
        .gpu_model("A100", "H100")
        .build()
    )
    for job in jobs:
        msg = convert.job_to_proto_spec(job)
        again = pb.JobSpec.FromString(msg.SerializeToString())
        assert convert.job_from_proto(again) == job


def test_full_spec_round_trip() -> None:
    spec = {
        "id": "full",
        "tenant": "team-a",
        "queue": "default",
        "priority": 7,
        "min_member": 2,
        "preemptible": False,
        "kind": "service",
        "deadline": 4_000_000_000.0,
        "labels": {"app": "db"},
        "disruption_budget": 0,
        "submit_time": 12.5,
        "submission_id": "s-1",
        "groups": [
            {
                "role": "worker",
                "replicas": 2,
                "command": ["python", "train.py"],
                "env": {"A": "1"},
                "resources": {"cpu": "2", "memory": "16Gi", "gpus": 1, "gpu_memory": "40Gi"},
                "gpu_models": ["A100"],
                "node_selector": {"zone": "z1"},
                "affinity": {
                    "required": [[{"key": "gen", "operator": "In", "values": ["ampere"]}]],
                    "preferred": [{"weight": 50, "match": [{"key": "n", "operator": "Gt", "values": [3]}]}],
                },
                "anti_affinity": [{"topology_key": "zone", "match_labels": {"app": "db"}}],
                "tolerations": [
                    {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
                    {"operator": "Exists"},
                ],
            }
        ],
    }
    from gosched.common.spec import job_from_spec

    job = job_from_spec(spec)
    assert convert.job_from_proto(convert.job_to_proto_spec(job)) == job
    assert convert.job_from_proto(convert.job_spec_from_dict(spec)) == job


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda m: m.groups[0].resources.__setattr__("memory", "lots"), "groups[0].resources.memory"),
        (lambda m: m.groups[0].ClearField("command"), "groups[0].command"),
        (lambda m: m.__setattr__("min_member", 9), "min_member"),
        (lambda m: m.groups[0].tolerations.add(operator="Maybe"), "groups[0].tolerations[0].operator"),
        (lambda m: m.labels.__setitem__("bad key!", "x"), "labels['bad key!']"),
        (lambda m: m.ClearField("groups"), "groups"),
    ],
)
def test_spec_errors_name_the_field(mutate: object, field: str) -> None:
    msg = convert.job_to_proto_spec(make_job("j").cpu(1).replicas(2).build())
    mutate(msg)  # type: ignore[operator]
    with pytest.raises(SpecError) as err:
        convert.job_from_proto(msg)
    assert err.value.field == field


def test_node_round_trip_and_states() -> None:
    for node in sim_nodes(8):
        assert convert.node_from_proto(convert.node_to_proto(node)) == node
    for state in JobState:
        assert convert.job_state_from_proto(convert.job_state_to_proto(state)) is state
    for task_state in TaskState:
        assert convert.task_state_from_proto(convert.task_state_to_proto(task_state)) is task_state
    assert convert.job_state_from_proto(pb.JOB_STATE_UNSPECIFIED) is None


@pytest.mark.parametrize(
    "from_proto",
    [convert.job_state_from_proto, convert.task_state_from_proto, convert.node_state_from_proto],
)
def test_an_unknown_state_number_is_a_spec_error_naming_the_field(from_proto: object) -> None:
    with pytest.raises(SpecError, match=r"^state: unknown .*state 99 ") as err:
        from_proto(99)  # type: ignore[operator]
    assert err.value.field == "state"
