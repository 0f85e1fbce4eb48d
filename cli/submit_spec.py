"""The job spec `gosched submit` sends: read from a YAML/JSON file (or stdin), or built from flags.

Flags build the flat form of common/spec.py (one group). With a file, the job-level flags
(--name, --queue, --priority, ...) override the file's values; the task-level ones (--gpus,
--env, the command, ...) belong in the file and are refused next to it. Validation itself is
left to `job_from_spec` (through the Client), whose field paths `flag_for` maps back to flags. A
job file must be UTF-8 and may not repeat a key (the error names the key and its line).
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from gosched.cli.exits import CliError
from gosched.common.node import TaintEffect
from gosched.common.strict_yaml import DuplicateKeyError, load_yaml_all

# spec key -> the flag that sets it
TASK_FLAGS = {
    "command": "the command after --",
    "cpu": "--cpus",
    "memory": "--mem",
    "gpus": "--gpus",
    "replicas": "--replicas",
    "gpu_models": "--gpu-model",
    "gpu_topology": "--gpu-topology",
    "node_selector": "--selector",
    "env": "--env",
    "image": "--image",
    "tolerations": "--toleration",
    "resources": "--cpus, --mem or --gpus",  # "requests nothing"
}
JOB_FLAGS = {
    "id": "--name",
    "tenant": "--tenant",
    "queue": "--queue",
    "priority": "--priority",
    "min_member": "--min-member",
    "submission_id": "--submission-id",
    "time_limit": "--time-limit",
    "max_retries": "--max-retries",
    "deadline": "--deadline",
    "kind": "--kind",
    "preemptible": "--preemptible/--no-preemptible",
}


@dataclass(frozen=True, slots=True)
class JobFlags:
    """`gosched submit`'s flags; None or empty: not given."""

    command: tuple[str, ...] = ()
    cpus: str | None = None
    mem: str | None = None
    gpus: str | None = None
    replicas: int | None = None
    gpu_models: tuple[str, ...] = ()
    gpu_topology: str | None = None
    selectors: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    image: str | None = None
    name: str | None = None
    tenant: str | None = None
    queue: str | None = None
    priority: int | None = None
    min_member: int | None = None
    submission_id: str | None = None
    time_limit: str | None = None
    max_retries: int | None = None
    deadline: str | None = None
    tolerations: tuple[str, ...] = ()
    kind: str | None = None
    preemptible: bool | None = None

    def task_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.command:
            out["command"] = list(self.command)  # word by word, as given: no shell splitting
        for key, value in (("cpu", self.cpus), ("memory", self.mem), ("gpus", self.gpus)):
            if value is not None:
                out[key] = value
        if self.replicas is not None:
            out["replicas"] = self.replicas
        if self.gpu_models:
            out["gpu_models"] = [m for item in self.gpu_models for m in _split_commas(item)]
        if self.gpu_topology is not None:
            out["gpu_topology"] = self.gpu_topology
        if self.selectors:
            items = [s for item in self.selectors for s in _split_commas(item)]
            out["node_selector"] = key_values(items, "--selector")
        if self.env:
            out["env"] = key_values(self.env, "--env")  # values may hold commas: one per flag
        if self.image is not None:
            out["image"] = self.image
        if self.tolerations:
            out["tolerations"] = [toleration(item) for item in self.tolerations]
        return out

    def job_fields(self) -> dict[str, Any]:
        values = {
            "id": self.name,
            "tenant": self.tenant,
            "queue": self.queue,
            "priority": self.priority,
            "min_member": self.min_member,
            "submission_id": self.submission_id,
            "time_limit": self.time_limit,
            "max_retries": self.max_retries,
            "deadline": _deadline_flag(self.deadline),
            "kind": self.kind,
            "preemptible": self.preemptible,
        }
        return {k: v for k, v in values.items() if v is not None}


def _deadline_flag(text: str | None) -> str | float | None:
    """--deadline as the spec takes it: digits are unix seconds (the spec's number), the rest
    (ISO-8601, now+2h) goes as written."""
    if text is None:
        return None
    stripped = text.strip()
    return float(stripped) if re.fullmatch(r"\d+(\.\d+)?", stripped) else stripped


TOLERATION_SYNTAX = "KEY=VALUE:EFFECT, KEY:EFFECT, KEY=VALUE or KEY"


def toleration(text: str) -> dict[str, str]:
    """A --toleration as the spec's mapping, in kubectl's taint syntax: KEY=VALUE:EFFECT (Equal),
    KEY:EFFECT (Exists), KEY=VALUE (Equal, every effect) or KEY (Exists, every effect). The key's and
    value's syntax is left to the spec; the effect is checked here, to say which are known."""
    where = f"--toleration {text!r}"
    body, colon, effect = text.strip().rpartition(":") if ":" in text else (text.strip(), "", "")
    key, equals, value = body.partition("=")
    key, value, effect = key.strip(), value.strip(), effect.strip()
    if not key:
        raise CliError(f"{where}: no key (expected {TOLERATION_SYNTAX})")
    if colon and not effect:
        raise CliError(f"{where}: no effect after ':' (expected {TOLERATION_SYNTAX})")
    known = [e.value for e in TaintEffect]
    if colon and effect not in known:
        raise CliError(f"{where}: the effect must be one of {', '.join(known)}, got {effect!r}")
    if equals and not value:
        raise CliError(f"{where}: no value after '=' (write {key} or {key}:EFFECT to tolerate any value)")
    out = {"key": key, "operator": "Equal", "value": value} if equals else {"key": key, "operator": "Exists"}
    if colon:
        out["effect"] = effect
    return out


def _split_commas(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def key_values(items: tuple[str, ...] | list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"{flag}: expected KEY=VALUE, got {item!r}")
        key = key.strip()
        if key in out and out[key] != value:  # the last would silently win, and a constraint be lost
            raise CliError(f"{flag}: {key!r} is given twice ({key}={out[key]} and {item})")
        out[key] = value
    return out


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: a dict, refusing a key given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def load_spec_text(text: str) -> Any:
    """JSON or YAML text as plain data; DuplicateKeyError or yaml.YAMLError if it is neither."""
    documents = load_spec_documents(text)
    if len(documents) > 1:
        raise CliError(f"expected one job spec, found {len(documents)} YAML documents")
    return documents[0] if documents else None


def load_spec_documents(text: str) -> list[Any]:
    """The documents of JSON or YAML text (a YAML stream may hold several, between `---` lines;
    empty ones are left out, as kubectl does) as plain data; DuplicateKeyError or yaml.YAMLError."""
    try:  # json first: PyYAML (YAML 1.1) reads a JSON number such as 1e9 as a string
        return [json.loads(text, object_pairs_hook=_unique_pairs)]
    except json.JSONDecodeError:
        pass
    # As load_yaml reads (a key given twice is an error), for every document of the stream.
    return [d for d in load_yaml_all(text) if d is not None]


def _read_text(path: str, stdin: TextIO) -> tuple[str, str]:
    """The file's name as errors call it, and its text; CliError if it cannot be read as UTF-8."""
    name = "stdin" if path == "-" else path
    try:
        # utf-8-sig: the encoding YAML and JSON files are in, whatever the locale, BOM or not
        text = stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8-sig")
        text.encode("utf-8")  # stdin may carry undecodable bytes as lone surrogates
    except OSError as exc:
        raise CliError(f"cannot read {name}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, UnicodeEncodeError) as exc:
        raise CliError(f"{name} is not UTF-8 text (at offset {exc.start}): save it as UTF-8") from None
    return name, text


def read_spec_documents(path: str, stdin: TextIO) -> list[dict[str, Any]]:
    """The job specs in a YAML or JSON file ("-": stdin): one, or one per YAML document; CliError
    naming the file (and the document, of several) if one is not a mapping."""
    name, text = _read_text(path, stdin)
    try:
        documents = load_spec_documents(text)
    except DuplicateKeyError as exc:
        raise CliError(f"{name}: {exc}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: e.g. a 5000-digit int
        raise CliError(f"{name} is not valid YAML or JSON: {exc}") from None
    if not documents:
        raise CliError(f"{name}: a job spec must be a mapping of fields, got nothing")
    for i, data in enumerate(documents):
        if not isinstance(data, dict):
            where = f"{name}, document {i + 1}" if len(documents) > 1 else name
            raise CliError(f"{where}: a job spec must be a mapping of fields, got {type(data).__name__}")
    return documents


def read_spec_file(path: str, stdin: TextIO) -> dict[str, Any]:
    """The mapping in a YAML or JSON file ("-": stdin); CliError naming the file if it is not one."""
    documents = read_spec_documents(path, stdin)
    if len(documents) > 1:
        name = "stdin" if path == "-" else path
        raise CliError(f"{name}: expected one job spec, found {len(documents)} YAML documents")
    return documents[0]


def build_spec(path: str | None, flags: JobFlags, stdin: TextIO) -> dict[str, Any]:
    """The spec dict to submit, from the file at `path` (if given) and the flags."""
    specs = build_specs(path, flags, stdin)
    if len(specs) > 1:
        raise CliError(f"{path}: expected one job spec, found {len(specs)} YAML documents")
    return specs[0]


def build_specs(path: str | None, flags: JobFlags, stdin: TextIO) -> list[dict[str, Any]]:
    """The spec dicts to submit, from the file at `path` (if given: one per YAML document) and the
    flags (the job-level ones apply to each job; --name and --submission-id name one job only)."""
    task = flags.task_fields()
    if path is not None:
        if task:
            given = ", ".join(TASK_FLAGS[k] for k in task)
            raise CliError(f"{given}: not with -f; put it in the job file")
        documents = read_spec_documents(path, stdin)
        job = flags.job_fields()
        if len(documents) > 1:
            for key in ("id", "submission_id"):
                if key in job:
                    raise CliError(
                        f"{JOB_FLAGS[key]}: names one job, and {'stdin' if path == '-' else path} holds "
                        f"{len(documents)}: give each document its own {key}"
                    )
        return [{**data, **job} for data in documents]
    if "command" not in task:
        raise CliError(
            "nothing to submit: give a job file (-f job.yaml, -f - for stdin) or a command after --"
        )
    return [{**task, **flags.job_fields()}]


def flag_for(field: str) -> str | None:
    """The flag behind a spec field path of the flat form ("env['X']" -> "--env")."""
    root = re.split(r"[.\[]", field, maxsplit=1)[0]
    return TASK_FLAGS.get(root) or JOB_FLAGS.get(root)
