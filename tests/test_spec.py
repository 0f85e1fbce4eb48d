"""Tests of common/spec.py: bad specs name the right field, good specs build the expected Job / Node,
and job -> spec -> job (node -> spec -> node) is the identity."""

import copy
import json
import re
import time
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest
import yaml
from hypothesis import given, settings

from gosched.common.errors import SpecError
from gosched.common.job import (
    AntiAffinity,
    Job,
    JobKind,
    NodeSelectorTerm,
    PreferredTerm,
    Requirement,
    SelectorOp,
    TaskGroup,
    Toleration,
)
from gosched.common.node import Gpu, Node, NodeState, Taint, TaintEffect
from gosched.common.resources import ResourceRequest
from gosched.common.spec import job_from_spec, job_to_spec, node_from_spec, node_to_spec
from tests.strategies import jobs, nodes

NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z
QUEUES = ("default", "batch")
GI = 2**30


# -- spec builders: a minimal valid spec, with one thing changed per case ------------------------
def spec(**top: Any) -> dict[str, Any]:
    """A valid grouped spec with one group; `top` overrides or adds top-level keys."""
    return {"id": "j1", "groups": [{"role": "main", "command": "true", "resources": {"cpu": "1"}}], **top}


def group(**fields: Any) -> dict[str, Any]:
    """A valid spec whose one group has `fields` overridden or added."""
    base = {"role": "main", "command": "true", "resources": {"cpu": "1"}, **fields}
    return {"id": "j1", "groups": [base]}


def res(**resources: Any) -> dict[str, Any]:
    """A valid spec whose one group requests exactly `resources`."""
    return group(resources=resources)


def affinity(**aff: Any) -> dict[str, Any]:
    return group(affinity=aff)


def required(*requirements: Any) -> dict[str, Any]:
    """A spec with one required-affinity term holding `requirements`."""
    return affinity(required=[list(requirements)])


def main_job(**job_fields: Any) -> Job:
    """The Job that spec() builds (at NOW), with `job_fields` replaced."""
    g = TaskGroup(role="main", replicas=1, resources=ResourceRequest(cpu_milli=1000), command=("true",))
    return replace(Job(id="j1", groups=(g,), submit_time=NOW), **job_fields)


def main_group(**group_fields: Any) -> Job:
    """main_job() whose one group has `group_fields` replaced."""
    job = main_job()
    return replace(job, groups=(replace(job.groups[0], **group_fields),))


# -- bad specs -------------------------------------------------------------------------------------
BAD_JOB_SPECS: list[tuple[str, Any, str, str]] = [
    # (case id, spec, expected field, substring of the reason)
    ("not-a-mapping", ["x"], "spec", "expected a mapping, got a list"),
    ("unknown-field", spec(name="x"), "name", "unknown field"),
    ("image-with-blank", group(image="python 3"), "groups[0].image", "is not an image reference"),
    ("image-as-option", group(image="--privileged"), "groups[0].image", "is not an image reference"),
    ("image-not-text", group(image=3), "groups[0].image", "expected"),
    ("typo-suggests", spec(prority=1), "prority", "did you mean 'priority'?"),
    ("id-empty", spec(id=""), "id", "must not be empty"),
    ("id-slash", spec(id="a/b"), "id", "'a/b' is not valid"),
    ("id-space", spec(id="my job"), "id", "is not valid"),
    ("id-too-long", spec(id="a" * 129), "id", "longer than 128 characters"),
    ("id-not-string", spec(id=5), "id", "expected a string, got an integer (5)"),
    ("tenant-uppercase", spec(tenant="Team-A"), "tenant", "'Team-A' is not valid"),
    ("tenant-trailing-dash", spec(tenant="team-"), "tenant", "is not valid"),
    ("tenant-too-long", spec(tenant="t" * 64), "tenant", "longer than 63"),
    ("queue-empty", spec(queue=""), "queue", "must not be empty"),
    ("queue-unknown", spec(queue="gpu"), "queue", "unknown queue 'gpu' (known: batch, default)"),
    ("priority-string", spec(priority="high"), "priority", "expected an integer, got a string ('high')"),
    ("priority-bool", spec(priority=True), "priority", "expected an integer, got a boolean"),
    ("priority-float", spec(priority=1.0), "priority", "expected an integer, got a number"),
    ("priority-too-high", spec(priority=1_000_001), "priority", "must be <= 1000000"),
    ("priority-too-low", spec(priority=-1_000_001), "priority", "must be >= -1000000"),
    ("min-member-zero", spec(min_member=0), "min_member", "must be >= 1"),
    ("min-member-null", spec(min_member=None), "min_member", "expected an integer, got null"),
    ("preemptible-string", spec(preemptible="yes"), "preemptible", "expected true or false"),
    ("kind-unknown", spec(kind="daemon"), "kind", "must be one of batch, service"),
    ("deadline-past", spec(deadline=NOW - 1), "deadline", "is not in the future (now is 2023-11-14T22:13:20"),
    ("deadline-now", spec(deadline=NOW), "deadline", "not in the future"),
    ("deadline-iso-past", spec(deadline="2020-01-01T00:00:00Z"), "deadline", "not in the future"),
    ("deadline-garbage", spec(deadline="tomorrow"), "deadline", "is not an ISO-8601 time"),
    (
        "deadline-bool",
        spec(deadline=True),
        "deadline",
        "expected an ISO-8601 time, unix seconds or now+DURATION, got a boolean",
    ),
    ("deadline-numeric-string", spec(deadline="1900000000"), "deadline", "give unix seconds as a number"),
    (
        "deadline-overflow",
        spec(deadline=10**400),
        "deadline",
        "is too large",
    ),
    ("deadline-nan", spec(deadline=float("nan")), "deadline", "must be a finite number"),
    ("deadline-negative", spec(deadline=-5), "deadline", "must be after 1970"),
    ("labels-not-mapping", spec(labels=["a"]), "labels", "expected a mapping"),
    ("labels-bad-key", spec(labels={"bad key": "x"}), "labels['bad key']", "label key 'bad key'"),
    (
        "labels-bad-prefix",
        spec(labels={"Example.com/x": "y"}),
        "labels['Example.com/x']",
        "not a DNS subdomain",
    ),
    ("labels-empty-name", spec(labels={"example.com/": "y"}), "labels['example.com/']", "the name must be"),
    ("labels-key-too-long", spec(labels={"k" * 64: "y"}), f"labels['{'k' * 64}']", "1-63 characters"),
    ("labels-bad-value", spec(labels={"a": "-x"}), "labels['a']", "label value '-x'"),
    ("labels-value-too-long", spec(labels={"a": "v" * 64}), "labels['a']", "label value"),
    ("labels-value-int", spec(labels={"a": 1}), "labels['a']", "expected a string"),
    ("labels-int-key", spec(labels={1: "a"}), "labels", "keys must be strings"),
    ("budget-negative", spec(disruption_budget=-1), "disruption_budget", "must be >= 0"),
    ("submission-id-long", spec(submission_id="s" * 129), "submission_id", "longer than 128"),
    ("submit-time-negative", spec(submit_time=-5), "submit_time", "must be >= 0"),
    ("submit-time-string", spec(submit_time="now"), "submit_time", "expected a number"),
    # groups
    ("groups-empty", spec(groups=[]), "groups", "needs at least one group"),
    ("groups-mapping", spec(groups={"main": {}}), "groups", "expected a list"),
    ("group-not-mapping", spec(groups=["main"]), "groups[0]", "expected a mapping"),
    (
        "groups-duplicate-role",
        spec(groups=[{"role": "w", "command": "a", "cpu": 1}, {"role": "w", "command": "b", "cpu": 1}]),
        "groups[1].role",
        "duplicate role 'w' (also groups[0])",
    ),
    (
        "groups-default-roles-collide",
        spec(groups=[{"command": "a", "cpu": 1}, {"command": "b", "cpu": 1}]),
        "groups[1].role",
        "duplicate role 'main'",
    ),
    ("task-field-beside-groups", spec(cpu="2"), "cpu", "move it into a group"),
    ("group-unknown-field", group(volumes=["/data"]), "groups[0].volumes", "unknown field"),
    ("role-bad", group(role="-x"), "groups[0].role", "'-x' is not valid"),
    ("role-empty", group(role=""), "groups[0].role", "must not be empty"),
    ("replicas-zero", group(replicas=0), "groups[0].replicas", "must be >= 1, got 0"),
    ("replicas-huge", group(replicas=100_001), "groups[0].replicas", "must be <= 100000"),
    ("arg-past-exec", group(command=["echo", "x" * 131_072]), "groups[0].command[1]", "at most 131071"),
    ("string-past-exec", group(command="echo " + "x" * 131_072), "groups[0].command", "Linux's exec limit"),
    ("env-past-exec", group(env={"BIG": "x" * 131_068}), "groups[0].env['BIG']", "at most 131071"),
    (
        "argv-and-env-past-exec",
        group(command=["echo", *["x" * 100_000] * 11]),
        "groups[0].command",
        "at most 1048576",
    ),
    (
        "tasks-over-the-job-limit",
        {
            "id": "j1",
            "groups": [group(role=f"r{i}", replicas=100_000)["groups"][0] for i in range(10)],
        },
        "groups",
        "1000000 tasks in all; a job holds at most 100000",
    ),
    ("replicas-string", group(replicas="4"), "groups[0].replicas", "expected an integer"),
    (
        "min-member-over-total",
        spec(min_member=6, groups=[{"command": "x", "cpu": 1, "replicas": 5}]),
        "min_member",
        "min_member 6 > total replicas 5",
    ),
    (
        "command-missing",
        spec(groups=[{"role": "main", "cpu": 1}]),
        "groups[0].command",
        "required: the program to run",
    ),
    ("command-empty-string", group(command=""), "groups[0].command", "must not be empty"),
    ("command-blank", group(command="   "), "groups[0].command", "must not be empty"),
    ("command-empty-list", group(command=[]), "groups[0].command", "must not be empty"),
    ("command-empty-program", group(command=["", "x"]), "groups[0].command", "must not be empty"),
    ("command-unbalanced", group(command="echo 'oops"), "groups[0].command", "cannot split"),
    ("command-non-string", group(command=["sleep", 10]), "groups[0].command[1]", "expected a string"),
    ("command-mapping", group(command={"run": "x"}), "groups[0].command", "expected a string or a list"),
    (
        "command-boolean",
        group(command=True),
        "groups[0].command",
        "expected a string or a list of strings, got a boolean",
    ),
    ("env-bad-name", group(env={"1X": "a"}), "groups[0].env['1X']", "not an environment variable name"),
    ("env-int-value", group(env={"N": 4}), "groups[0].env['N']", "expected a string"),
    ("env-list", group(env=["A=1"]), "groups[0].env", "expected a mapping"),
    ("gpu-models-string", group(gpu_models="A100"), "groups[0].gpu_models", "expected a list"),
    ("gpu-models-empty-name", group(gpu_models=[""]), "groups[0].gpu_models[0]", "must not be empty"),
    (
        "gpu-models-duplicate",
        group(gpu_models=["A100", "A100"]),
        "groups[0].gpu_models[1]",
        "duplicate model",
    ),
    ("selector-bad-key", group(node_selector={"a b": "c"}), "groups[0].node_selector['a b']", "label key"),
    ("selector-bad-value", group(node_selector={"a": "b c"}), "groups[0].node_selector['a']", "label value"),
    # resources
    ("resources-empty", res(), "groups[0].resources", "requests nothing: ask for cpu, memory or GPUs"),
    ("resources-only-zero", res(cpu=0, memory="0Gi"), "groups[0].resources", "requests nothing"),
    (
        "resources-only-extended",
        res(extended={"example.com/fpga": 1}),
        "groups[0].resources",
        "requests nothing",
    ),
    ("resources-string", group(resources="2 cpus"), "groups[0].resources", "expected a mapping"),
    ("resources-typo", res(cpus=2), "groups[0].resources.cpus", "unknown field (did you mean 'cpu'?)"),
    ("resources-twice", group(cpu="2"), "groups[0].cpu", "given twice: here and in groups[0].resources"),
    ("cpu-negative", res(cpu=-1), "groups[0].resources.cpu", "negative"),
    ("cpu-negative-string", res(cpu="-500m"), "groups[0].resources.cpu", "'-500m' is negative"),
    ("cpu-unit", res(cpu="2Gi"), "groups[0].resources.cpu", "unit 'Gi' is not allowed"),
    ("cpu-garbage", res(cpu="two"), "groups[0].resources.cpu", "is not a quantity"),
    ("cpu-bool", res(cpu=True), "groups[0].resources.cpu", "boolean"),
    ("cpu-nan", res(cpu=float("nan")), "groups[0].resources.cpu", "nan is not a quantity"),
    ("cpu-inf", res(cpu=float("inf")), "groups[0].resources.cpu", "inf is not a quantity"),
    ("cpu-overflow", res(cpu="1e400"), "groups[0].resources.cpu", "too large"),
    ("cpu-absurd", res(cpu=100_001), "groups[0].resources.cpu", "more than 100000 cores"),
    ("memory-negative", res(memory=-1), "groups[0].resources.memory", "negative"),
    ("memory-negative-string", res(memory="-1Gi"), "groups[0].resources.memory", "negative"),
    ("memory-unit", res(memory="16GB"), "groups[0].resources.memory", "unknown unit 'GB'"),
    ("memory-absurd", res(memory="2Pi"), "groups[0].resources.memory", "more than 1Pi"),
    ("gpus-absurd", res(gpus=17), "groups[0].resources.gpus", "more than 16 GPUs"),
    (
        "gpus-fraction-above-one",
        res(gpus=1.5),
        "groups[0].resources.gpus",
        "a fraction of a GPU must be below 1",
    ),
    ("gpus-fraction-string", res(gpus="2.5"), "groups[0].resources.gpus", "must be below 1"),
    ("gpus-negative", res(gpus=-1), "groups[0].resources.gpus", "negative"),
    ("gpu-share-whole", res(gpu_share=1), "groups[0].resources.gpu_share", "more than 0.999 GPU"),
    ("gpu-share-tiny", res(gpu_share=0.0001), "groups[0].resources.gpu_share", "less than 0.001 GPU"),
    (
        "gpu-milli-1000",
        res(gpu_milli=1000),
        "groups[0].resources.gpu_milli",
        "more than 0.999 GPU (999 milli)",
    ),
    ("gpu-milli-zero", res(gpu_milli=0), "groups[0].resources.gpu_milli", "less than 0.001 GPU"),
    ("gpu-milli-fraction", res(gpu_milli=2.5), "groups[0].resources.gpu_milli", "whole number"),
    (
        "gpus-and-share",
        res(gpus=2, gpu_share=0.5),
        "groups[0].resources.gpu_share",
        "cannot combine whole GPUs (gpus) with a share",
    ),
    (
        "two-shares",
        res(gpus=0.5, gpu_milli=200),
        "groups[0].resources.gpu_milli",
        "a GPU share is already given by gpus",
    ),
    (
        "gpu-memory-without-gpu",
        res(cpu=1, gpu_memory="40Gi"),
        "groups[0].resources.gpu_memory",
        "needs a GPU request",
    ),
    (
        "gpu-memory-twice",
        res(gpus=1, gpu_memory="40Gi", gpu_memory_mib=40960),
        "groups[0].resources.gpu_memory_mib",
        "give gpu_memory or gpu_memory_mib, not both",
    ),
    ("gpu-memory-absurd", res(gpus=1, gpu_memory="2Ti"), "groups[0].resources.gpu_memory", "more than 1Ti"),
    (
        "extended-bad-name",
        res(cpu=1, extended={"bad name": 1}),
        "groups[0].resources.extended['bad name']",
        "resource name 'bad name'",
    ),
    (
        "extended-fraction",
        res(cpu=1, extended={"example.com/fpga": 1.5}),
        "groups[0].resources.extended['example.com/fpga']",
        "whole number",
    ),
    (
        "extended-negative",
        res(cpu=1, extended={"example.com/fpga": -1}),
        "groups[0].resources.extended['example.com/fpga']",
        "whole number",
    ),
    (
        "second-group-memory",
        spec(
            groups=[{"role": "a", "command": "x", "cpu": 1}, {"role": "b", "command": "x", "memory": "lots"}]
        ),
        "groups[1].memory",
        "'lots' is not a quantity",
    ),
    (
        "second-group-nested-memory",
        spec(
            groups=[
                {"role": "a", "command": "x", "cpu": 1},
                {"role": "b", "command": "x", "resources": {"memory": "16 GiB"}},
            ]
        ),
        "groups[1].resources.memory",
        "is not a quantity",
    ),
    # affinity
    ("affinity-typo", affinity(requried=[]), "groups[0].affinity.requried", "did you mean 'required'?"),
    ("affinity-list", group(affinity=[]), "groups[0].affinity", "expected a mapping"),
    ("required-not-list", affinity(required={"key": "a"}), "groups[0].affinity.required", "expected a list"),
    (
        "required-empty-term",
        affinity(required=[[]]),
        "groups[0].affinity.required[0]",
        "an empty term matches no node",
    ),
    (
        "required-term-not-list",
        affinity(required=[{"key": "a", "operator": "Exists"}]),
        "groups[0].affinity.required[0]",
        "expected a list",
    ),
    (
        "requirement-no-key",
        required({"operator": "Exists"}),
        "groups[0].affinity.required[0][0].key",
        "required",
    ),
    (
        "requirement-no-operator",
        required({"key": "zone"}),
        "groups[0].affinity.required[0][0].operator",
        "required: one of In, NotIn, Exists, DoesNotExist, Gt, Lt",
    ),
    (
        "requirement-bad-operator",
        required({"key": "zone", "operator": "Equals", "values": ["a"]}),
        "groups[0].affinity.required[0][0].operator",
        "must be one of In, NotIn, Exists, DoesNotExist, Gt, Lt",
    ),
    (
        "requirement-bad-key",
        required({"key": "a b", "operator": "Exists"}),
        "groups[0].affinity.required[0][0].key",
        "label key 'a b'",
    ),
    (
        "requirement-unknown-field",
        required({"key": "a", "operator": "Exists", "value": "x"}),
        "groups[0].affinity.required[0][0].value",
        "did you mean 'values'?",
    ),
    (
        "in-without-values",
        required({"key": "zone", "operator": "In"}),
        "groups[0].affinity.required[0][0].values",
        "In needs at least one value",
    ),
    (
        "notin-empty-values",
        required({"key": "zone", "operator": "NotIn", "values": []}),
        "groups[0].affinity.required[0][0].values",
        "NotIn needs at least one value",
    ),
    (
        "in-bad-value",
        required({"key": "zone", "operator": "In", "values": ["ok", "not ok"]}),
        "groups[0].affinity.required[0][0].values[1]",
        "label value 'not ok'",
    ),
    (
        "in-values-string",
        required({"key": "zone", "operator": "In", "values": "a"}),
        "groups[0].affinity.required[0][0].values",
        "expected a list",
    ),
    (
        "exists-with-values",
        required({"key": "zone", "operator": "Exists", "values": ["a"]}),
        "groups[0].affinity.required[0][0].values",
        "Exists takes no values",
    ),
    (
        "gt-two-values",
        required({"key": "cores", "operator": "Gt", "values": [1, 2]}),
        "groups[0].affinity.required[0][0].values",
        "Gt takes exactly one integer value, got 2",
    ),
    (
        "lt-no-values",
        required({"key": "cores", "operator": "Lt"}),
        "groups[0].affinity.required[0][0].values",
        "exactly one integer value, got 0",
    ),
    (
        "gt-not-integer",
        required({"key": "cores", "operator": "Gt", "values": ["1.5"]}),
        "groups[0].affinity.required[0][0].values[0]",
        "expected an integer",
    ),
    (
        "preferred-weight-zero",
        affinity(preferred=[{"weight": 0, "match": [{"key": "a", "operator": "Exists"}]}]),
        "groups[0].affinity.preferred[0].weight",
        "must be >= 1",
    ),
    (
        "preferred-weight-high",
        affinity(preferred=[{"weight": 101, "match": [{"key": "a", "operator": "Exists"}]}]),
        "groups[0].affinity.preferred[0].weight",
        "must be <= 100",
    ),
    (
        "preferred-no-weight",
        affinity(preferred=[{"match": [{"key": "a", "operator": "Exists"}]}]),
        "groups[0].affinity.preferred[0].weight",
        "required",
    ),
    (
        "preferred-no-match",
        affinity(preferred=[{"weight": 5}]),
        "groups[0].affinity.preferred[0].match",
        "required",
    ),
    (
        "preferred-bad-requirement",
        affinity(preferred=[{"weight": 5, "match": [{"key": "a", "operator": "In"}]}]),
        "groups[0].affinity.preferred[0].match[0].values",
        "needs at least one value",
    ),
    # anti-affinity and tolerations
    ("anti-affinity-mapping", group(anti_affinity={}), "groups[0].anti_affinity", "expected a list"),
    (
        "anti-affinity-bad-topology",
        group(anti_affinity=[{"topology_key": "Rack Name"}]),
        "groups[0].anti_affinity[0].topology_key",
        "label key 'Rack Name'",
    ),
    (
        "anti-affinity-bad-label",
        group(anti_affinity=[{"match_labels": {"x y": "z"}}]),
        "groups[0].anti_affinity[0].match_labels['x y']",
        "label key",
    ),
    (
        "anti-affinity-unknown",
        group(anti_affinity=[{"topologyKey": "zone"}]),
        "groups[0].anti_affinity[0].topologyKey",
        "unknown field",
    ),
    (
        "toleration-bad-operator",
        group(tolerations=[{"key": "a", "operator": "In"}]),
        "groups[0].tolerations[0].operator",
        "must be Equal or Exists",
    ),
    (
        "toleration-equal-no-key",
        group(tolerations=[{"value": "x"}]),
        "groups[0].tolerations[0].key",
        "required with operator Equal",
    ),
    (
        "toleration-exists-value",
        group(tolerations=[{"key": "a", "operator": "Exists", "value": "x"}]),
        "groups[0].tolerations[0].value",
        "operator Exists takes no value",
    ),
    (
        "toleration-bad-effect",
        group(tolerations=[{"key": "a", "effect": "Never"}]),
        "groups[0].tolerations[0].effect",
        "must be one of NoSchedule, PreferNoSchedule, NoExecute",
    ),
    (
        "toleration-bad-key",
        group(tolerations=[{"key": "a b"}]),
        "groups[0].tolerations[0].key",
        "label key 'a b'",
    ),
    (
        "toleration-unknown",
        group(tolerations=[{"key": "a", "tolerationSeconds": 5}]),
        "groups[0].tolerations[0].tolerationSeconds",
        "unknown field",
    ),
    # the flat form: fields sit at the top level, so paths have no group prefix
    (
        "flat-unknown",
        {"command": "x", "cpu": 1, "volumes": ["/data"]},
        "volumes",
        "unknown field",
    ),
    ("flat-typo", {"comand": "x", "cpu": 1}, "comand", "unknown field (did you mean 'command'?)"),
    ("flat-requests-nothing", {"command": "x"}, "resources", "requests nothing"),
    ("flat-no-command", {"cpu": 1}, "command", "required"),
    ("flat-memory", {"command": "x", "memory": "lots"}, "memory", "'lots' is not a quantity"),
    ("flat-nested-memory", {"command": "x", "resources": {"memory": "-1"}}, "resources.memory", "negative"),
    ("flat-replicas", {"command": "x", "cpu": 1, "replicas": 0}, "replicas", "must be >= 1"),
    (
        "flat-min-member",
        {"command": "x", "cpu": 1, "replicas": 2, "min_member": 3},
        "min_member",
        "3 > total",
    ),
    # NUL would fail Popen ("embedded null byte") once the task is bound; a lone surrogate (a non-UTF-8
    # argv byte) would fail protobuf encoding: both are refused where the spec is read
    ("command-list-nul", group(command=["echo", "a\x00b"]), "groups[0].command[1]", "NUL character"),
    ("command-string-nul", group(command="echo a\x00b"), "groups[0].command", "NUL character"),
    ("env-value-nul", group(env={"A": "x\x00"}), "groups[0].env['A']", "contains a NUL character"),
    ("env-name-nul", group(env={"A\x00": "x"}), "groups[0].env['A\\x00']", "name contains a NUL"),
    ("image-nul", group(image="python\x00"), "groups[0].image", "NUL character"),
    ("gpu-model-nul", group(gpu_models=["A100\x00"]), "groups[0].gpu_models[0]", "NUL character"),
    ("submission-id-nul", spec(submission_id="s\x00"), "submission_id", "NUL character"),
    ("command-list-surrogate", group(command=["echo", "\udcff"]), "groups[0].command[1]", "not valid UTF-8"),
    ("command-string-surrogate", group(command="echo \ud800"), "groups[0].command", "not valid UTF-8"),
    ("env-value-surrogate", group(env={"A": "\udcff"}), "groups[0].env['A']", "not valid UTF-8 text"),
    ("image-surrogate", group(image="\udcff"), "groups[0].image", "not valid UTF-8 text"),
    ("submission-id-surrogate", spec(submission_id="\ud800"), "submission_id", "not valid UTF-8"),
    ("unknown-field-surrogate", spec(**{"\ud800": 1}), "['\\ud800']", "unknown field"),
    # milli quantities are exact: rounding would turn a typo into a different request
    ("gpus-almost-one", res(gpus="0.9999"), "groups[0].resources.gpus", "not a whole number of milli-GPU"),
    ("gpus-below-one-milli", res(gpus="0.0001"), "groups[0].resources.gpus", "less than 0.001 GPU"),
    ("gpus-float-below-one-milli", res(gpus=0.0004), "groups[0].resources.gpus", "less than 0.001 GPU"),
    ("gpus-whole-and-sliver", res(gpus="1.0004"), "groups[0].resources.gpus", "not a whole number"),
    ("gpu-share-sub-milli", res(gpu_share="0.0005"), "groups[0].resources.gpu_share", "less than 0.001"),
    ("gpu-share-fraction", res(gpu_share="0.2505"), "groups[0].resources.gpu_share", "not a whole number"),
    ("cpu-below-one-milli", res(cpu="0.0001"), "groups[0].resources.cpu", "less than 0.001 core"),
    ("cpu-float-below-one-milli", res(cpu=0.0001), "groups[0].resources.cpu", "less than 0.001 core"),
    ("cpu-half-milli", res(cpu="0.5m"), "groups[0].resources.cpu", "less than 0.001 core"),
    ("cpu-sub-milli-fraction", res(cpu="1.0005"), "groups[0].resources.cpu", "not a whole number"),
    # a future submit_time would sort the job ahead of every priority
    ("submit-time-future", spec(submit_time=NOW + 61), "submit_time", "is in the future (now is 2023-11-14"),
    ("submit-time-absurd", spec(submit_time=1e300), "submit_time", "1e+300 is in the future"),
    # a backdated one would age past every priority
    ("submit-time-past", spec(submit_time=NOW - 61), "submit_time", "may not be backdated"),
    ("deadline-date-past", spec(deadline=date(2020, 1, 1)), "deadline", "not in the future"),
    ("deadline-datetime-past", spec(deadline=datetime(2020, 1, 1, tzinfo=UTC)), "deadline", "not in the"),
]


@pytest.mark.parametrize(
    ("spec_", "field", "reason"), [c[1:] for c in BAD_JOB_SPECS], ids=[c[0] for c in BAD_JOB_SPECS]
)
def test_bad_job_spec(spec_: Any, field: str, reason: str) -> None:
    with pytest.raises(SpecError) as caught:
        job_from_spec(spec_, known_queues=QUEUES, now=NOW)
    assert caught.value.field == field
    assert reason in caught.value.reason
    assert str(caught.value) == f"{field}: {caught.value.reason}"
    str(caught.value).encode("utf-8")  # the error itself travels (gRPC): it must be clean text


# -- good specs ------------------------------------------------------------------------------------
GOOD_JOB_SPECS: list[tuple[str, dict[str, Any], Job]] = [
    ("minimal", spec(), main_job()),
    ("flat", {"id": "j1", "command": "true", "cpu": "1"}, main_job()),
    ("flat-resources", {"id": "j1", "command": ["true"], "resources": {"cpu": 1}}, main_job()),
    ("cpu-milli", res(cpu="500m"), main_group(resources=ResourceRequest(cpu_milli=500))),
    ("cpu-float", res(cpu=0.5), main_group(resources=ResourceRequest(cpu_milli=500))),
    ("cpu-int", res(cpu=2), main_group(resources=ResourceRequest(cpu_milli=2000))),
    ("memory-only", res(memory="16Gi"), main_group(resources=ResourceRequest(memory=16 * GI))),
    ("memory-bytes", res(memory=1024), main_group(resources=ResourceRequest(memory=1024))),
    ("memory-decimal", res(memory="512M"), main_group(resources=ResourceRequest(memory=512_000_000))),
    ("gpus-whole", res(gpus=2), main_group(resources=ResourceRequest(gpus=2))),
    ("gpus-string", res(gpus="8"), main_group(resources=ResourceRequest(gpus=8))),
    ("gpus-16", res(gpus=16), main_group(resources=ResourceRequest(gpus=16))),
    ("gpus-half", res(gpus="0.5"), main_group(resources=ResourceRequest(gpu_milli=500))),
    ("gpus-quarter-float", res(gpus=0.25), main_group(resources=ResourceRequest(gpu_milli=250))),
    ("gpus-zero-with-cpu", res(gpus=0, cpu=1), main_job()),
    ("gpu-share", res(gpu_share=0.3), main_group(resources=ResourceRequest(gpu_milli=300))),
    ("gpu-share-milli", res(gpu_share="250m"), main_group(resources=ResourceRequest(gpu_milli=250))),
    ("gpu-milli", res(gpu_milli=999), main_group(resources=ResourceRequest(gpu_milli=999))),
    (
        "gpu-memory",
        res(gpus=1, gpu_memory="40Gi"),
        main_group(resources=ResourceRequest(gpus=1, gpu_memory_mib=40960)),
    ),
    (
        "gpu-memory-rounds-up",
        res(gpu_milli=100, gpu_memory="1000M"),
        main_group(resources=ResourceRequest(gpu_milli=100, gpu_memory_mib=954)),
    ),
    (
        "gpu-memory-mib",
        res(gpus=1, gpu_memory_mib=24576),
        main_group(resources=ResourceRequest(gpus=1, gpu_memory_mib=24576)),
    ),
    (
        "extended-sorted",
        res(cpu=1, extended={"z.io/b": 2, "a.io/a": "1"}),
        main_group(resources=ResourceRequest(cpu_milli=1000, extended=(("a.io/a", 1), ("z.io/b", 2)))),
    ),
    (
        "inline-resources",
        group(resources={"cpu": 1}, memory="1Gi"),
        main_group(resources=ResourceRequest(cpu_milli=1000, memory=GI)),
    ),
    (
        "command-shell-split",
        group(command="python -c 'print(1)' --flag"),
        main_group(command=("python", "-c", "print(1)", "--flag")),
    ),
    (
        "command-list-kept",
        group(command=["sh", "-c", "a && b", ""]),
        main_group(command=("sh", "-c", "a && b", "")),
    ),
    ("env-sorted", group(env={"B": "2", "A": ""}), main_group(env=(("A", ""), ("B", "2")))),
    ("gpu-models-in-order", group(gpu_models=["H100", "A100"]), main_group(gpu_models=("H100", "A100"))),
    (
        "node-selector",
        group(node_selector={"zone": "a", "example.com/gen": "hopper", "empty": ""}),
        main_group(node_selector=(("empty", ""), ("example.com/gen", "hopper"), ("zone", "a"))),
    ),
    (
        "required-affinity",
        affinity(
            required=[
                [
                    {"key": "zone", "operator": "In", "values": ["a", "b"]},
                    {"key": "spot", "operator": "DoesNotExist"},
                ],
                [
                    {"key": "cores", "operator": "Gt", "values": [64]},
                    {"key": "gen", "operator": "Lt", "values": ["+05"]},
                ],
            ]
        ),
        main_group(
            required_affinity=(
                NodeSelectorTerm(
                    (
                        Requirement("zone", SelectorOp.IN, ("a", "b")),
                        Requirement("spot", SelectorOp.DOES_NOT_EXIST),
                    )
                ),
                NodeSelectorTerm(
                    (Requirement("cores", SelectorOp.GT, ("64",)), Requirement("gen", SelectorOp.LT, ("5",)))
                ),
            )
        ),
    ),
    (
        "preferred-affinity",
        affinity(
            preferred=[{"weight": 100, "match": [{"key": "zone", "operator": "NotIn", "values": ["c"]}]}]
        ),
        main_group(
            preferred_affinity=(
                PreferredTerm(100, NodeSelectorTerm((Requirement("zone", SelectorOp.NOT_IN, ("c",)),))),
            )
        ),
    ),
    ("affinity-empty", affinity(required=[], preferred=[]), main_job()),
    (
        "anti-affinity",
        group(
            anti_affinity=[
                {},
                {"topology_key": "topology.kubernetes.io/zone", "match_labels": {"b": "1", "a": "2"}},
            ]
        ),
        main_group(
            anti_affinity=(
                AntiAffinity(),
                AntiAffinity("topology.kubernetes.io/zone", (("a", "2"), ("b", "1"))),
            )
        ),
    ),
    (
        "tolerations",
        group(
            tolerations=[
                {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
                {"operator": "Exists"},
                {"key": "spot", "operator": "Exists", "effect": None},
            ]
        ),
        main_group(
            tolerations=(
                Toleration("dedicated", "Equal", "gpu", TaintEffect.NO_SCHEDULE),
                Toleration("", "Exists"),
                Toleration("spot", "Exists"),
            )
        ),
    ),
    (
        "job-fields",
        spec(
            tenant="team-a",
            queue="batch",
            priority=-7,
            preemptible=False,
            kind="service",
            labels={"team": "vision", "app.kubernetes.io/name": "x"},
            disruption_budget=0,
            submit_time=NOW - 5,
            submission_id="cli-1",
        ),
        main_job(
            tenant="team-a",
            queue="batch",
            priority=-7,
            preemptible=False,
            kind=JobKind.SERVICE,
            labels=(("app.kubernetes.io/name", "x"), ("team", "vision")),
            disruption_budget=0,
            submit_time=NOW - 5.0,
            submission_id="cli-1",
        ),
    ),
    ("nulls-where-allowed", spec(deadline=None, disruption_budget=None), main_job()),
    ("deadline-unix", spec(deadline=1_893_456_000), main_job(deadline=1_893_456_000.0)),
    ("deadline-iso-z", spec(deadline="2030-01-01T00:00:00Z"), main_job(deadline=1_893_456_000.0)),
    ("deadline-iso-naive-is-utc", spec(deadline="2030-01-01T00:00:00"), main_job(deadline=1_893_456_000.0)),
    ("deadline-iso-offset", spec(deadline="2030-01-01T01:00:00+01:00"), main_job(deadline=1_893_456_000.0)),
    # what YAML makes of an unquoted ISO time or date
    (
        "deadline-datetime",
        spec(deadline=datetime(2030, 1, 1, tzinfo=UTC)),
        main_job(deadline=1_893_456_000.0),
    ),
    (
        "deadline-datetime-offset",
        spec(deadline=datetime(2030, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))),
        main_job(deadline=1_893_456_000.0),
    ),
    (
        "deadline-datetime-naive-is-utc",
        spec(deadline=datetime(2030, 1, 1)),
        main_job(deadline=1_893_456_000.0),
    ),
    ("deadline-date-is-utc-midnight", spec(deadline=date(2030, 1, 1)), main_job(deadline=1_893_456_000.0)),
    # within the allowed clock skew either way
    ("submit-time-skew", spec(submit_time=NOW + 60), main_job(submit_time=NOW + 60)),
    ("submit-time-skew-past", spec(submit_time=NOW - 60), main_job(submit_time=NOW - 60)),
    (
        "spark",
        {
            "id": "spark-pi",
            "queue": "batch",
            "min_member": 5,
            "groups": [
                {"role": "driver", "command": "spark-submit --class Pi pi.jar", "cpu": 1, "memory": "2Gi"},
                {"role": "executor", "replicas": 4, "command": ["spark-executor"], "cpu": 4, "memory": "8Gi"},
            ],
        },
        Job(
            id="spark-pi",
            queue="batch",
            min_member=5,
            submit_time=NOW,
            groups=(
                TaskGroup(
                    "driver",
                    1,
                    ResourceRequest(cpu_milli=1000, memory=2 * GI),
                    ("spark-submit", "--class", "Pi", "pi.jar"),
                ),
                TaskGroup("executor", 4, ResourceRequest(cpu_milli=4000, memory=8 * GI), ("spark-executor",)),
            ),
        ),
    ),
]


@pytest.mark.parametrize(
    ("spec_", "expected"), [c[1:] for c in GOOD_JOB_SPECS], ids=[c[0] for c in GOOD_JOB_SPECS]
)
def test_good_job_spec(spec_: dict[str, Any], expected: Job) -> None:
    before = copy.deepcopy(spec_)
    assert job_from_spec(spec_, known_queues=QUEUES, now=NOW) == expected
    assert spec_ == before  # the input is not modified


def test_spark_gang() -> None:
    job = job_from_spec(_spark(), now=NOW)
    assert job.total_replicas == 5
    assert job.min_member == 5
    assert [job.group_of(i).role for i in range(5)] == [
        "driver",
        "executor",
        "executor",
        "executor",
        "executor",
    ]
    assert job.task_ids() == [f"spark-pi/{i}" for i in range(5)]


def _spark() -> dict[str, Any]:
    return next(c[1] for c in GOOD_JOB_SPECS if c[0] == "spark")


def test_generated_id() -> None:
    first = job_from_spec({"command": "x", "cpu": 1})
    second = job_from_spec({"command": "x", "cpu": 1})
    assert re.fullmatch(r"job-[0-9a-f]{12}", first.id)
    assert first.id != second.id


def test_submit_time_defaults_to_now_or_the_clock() -> None:
    assert job_from_spec(spec(), now=NOW).submit_time == NOW
    before = time.time()
    assert before <= job_from_spec(spec()).submit_time <= time.time()


def test_deadline_is_not_checked_without_now() -> None:
    assert job_from_spec(spec(deadline=10.0)).deadline == 10.0


@pytest.mark.parametrize(
    "text",
    [
        "deadline: 2030-01-01T00:00:00Z",
        "deadline: 2030-01-01T01:00:00+01:00",
        "deadline: 2030-01-01T00:00:00",  # no zone: UTC
        "deadline: 2030-01-01",  # a date: its midnight, UTC
        "deadline: 2030-01-01 00:00:00",
    ],
)
def test_unquoted_yaml_deadline(text: str) -> None:
    loaded = yaml.safe_load(f"id: j1\ncommand: x\ncpu: 1\n{text}\n")
    assert isinstance(loaded["deadline"], date)  # YAML's own type, not a string
    assert job_from_spec(loaded, now=NOW).deadline == 1_893_456_000.0


def test_any_queue_without_known_queues() -> None:
    assert job_from_spec(spec(queue="anything")).queue == "anything"


def test_a_job_naming_no_queue_on_a_master_without_default_is_told_why() -> None:
    with pytest.raises(SpecError) as err:
        job_from_spec(spec(), known_queues={"prod", "batch"}, now=NOW)
    assert err.value.field == "queue"
    assert (
        "a job that names no queue goes to 'default', not configured here: name one (known: batch, prod)"
        in err.value.reason
    )


def test_flat_form_equals_one_group_form() -> None:
    flat = {
        "id": "f",
        "command": "run",
        "replicas": 3,
        "gpus": 1,
        "cpu": 8,
        "env": {"A": "1"},
        "min_member": 3,
    }
    grouped = {
        "id": "f",
        "min_member": 3,
        "groups": [
            {
                "role": "main",
                "command": "run",
                "replicas": 3,
                "resources": {"gpus": 1, "cpu": 8},
                "env": {"A": "1"},
            }
        ],
    }
    assert job_from_spec(flat, now=NOW) == job_from_spec(grouped, now=NOW)
    assert job_from_spec({**flat, "role": "trainer"}, now=NOW).groups[0].role == "trainer"


def test_yaml_spec() -> None:
    text = """
    id: train-42
    tenant: team-a
    queue: batch
    priority: 100
    min_member: 4
    deadline: "2030-01-01T00:00:00Z"
    labels: {team: vision}
    groups:
      - role: worker
        replicas: 4
        command: python train.py --lr 0.1
        env: {NCCL_DEBUG: INFO}
        resources: {cpu: 8, memory: 64Gi, gpus: 2, gpu_memory: 80Gi}
        gpu_models: [A100, H100]
        affinity:
          required:
            - [{key: gpu-gen, operator: In, values: [ampere, hopper]}]
          preferred:
            - {weight: 50, match: [{key: zone, operator: In, values: [a]}]}
        anti_affinity: [{topology_key: node}]
        tolerations: [{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}]
    """
    job = job_from_spec(yaml.safe_load(text), known_queues=QUEUES, now=NOW)
    worker = job.groups[0]
    assert (job.id, job.queue, job.priority, job.min_member, job.deadline) == (
        "train-42",
        "batch",
        100,
        4,
        1893456000.0,
    )
    assert worker.resources == ResourceRequest(cpu_milli=8000, memory=64 * GI, gpus=2, gpu_memory_mib=81920)
    assert worker.command == ("python", "train.py", "--lr", "0.1")
    assert worker.required_affinity[0].requirements[0] == Requirement(
        "gpu-gen", SelectorOp.IN, ("ampere", "hopper")
    )
    assert worker.tolerations == (Toleration("dedicated", "Equal", "gpu", TaintEffect.NO_SCHEDULE),)
    assert job_from_spec(job_to_spec(job)) == job


def test_job_to_spec_is_plain_data() -> None:
    job = job_from_spec(_spark(), now=NOW)
    out = job_to_spec(job)
    assert json.loads(json.dumps(out)) == out
    assert out["groups"][1] == {
        "role": "executor",
        "replicas": 4,
        "command": ["spark-executor"],
        "resources": {"cpu": "4", "memory": 8 * GI},
    }


def _holds_nul(value: object) -> bool:
    """Whether a NUL character is anywhere in `value` (a spec: strings, mappings and lists)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False


@settings(max_examples=300, deadline=None)
@given(jobs())
def test_job_spec_round_trip(job: Job) -> None:
    out = job_to_spec(job)
    if _holds_nul(out):  # the strategies' free text may hold NUL, which no spec accepts
        with pytest.raises(SpecError, match="NUL character"):
            job_from_spec(out)
        return
    assert job_from_spec(out, known_queues={job.queue}) == job
    assert job_from_spec(json.loads(json.dumps(out))) == job  # and through JSON


# -- nodes -----------------------------------------------------------------------------------------
def node(**fields: Any) -> dict[str, Any]:
    return {"name": "n1", "cpu": 64, "memory": "512Gi", **fields}


def gpus(*items: dict[str, Any]) -> dict[str, Any]:
    return node(gpus=list(items))


BAD_NODE_SPECS: list[tuple[str, Any, str, str]] = [
    ("not-a-mapping", "n1", "spec", "expected a mapping"),
    ("no-name", {"cpu": 1, "memory": "1Gi"}, "name", "required"),
    ("no-cpu", {"name": "n", "memory": "1Gi"}, "cpu", "required"),
    ("no-memory", {"name": "n", "cpu": 1}, "memory", "required"),
    ("unknown", node(zone="a"), "zone", "unknown field"),
    ("name-bad", node(name="node 1"), "name", "is not valid"),
    ("name-long", node(name="n" * 254), "name", "longer than 253"),
    ("cpu-zero", node(cpu=0), "cpu", "must be more than 0"),
    ("cpu-absurd", node(cpu=200_000), "cpu", "more than 100000 cores"),
    ("cpu-sub-milli", node(cpu="64.0005"), "cpu", "not a whole number of milli-core"),
    ("gpu-model-nul", gpus({"model": "A100\x00"}), "gpus[0].model", "NUL character"),
    ("memory-zero", node(memory=0), "memory", "must be more than 0"),
    ("memory-absurd", node(memory="2Pi"), "memory", "more than 1Pi"),
    ("memory-garbage", node(memory="much"), "memory", "not a quantity"),
    ("gpus-string", node(gpus="8xA100"), "gpus", "expected a list"),
    ("gpus-too-many", gpus(*({} for _ in range(17))), "gpus", "17 GPUs, at most 16"),
    ("gpu-index-16", gpus({"index": 16}), "gpus[0].index", "must be <= 15"),
    ("gpu-index-negative", gpus({"index": -1}), "gpus[0].index", "must be >= 0"),
    ("gpu-index-duplicate", gpus({"index": 1}, {"index": 1}), "gpus[1].index", "duplicate GPU index 1"),
    ("gpu-index-default-collides", gpus({}, {"index": 0}), "gpus[1].index", "duplicate GPU index 0"),
    ("gpu-uuid-duplicate", gpus({"uuid": "G"}, {"uuid": "G"}), "gpus[1].uuid", "duplicate uuid 'G'"),
    ("gpu-unknown", gpus({"mem": "80Gi"}), "gpus[0].mem", "did you mean 'memory'?"),
    ("gpu-memory-twice", gpus({"memory": "80Gi", "memory_mib": 1}), "gpus[0].memory_mib", "not both"),
    ("gpu-memory-bad", gpus({"memory": "80GB"}), "gpus[0].memory", "unknown unit 'GB'"),
    ("gpu-numa-bad", gpus({"numa_node": -2}), "gpus[0].numa_node", "must be >= -1"),
    ("gpu-peer-missing", gpus({"nvlink_peers": [3]}), "gpus[0].nvlink_peers", "no GPU with index 3"),
    ("gpu-peer-self", gpus({"nvlink_peers": [0]}), "gpus[0].nvlink_peers", "cannot be its own peer"),
    (
        "gpu-peer-one-way",
        gpus({"nvlink_peers": [1]}, {}),
        "gpus[0].nvlink_peers",
        "GPU 1 does not list GPU 0 as a peer",
    ),
    (
        "gpu-peer-twice",
        gpus({"nvlink_peers": [1, 1]}, {"nvlink_peers": [0]}),
        "gpus[0].nvlink_peers",
        "listed twice",
    ),
    ("gpu-peer-string", gpus({"nvlink_peers": ["1"]}), "gpus[0].nvlink_peers[0]", "expected an integer"),
    ("gpus-boolean", node(gpus=True), "gpus", "expected a list of GPUs or a mapping (count, model, ...)"),
    ("shorthand-no-count", node(gpus={"model": "A100"}), "gpus.count", "required"),
    ("shorthand-too-many", node(gpus={"count": 17}), "gpus.count", "must be <= 16"),
    (
        "shorthand-unknown",
        node(gpus={"count": 2, "nvlink": True}),
        "gpus.nvlink",
        "did you mean 'nvlink_pairs'?",
    ),
    ("labels-bad", node(labels={"a": "b c"}), "labels['a']", "label value"),
    ("taint-no-key", node(taints=[{"value": "x"}]), "taints[0].key", "required"),
    (
        "taint-bad-effect",
        node(taints=[{"key": "a", "effect": "NoRun"}]),
        "taints[0].effect",
        "must be one of",
    ),
    (
        "taint-duplicate",
        node(taints=[{"key": "a"}, {"key": "a", "value": "x"}]),
        "taints[1]",
        "duplicate taint 'a' with effect NoSchedule",
    ),
    (
        "extended-bad",
        node(extended={"example.com/fpga": "2Gi"}),
        "extended['example.com/fpga']",
        "takes no unit",
    ),
    (
        "extended-builtin-name",
        node(extended={"nvidia.com/GPU": 2}),
        "extended['nvidia.com/GPU']",
        "nvidia.com/GPU is a built-in resource, not an extended one: a node gives it as gpus",
    ),
    ("extended-cpu", node(extended={"cpu": 4}), "extended['cpu']", "a node gives it as cpu"),
    ("state-bad", node(state="up"), "state", "must be one of ready, not_ready, cordoned, draining"),
]


@pytest.mark.parametrize(
    ("spec_", "field", "reason"), [c[1:] for c in BAD_NODE_SPECS], ids=[c[0] for c in BAD_NODE_SPECS]
)
def test_bad_node_spec(spec_: Any, field: str, reason: str) -> None:
    with pytest.raises(SpecError) as caught:
        node_from_spec(spec_)
    assert caught.value.field == field
    assert reason in caught.value.reason


GOOD_NODE_SPECS: list[tuple[str, dict[str, Any], Node]] = [
    ("minimal", node(), Node("n1", 64_000, 512 * GI)),
    (
        "gpu-list-sorted",
        gpus(
            {
                "index": 1,
                "uuid": "GPU-b",
                "model": "H100",
                "memory": "80Gi",
                "numa_node": 0,
                "nvlink_peers": [0],
            },
            {"index": 0, "uuid": "GPU-a", "model": "H100", "memory_mib": 81920, "nvlink_peers": [1]},
        ),
        Node(
            "n1",
            64_000,
            512 * GI,
            gpus=(Gpu(0, "GPU-a", "H100", 81920, -1, (1,)), Gpu(1, "GPU-b", "H100", 81920, 0, (0,))),
        ),
    ),
    ("gpu-index-default", gpus({}, {}), Node("n1", 64_000, 512 * GI, gpus=(Gpu(0), Gpu(1)))),
    (
        "gpu-memory-rounds-down",
        gpus({"memory": "80G"}),
        Node("n1", 64_000, 512 * GI, gpus=(Gpu(0, memory_mib=76293),)),
    ),
    (
        "shorthand",
        node(gpus={"count": 4, "model": "A100", "memory": "40Gi", "numa_nodes": 2, "nvlink_pairs": True}),
        Node(
            "n1",
            64_000,
            512 * GI,
            gpus=tuple(Gpu(i, "", "A100", 40960, i // 2, (i ^ 1,)) for i in range(4)),
        ),
    ),
    (
        "shorthand-plain",
        node(gpus={"count": 3, "memory_mib": 24576}),
        Node("n1", 64_000, 512 * GI, gpus=tuple(Gpu(i, memory_mib=24576) for i in range(3))),
    ),
    (
        "everything-else",
        node(
            labels={"zone": "a", "example.com/rack": "r1"},
            taints=[{"key": "dedicated", "value": "gpu"}, {"key": "spot", "effect": "PreferNoSchedule"}],
            extended={"example.com/fpga": 2},
            state="cordoned",
        ),
        Node(
            "n1",
            64_000,
            512 * GI,
            labels=(("example.com/rack", "r1"), ("zone", "a")),
            taints=(Taint("dedicated", "gpu"), Taint("spot", "", TaintEffect.PREFER_NO_SCHEDULE)),
            extended=(("example.com/fpga", 2),),
            state=NodeState.CORDONED,
        ),
    ),
]


@pytest.mark.parametrize(
    ("spec_", "expected"), [c[1:] for c in GOOD_NODE_SPECS], ids=[c[0] for c in GOOD_NODE_SPECS]
)
def test_good_node_spec(spec_: dict[str, Any], expected: Node) -> None:
    assert node_from_spec(spec_) == expected


@settings(max_examples=300, deadline=None)
@given(nodes)
def test_node_spec_round_trip(n: Node) -> None:
    out = node_to_spec(n)
    assert node_from_spec(out) == n
    assert node_from_spec(json.loads(json.dumps(out))) == n


def test_a_held_node_naming_a_built_in_resource_still_reads_back() -> None:
    """A client reads back what the master holds (new=False), which may predate the rule."""
    held = node(extended={"gpu": 1})
    assert node_from_spec(held, new=False).extended == (("gpu", 1),)
    with pytest.raises(SpecError):
        node_from_spec(held)
