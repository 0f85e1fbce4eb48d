"""External job and node specs: plain dicts (YAML, JSON, CLI flags, later gRPC) to the model and back.

`job_from_spec` / `node_from_spec` validate everything and raise `SpecError(field, reason)` at the
first problem; `field` is a path such as ``groups[1].resources.memory``, ``min_member`` or
``labels['team']`` (mapping entries are written in brackets since keys may hold dots).
`job_to_spec` / `node_to_spec` are the inverses: ``job_from_spec(job_to_spec(job)) == job`` for
every valid job in canonical form (mapping-like pairs sorted by key, as `job_from_spec` builds them).

Job spec (every key optional unless marked)::

    id: train-42               # [A-Za-z0-9._-], starting with a letter or digit, <= 128 chars;
                               #   absent: "job-<12 hex>", random, or with a submission_id a
                               #   digest of it (generated_job_id)
    tenant: team-a             # queue-name syntax (QueueConfig.name): [a-z0-9]([-a-z0-9_.]*[a-z0-9])?
    queue: default             # same syntax; must be one of known_queues when those are given
    priority: 0                # int in [-1000000, 1000000]
    min_member: 1              # gang size: 1 <= min_member <= total replicas
    preemptible: true
    kind: batch                # batch | service. A service's process is restarted by its agent
                               #   whenever it exits, exit code 0 too (restartPolicy: Always), never
                               #   after a kill (cancel, preemption, the agent's stop, time_limit); a
                               #   batch task never is (its failures are retried by max_retries)
    deadline: 1735689600.0     # unix seconds or ISO-8601 ("2025-01-01T00:00:00Z"; no zone: UTC; an
                               #   unquoted YAML date/time works too), or "now+2h" (a duration as
                               #   time_limit takes it, from `now`); when `now` is given, after it
                               #   and not after 9999-12-31T23:59:59Z. A job that could no longer end
                               #   by it (its time_limit from now would pass it) is not started
                               #   but cancelled, and refused at submission (Settings.end_missed_deadlines)
    labels: {team: vision}     # Kubernetes label syntax
    disruption_budget: 2       # int >= 0, or null: no limit; at most this many of the job's tasks
                               #   down at once through preemption (evicted or lost, not yet running again)
    time_limit: 1h30m          # how long each task may run from its start (then it is stopped and
                               #   fails): seconds as a number, or "90s", "45m", "2h", "1d", "1h30m",
                               #   or Slurm's "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS"
                               #   (a bare number in a string, "90", is refused: Slurm means minutes);
                               #   at most 365 days; null: no limit
    max_retries: 3             # times each task is run again after it fails, 0..1000 (default 0)
    submit_time: 1735680000.0  # default: `now` (or the current time). Within 60 s of now when now is
                               #   given (clock skew). The dispatcher stamps its own clock when it
                               #   accepts the job: aging reads it, and a backdated time would jump
                               #   the queue past any priority.
    submission_id: cli-7f3a    # <= 128 chars; a retry under it returns the job first submitted
                               #   with it, if it names the same id (or none) and repeats the spec
    groups:                    # required unless the flat form is used; roles unique
      - role: worker           # label-name syntax, default "main"
        replicas: 4            # 1..100000, default 1
        command: python train.py --lr 0.1   # required: a string (split like a shell does) or a list
        env: {NCCL_DEBUG: INFO}
        resources:             # these keys may also be written directly in the group
          cpu: 2               # cores: 2, 0.5, "2", "500m"; whole milli-cores ("0.0001" is refused)
          memory: 16Gi         # bytes: 17179869184, "16Gi", "512M"
          gpus: 1              # whole GPUs (<= 16); a fraction below 1 ("0.5") is a share of one GPU,
                               #   in whole milli-GPU ("0.9999" and "0.0001" are refused, not rounded)
          gpu_share: 0.25      # or the share as a fraction of one GPU: 0.001..0.999 ("250m" too)
          gpu_milli: 250       # or the share in milli-GPU: 1..999
          gpu_memory: 40Gi     # each assigned GPU must have this much memory (or gpu_memory_mib: 40960)
          extended: {example.com/fpga: 1}   # not cpu, memory, gpu(s), nvidia.com/gpu: the keys above
        gpu_models: [A100, H100]          # acceptable models; empty: any
        gpu_topology: single-numa  # preferred (default): GPUs on one NUMA node, NVLinked, when free;
                                   #   single-numa: all whole GPUs on one NUMA node, or wait;
                                   #   single-numa-nvlink: and NVLink-connected among themselves.
                                   #   Needs a GPU request; binds tasks of 2+ whole GPUs only
        node_selector: {zone: us-east-1a}
        affinity:
          required:            # OR of terms; each term is a list of requirements, all must hold
            - [{key: gpu-gen, operator: In, values: [ampere, hopper]}]
          preferred:           # weight 1..100; match: one term
            - {weight: 50, match: [{key: zone, operator: In, values: [a]}]}
        anti_affinity: [{topology_key: node, match_labels: {app: db}}]  # topology_key: node or a label key
        tolerations: [{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}]
        image: python:3.12     # run the command in this container image (docker/podman on the node)

A requirement is ``{key, operator, values}``: In/NotIn need values, Exists/DoesNotExist take none,
Gt/Lt take exactly one integer. A toleration's operator is Equal (the default; needs a key) or
Exists (no value; an empty key tolerates every taint); no effect means every effect.
A task must request cpu, memory or a GPU; GPU memory and a required gpu_topology need a GPU request.

Flat form: without ``groups``, the group keys above (role, replicas, command, resources, cpu, ...)
are written at the top level and make one group, role "main" unless given.

Node spec::

    name: gpu-node-1           # label-name syntax, <= 253 chars; required
    cpu: 64                    # required, > 0
    memory: 512Gi              # required, > 0
    gpus:                      # a list; index defaults to the position, unique and < 16
      - {index: 0, uuid: GPU-1, model: A100, memory: 80Gi, numa_node: 0, nvlink_peers: [1]}
    # or a shorthand for identical GPUs (numa_nodes absent: NUMA unknown; nvlink_pairs: 0-1, 2-3, ...):
    # gpus: {count: 8, model: A100, memory: 80Gi, numa_nodes: 2, nvlink_pairs: true}
    labels: {zone: a}
    taints: [{key: dedicated, value: gpu, effect: NoSchedule}]   # effect defaults to NoSchedule
    extended: {example.com/fpga: 2}
    state: ready               # ready | not_ready | cordoned | draining

A GPU's memory is given as a quantity (``memory: 80Gi``) or in MiB (``memory_mib: 81920``); NVLink
peers must be GPUs of the same node that list this GPU back.

Every string must be valid UTF-8 text without NUL characters: strings end up as process arguments,
environment entries and protobuf fields, none of which can hold them.

Types are strict: an integer field takes an int (not a bool, not a string), a flag takes a bool, and
null is accepted only where the model allows None (deadline, disruption_budget, time_limit, a
toleration's effect). Quantities take numbers or quantity strings. Unknown keys are errors.
"""

import difflib
import hashlib
import math
import re
import shlex
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, NoReturn, TypeVar

from gosched.common.cluster_state import MAX_GPUS
from gosched.common.config import NAME_PATTERN
from gosched.common.errors import QuantityError, SpecError
from gosched.common.job import (
    DEFAULT_QUEUE,
    NO_DEFAULT_QUEUE,
    AntiAffinity,
    GpuTopologyMode,
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
from gosched.common.quantity import format_milli, parse_bytes, parse_count, parse_milli
from gosched.common.resources import GPU_MILLI, ResourceRequest

__all__ = ["job_from_spec", "job_to_spec", "node_from_spec", "node_to_spec"]

E = TypeVar("E", bound=StrEnum)

# -- limits: anything beyond them is a typo, not a workload -------------------------------------
MAX_ID_LEN = 128
MAX_NAME_LEN = 63  # tenant, queue, role: like a DNS label
MAX_NODE_NAME_LEN = 253
MAX_PRIORITY = 1_000_000
MAX_REPLICAS = 100_000
MAX_TASKS_PER_JOB = 100_000  # over all groups: one job's submit, cancel or end is one call
MAX_CPU_MILLI = 100_000 * 1000  # 100000 cores
MAX_MEMORY = 2**50  # 1 PiB
MAX_GPU_MEMORY = 2**40  # 1 TiB per GPU
MAX_EXTENDED = 10**15
MAX_TEXT_LEN = 1024  # GPU model names, uuids
# What exec() takes on Linux: one argument or NAME=value at most 32 pages with its NUL
# (MAX_ARG_STRLEN), and all of them with the agent's own variables under ARG_MAX (2 MiB by
# default): a task past them could never start, so the spec is refused instead.
MAX_ARG_BYTES = 32 * 4096 - 1
MAX_ARGV_ENV_BYTES = 1024 * 1024
MIB = 2**20
MAX_CLOCK_SKEW_S = 60.0  # how far ahead of the server's clock a client's submit_time may be
# The last second of 9999-12-31 UTC: later times have no date (datetime's range), so they could not
# be shown (describe) or written back as ISO-8601.
MAX_DEADLINE = 253402300799.0
MAX_TIME_LIMIT = 365 * 86400.0
MAX_RETRIES = 1000

_MISSING: Any = object()  # "key absent", distinct from an explicit null

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# What ids of jobs taken before they had to start with a letter or digit are: still readable.
_OLD_ID = re.compile(r"[A-Za-z0-9._-]+")
_QUEUE_NAME = re.compile(NAME_PATTERN.strip("^$"))
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTEGER = re.compile(r"[+-]?[0-9]+")

# Resources a node has built in, which a task asks for with its own fields, by the names an
# `extended` entry might give them (compared in lowercase), each with that field: no node advertises
# an extended resource of such a name (the agent refuses it, cli/agent_cmd.py, and so does a node's
# registration, node_from_spec), so a task asking for one would pend forever. `nvidia.com/gpu` is
# the Kubernetes device plugin's name for GPUs.
BUILTIN_RESOURCES = {
    "cpu": "cpu",
    "cpus": "cpu",
    "memory": "memory",
    "gpu": "gpus",
    "gpus": "gpus",
    "nvidia.com/gpu": "gpus",
}
_BUILTIN_EXAMPLES = {"cpu": "cpu: 2", "memory": "memory: 16Gi", "gpus": "gpus: 1"}

_RESOURCE_KEYS = frozenset(
    {"cpu", "memory", "gpus", "gpu_share", "gpu_milli", "gpu_memory", "gpu_memory_mib", "extended"}
)
_GROUP_KEYS = _RESOURCE_KEYS | {
    "role",
    "replicas",
    "command",
    "env",
    "resources",
    "gpu_models",
    "gpu_topology",
    "node_selector",
    "affinity",
    "anti_affinity",
    "tolerations",
    "image",
}
_JOB_KEYS = frozenset(
    {
        "id",
        "tenant",
        "queue",
        "priority",
        "min_member",
        "preemptible",
        "deadline",
        "kind",
        "labels",
        "disruption_budget",
        "submit_time",
        "submission_id",
        "time_limit",
        "max_retries",
    }
)
_NODE_KEYS = frozenset({"name", "cpu", "memory", "gpus", "labels", "taints", "extended", "state"})
_GPU_KEYS = frozenset({"index", "uuid", "model", "memory", "memory_mib", "numa_node", "nvlink_peers"})
_GPU_SHORTHAND_KEYS = frozenset({"count", "model", "memory", "memory_mib", "numa_nodes", "nvlink_pairs"})


# == paths and failures ==========================================================================
def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _item(path: str, index: int) -> str:
    return f"{path}[{index}]"


def _entry(path: str, key: str) -> str:
    return f"{path}[{key!r}]"


def _fail(path: str, reason: str) -> NoReturn:
    raise SpecError(path or "spec", reason)


def _describe(value: object) -> str:
    """A short phrase naming what was found, for "expected X, got Y" reasons."""
    if value is None:
        return "null"
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(type(value))
    if kind is None:
        kind = "a list" if isinstance(value, list | tuple) else f"a {type(value).__name__}"
    return f"{kind} ({_short(value)})"


def _short(value: object) -> str:
    """repr(value), cut to a length that fits in a message."""
    text = repr(value)
    return f"{text[:37]}..." if len(text) > 40 else text


# == plain values ================================================================================
def _mapping(value: object, path: str, allowed: Collection[str] | None = None) -> Mapping[str, Any]:
    """`value` as a mapping with string keys; with `allowed`, every key must be one of those."""
    if not isinstance(value, Mapping):
        _fail(path, f"expected a mapping, got {_describe(value)}")
    for key in value:
        if not isinstance(key, str):
            _fail(path, f"keys must be strings, got {_describe(key)}")
        if allowed is not None and key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            # a key that is not clean text goes into the path quoted, so the error itself can be sent
            where = _at(path, key) if _text_problem(key) is None else _entry(path, key)
            _fail(where, "unknown field" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return value


def _list(value: object, path: str, expected: str = "a list") -> Sequence[Any]:
    """`value` as a list; `expected` names what the field takes when it takes more than a list."""
    if not isinstance(value, list | tuple):
        _fail(path, f"expected {expected}, got {_describe(value)}")
    return value


def _text_problem(text: str) -> str | None:
    """Why `text` cannot be a process argument, an environment entry or a protobuf string; None if it can."""
    if "\x00" in text:  # Popen fails on it ("embedded null byte") after the task is bound
        return f"contains a NUL character (\\x00) at position {text.index(chr(0))}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate, e.g. from a non-UTF-8 byte in argv
        return f"not valid UTF-8 text: {text[exc.start]!r} at position {exc.start}"
    return None


def _str(value: object, path: str, max_len: int | None = None) -> str:
    if not isinstance(value, str):
        _fail(path, f"expected a string, got {_describe(value)}")
    if problem := _text_problem(value):
        _fail(path, problem)
    if max_len is not None and len(value) > max_len:
        _fail(path, f"longer than {max_len} characters ({len(value)})")
    return value


def _int(value: object, path: str, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(path, f"expected an integer, got {_describe(value)}")
    if lo is not None and value < lo:
        _fail(path, f"must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        _fail(path, f"must be <= {hi}, got {value}")
    return value


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        _fail(path, f"expected true or false, got {_describe(value)}")
    return value


def _number(value: object, path: str) -> float:
    """A finite int or float, as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        _fail(path, f"expected a number, got {_describe(value)}")
    try:
        number = float(value)
    except OverflowError:
        _fail(path, f"{_short(value)} is too large")
    if not math.isfinite(number):
        _fail(path, f"must be a finite number, got {value}")
    return number


def _enum(value: object, path: str, cls: type[E]) -> E:
    if isinstance(value, str) and value in cls._value2member_map_:
        return cls(value)
    _fail(path, f"must be one of {', '.join(m.value for m in cls)}, got {_describe(value)}")


def _required(spec: Mapping[str, Any], key: str, path: str, hint: str) -> Any:
    if key not in spec:
        _fail(_at(path, key), f"required: {hint}")
    return spec[key]


# == names =======================================================================================
def _name(value: object, path: str, pattern: re.Pattern[str], max_len: int, rule: str) -> str:
    """A non-empty string of at most `max_len` characters that fully matches `pattern`."""
    text = _str(value, path)
    if not text:
        _fail(path, "must not be empty")
    if len(text) > max_len:
        _fail(path, f"longer than {max_len} characters ({len(text)})")
    if not pattern.fullmatch(text):
        _fail(path, f"{text!r} is not valid: {rule}")
    return text


def generated_job_id(submission_id: str = "") -> str:
    """The id of a job whose spec names none: "job-<12 hex>", random, or with a submission id a
    digest of it. So every retry of a submission that names no id gets the same one, and the
    dispatcher tells it from an id the client chose (dispatcher.same_request)."""
    if submission_id:
        return f"job-{hashlib.sha256(submission_id.encode()).hexdigest()[:12]}"
    return f"job-{uuid.uuid4().hex[:12]}"


def _job_id(value: object, path: str, submission_id: str, new: bool) -> str:
    """The id a spec names (or one generated). A new job's must start with a letter or digit, as a
    Kubernetes name does: "-x" would read as an option on the command line (gosched get -x), "." and
    ".." as folders. One read back (`new` false) may be of a job taken before that rule."""
    if value is _MISSING:
        return generated_job_id(submission_id)
    rule = "start with a letter or digit, then use letters, digits, '.', '_' and '-'"
    return _name(value, path, _ID if new else _OLD_ID, MAX_ID_LEN, rule)


def _queue_name(value: object, path: str) -> str:
    rule = "lowercase letters, digits, '-', '_', '.', starting and ending with a letter or digit"
    return _name(value, path, _QUEUE_NAME, MAX_NAME_LEN, rule)


def _label_name(value: object, path: str, max_len: int = MAX_NAME_LEN) -> str:
    rule = "letters, digits, '-', '_', '.', starting and ending with a letter or digit"
    return _name(value, path, _LABEL_NAME, max_len, rule)


def label_key_problem(key: str, what: str = "label key") -> str | None:
    """Why `key` is not a Kubernetes label key (optional DNS-subdomain prefix + "/" + name), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"{what} {key!r}: prefix {prefix!r} is not a DNS subdomain (lowercase, dot-separated)"
    if not name or len(name) > MAX_NAME_LEN or not _LABEL_NAME.fullmatch(name):
        return (
            f"{what} {key!r}: the name must be 1-63 characters of letters, digits, '-', '_', '.', "
            "starting and ending with a letter or digit"
        )
    return None


def _label_value_problem(value: str) -> str | None:
    if value and (len(value) > MAX_NAME_LEN or not _LABEL_NAME.fullmatch(value)):
        return (
            f"label value {value!r} must be empty or 1-63 characters of letters, digits, '-', '_', '.', "
            "starting and ending with a letter or digit"
        )
    return None


def _label_key(value: object, path: str) -> str:
    key = _str(value, path)
    if problem := label_key_problem(key):
        _fail(path, problem)
    return key


def _label_value(value: object, path: str) -> str:
    text = _str(value, path)
    if problem := _label_value_problem(text):
        _fail(path, problem)
    return text


def _labels(value: object, path: str) -> tuple[tuple[str, str], ...]:
    """A label mapping as pairs sorted by key (the model's canonical form)."""
    pairs = []
    for key, text in _mapping(value, path).items():
        where = _entry(path, key)
        if problem := label_key_problem(key):
            _fail(where, problem)
        pairs.append((key, _label_value(text, where)))
    return tuple(sorted(pairs))


# == quantities ==================================================================================
def _quantity(parse: Callable[[Any, str], int], value: object, path: str, limit: int, limit_text: str) -> int:
    """`parse(value)` with every failure as a SpecError, and at most `limit`."""
    what = re.sub(r"\[.*?\]", "", path).rpartition(".")[2]  # "groups[0].resources.cpu" -> "cpu"
    if isinstance(value, float) and not math.isfinite(value):
        _fail(path, f"{value} is not a quantity")
    if isinstance(value, str) and value.strip().startswith("-"):
        _fail(path, f"{_short(value)} is negative")
    try:
        amount = parse(value, what)
    except QuantityError as exc:
        _fail(path, str(exc))
    except (ValueError, OverflowError):  # quantity.py lets float overflow escape as these
        _fail(path, f"{_short(value)} is too large")
    if amount > limit:
        _fail(path, f"{_short(value)} is more than {limit_text}")
    return amount


def _exact_milli(value: object, path: str, limit: int, limit_text: str, unit: str) -> int:
    """A milli quantity that must be a whole number of milli: parse_milli rounds ("0.9999" GPU -> 1 GPU,
    "0.0001" core -> 0), which would silently change what was asked for."""
    milli = _quantity(parse_milli, value, path, limit, limit_text)
    # _quantity accepted `value`, so it is an int, a finite float or a number string with "" or "m"
    if isinstance(value, str):
        text = value.strip()
        exact = Decimal(text.removesuffix("m")) * (1 if text.endswith("m") else 1000)
    elif isinstance(value, float):
        exact = Decimal(repr(value)) * 1000  # as quantity.py reads a float: its shortest repr
    elif isinstance(value, int):
        exact = Decimal(value) * 1000
    else:  # pragma: no cover - parse_milli refuses every other type
        _fail(path, f"expected a quantity, got {_describe(value)}")
    if exact != milli:
        if exact < 1:
            _fail(path, f"{_short(value)} is less than 0.001 {unit} (1 milli), the smallest amount")
        _fail(path, f"{_short(value)} is not a whole number of milli-{unit} (steps of 0.001)")
    return milli


def _cpu(value: object, path: str) -> int:
    return _exact_milli(value, path, MAX_CPU_MILLI, "100000 cores", "core")


def _memory(value: object, path: str) -> int:
    return _quantity(parse_bytes, value, path, MAX_MEMORY, "1Pi")


def _gpus(value: object, path: str) -> tuple[int, int]:
    """`gpus` as (whole GPUs, milli share): 2 -> (2, 0); "0.5" -> (0, 500); 1.5 is refused."""
    milli = _exact_milli(value, path, MAX_GPUS * GPU_MILLI, f"{MAX_GPUS} GPUs (the most a node holds)", "GPU")
    if milli % GPU_MILLI == 0:
        return milli // GPU_MILLI, 0
    if milli < GPU_MILLI:
        return 0, milli
    _fail(path, f"{value!r}: a fraction of a GPU must be below 1 (ask for whole GPUs or a share of one)")


def _share(milli: int, value: object, path: str) -> int:
    if milli < 1:
        _fail(path, f"{value!r} is less than 0.001 GPU (1 milli)")
    return milli


def _gpu_memory_mib(entries: Mapping[str, tuple[Any, str]], keys: tuple[str, str], round_up: bool) -> int:
    """GPU memory in MiB from a quantity key or a MiB key (at most one of `keys`); 0 if neither.

    A request rounds up (it is a floor the GPU must meet), a node's capacity rounds down.
    """
    given = [k for k in keys if k in entries]
    if not given:
        return 0
    if len(given) == 2:
        _fail(entries[keys[1]][1], f"give {keys[0]} or {keys[1]}, not both")
    value, path = entries[given[0]]
    if given[0] == keys[1]:
        return _quantity(
            parse_count, value, path, MAX_GPU_MEMORY // MIB, f"{MAX_GPU_MEMORY // MIB} MiB (1Ti)"
        )
    amount = _quantity(parse_bytes, value, path, MAX_GPU_MEMORY, "1Ti")
    return -(-amount // MIB) if round_up else amount // MIB


def _extended(value: object, path: str) -> tuple[tuple[str, int], ...]:
    pairs = []
    for name, amount in _mapping(value, path).items():
        where = _entry(path, name)
        if problem := label_key_problem(name, "resource name"):
            _fail(where, problem)
        pairs.append((name, _quantity(parse_count, amount, where, MAX_EXTENDED, f"{MAX_EXTENDED}")))
    return tuple(sorted(pairs))


def builtin_resource_problem(name: str, *, node: bool = False) -> str | None:
    """Why `name` cannot be an extended resource (it is one a node has built in), or None; told
    to a job (which asks for it by its field), or to a `node` (which gives it by its field)."""
    field = BUILTIN_RESOURCES.get(name.lower())
    if field is None:
        return None
    how = f"a node gives it as {field}" if node else f"ask for it with {field} ({_BUILTIN_EXAMPLES[field]})"
    return f"{name} is a built-in resource, not an extended one: {how}"


def _refuse_builtin(extended: tuple[tuple[str, int], ...], path: str, *, node: bool = False) -> None:
    for name, _ in extended:
        if problem := builtin_resource_problem(name, node=node):
            _fail(_entry(path, name), problem)


# == task groups =================================================================================
def _resource_entries(group: Mapping[str, Any], path: str) -> dict[str, tuple[Any, str]]:
    """Resource keys, from `resources` and from the group itself, each with the path it was given at."""
    res_path = _at(path, "resources")
    entries: dict[str, tuple[Any, str]] = {}
    if "resources" in group:
        for key, value in _mapping(group["resources"], res_path, _RESOURCE_KEYS).items():
            entries[key] = (value, _at(res_path, key))
    for key in sorted(_RESOURCE_KEYS & group.keys()):
        if key in entries:
            _fail(_at(path, key), f"given twice: here and in {res_path}")
        entries[key] = (group[key], _at(path, key))
    return entries


def _gpu_request(entries: Mapping[str, tuple[Any, str]]) -> tuple[int, int]:
    """(whole GPUs, milli share) from gpus / gpu_share / gpu_milli: one share at most, never both kinds."""
    whole, share, share_from = 0, 0, ""
    if "gpus" in entries:
        whole, share = _gpus(*entries["gpus"])
        share_from = "gpus" if share else ""
    for key in ("gpu_share", "gpu_milli"):
        if key not in entries:
            continue
        value, path = entries[key]
        if share_from:
            _fail(path, f"a GPU share is already given by {share_from}")
        if whole:
            _fail(path, "cannot combine whole GPUs (gpus) with a share of one GPU")
        limit, limit_text = GPU_MILLI - 1, "0.999 GPU (999 milli)"
        if key == "gpu_share":
            milli = _exact_milli(value, path, limit, limit_text, "GPU")
        else:
            milli = _quantity(parse_count, value, path, limit, limit_text)
        share = _share(milli, value, path)
        share_from = key
    return whole, share


def _resources(group: Mapping[str, Any], path: str, new: bool) -> ResourceRequest:
    entries = _resource_entries(group, path)
    cpu = _cpu(*entries["cpu"]) if "cpu" in entries else 0
    memory = _memory(*entries["memory"]) if "memory" in entries else 0
    gpus, gpu_milli = _gpu_request(entries)
    gpu_memory = _gpu_memory_mib(entries, ("gpu_memory", "gpu_memory_mib"), round_up=True)
    if gpu_memory and not (gpus or gpu_milli):
        key = "gpu_memory" if "gpu_memory" in entries else "gpu_memory_mib"
        _fail(entries[key][1], "needs a GPU request (gpus, gpu_share or gpu_milli)")
    extended = _extended(*entries["extended"]) if "extended" in entries else ()
    if new and "extended" in entries:
        _refuse_builtin(extended, entries["extended"][1])
    if not (cpu or memory or gpus or gpu_milli):
        _fail(_at(path, "resources"), "requests nothing: ask for cpu, memory or GPUs")
    return ResourceRequest(cpu, memory, gpus, gpu_milli, gpu_memory, extended)


def _command(value: object, path: str) -> tuple[str, ...]:
    if value is _MISSING:
        _fail(path, "required: the program to run and its arguments")
    if isinstance(value, str):
        if problem := _text_problem(value):  # checked before splitting, which would keep it in a word
            _fail(path, problem)
        try:
            argv = shlex.split(value)
        except ValueError as exc:  # unbalanced quotes
            _fail(path, f"cannot split {value!r}: {exc}")
    else:
        items = _list(value, path, "a string or a list of strings")
        argv = [_str(arg, _item(path, i)) for i, arg in enumerate(items)]
    if not argv or not argv[0]:
        _fail(path, "must not be empty: give the program to run")
    for i, arg in enumerate(argv):
        _within_exec_limit(arg, _item(path, i) if not isinstance(value, str) else path)
    return tuple(argv)


def _within_exec_limit(text: str, path: str) -> None:
    size = len(text.encode())
    if size > MAX_ARG_BYTES:
        _fail(
            path,
            f"{size} bytes: one argument or variable may be at most {MAX_ARG_BYTES} (Linux's exec limit)",
        )


def _image(value: object, path: str) -> str:
    """A container image reference ("" for none): no blanks, and not an option for the runtime."""
    image = _str(value, path, MAX_TEXT_LEN)
    if image and (image.startswith("-") or any(c.isspace() for c in image)):
        _fail(path, f"{_short(image)} is not an image reference (e.g. 'python:3.12', 'ghcr.io/org/app:1')")
    return image


def _env(value: object, path: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for name, text in _mapping(value, path).items():
        where = _entry(path, name)
        if problem := _text_problem(name):  # the regex below would refuse it too, with a vaguer reason
            _fail(where, f"name {problem}")
        if not _ENV_NAME.fullmatch(name):
            _fail(where, f"{name!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        pairs.append((name, _str(text, where)))
        _within_exec_limit(f"{name}={pairs[-1][1]}", where)
    return tuple(sorted(pairs))


def _gpu_models(value: object, path: str) -> tuple[str, ...]:
    models: list[str] = []
    for i, item in enumerate(_list(value, path)):
        model = _str(item, _item(path, i), MAX_TEXT_LEN)
        if not model:
            _fail(_item(path, i), "must not be empty")
        if model in models:
            _fail(_item(path, i), f"duplicate model {model!r}")
        models.append(model)
    return tuple(models)


def _gpu_topology(value: object, path: str, resources: ResourceRequest) -> GpuTopologyMode:
    mode = _enum(value, path, GpuTopologyMode)
    # A required mode on a task asking no GPU is a mistake (it would have nothing to hold to). On
    # one GPU or a share of one it is met by any GPU, and accepted: a template whose GPU count
    # varies keeps its mode, and the rule binds whenever the count reaches two.
    if mode is not GpuTopologyMode.PREFERRED and not resources.wants_gpu:
        _fail(path, f"{mode.value} needs a GPU request (gpus, gpu_share or gpu_milli)")
    return mode


def _requirement(value: object, path: str) -> Requirement:
    spec = _mapping(value, path, {"key", "operator", "values"})
    key = _label_key(_required(spec, "key", path, "the node label to test"), _at(path, "key"))
    ops = ", ".join(SelectorOp)
    op = _enum(_required(spec, "operator", path, f"one of {ops}"), _at(path, "operator"), SelectorOp)
    values_path = _at(path, "values")
    values = _list(spec.get("values", []), values_path)
    if op in (SelectorOp.IN, SelectorOp.NOT_IN):
        if not values:
            _fail(values_path, f"{op} needs at least one value")
        return Requirement(
            key, op, tuple(_label_value(v, _item(values_path, i)) for i, v in enumerate(values))
        )
    if op in (SelectorOp.EXISTS, SelectorOp.DOES_NOT_EXIST):
        if values:
            _fail(values_path, f"{op} takes no values")
        return Requirement(key, op)
    if len(values) != 1:
        _fail(values_path, f"{op} takes exactly one integer value, got {len(values)}")
    return Requirement(key, op, (_integer_text(values[0], _item(values_path, 0)),))


def _integer_text(value: object, path: str) -> str:
    """An int or an integer string, as the canonical decimal string Requirement.values holds."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and _INTEGER.fullmatch(value):
        return str(int(value))
    _fail(path, f"expected an integer, got {_describe(value)}")


def _term(value: object, path: str) -> NodeSelectorTerm:
    items = _list(value, path)
    if not items:
        _fail(path, "an empty term matches no node: give at least one requirement")
    return NodeSelectorTerm(tuple(_requirement(r, _item(path, i)) for i, r in enumerate(items)))


def _preferred(value: object, path: str) -> PreferredTerm:
    spec = _mapping(value, path, {"weight", "match"})
    weight = _int(_required(spec, "weight", path, "1..100"), _at(path, "weight"), 1, 100)
    match = _required(spec, "match", path, "a list of requirements")
    return PreferredTerm(weight, _term(match, _at(path, "match")))


def _affinity(value: object, path: str) -> tuple[tuple[NodeSelectorTerm, ...], tuple[PreferredTerm, ...]]:
    spec = _mapping(value, path, {"required", "preferred"})
    req_path, pref_path = _at(path, "required"), _at(path, "preferred")
    required = tuple(
        _term(t, _item(req_path, i)) for i, t in enumerate(_list(spec.get("required", []), req_path))
    )
    preferred = tuple(
        _preferred(p, _item(pref_path, i)) for i, p in enumerate(_list(spec.get("preferred", []), pref_path))
    )
    return required, preferred


def _anti_affinity(value: object, path: str) -> AntiAffinity:
    spec = _mapping(value, path, {"topology_key", "match_labels"})
    topology_key = spec.get("topology_key", "node")
    if topology_key != "node":  # "node" means the node itself; anything else is a node label
        topology_key = _label_key(topology_key, _at(path, "topology_key"))
    return AntiAffinity(topology_key, _labels(spec.get("match_labels", {}), _at(path, "match_labels")))


def _toleration(value: object, path: str) -> Toleration:
    spec = _mapping(value, path, {"key", "operator", "value", "effect"})
    key = _str(spec.get("key", ""), _at(path, "key"))
    if key:
        _label_key(key, _at(path, "key"))
    operator = spec.get("operator", "Equal")
    if operator not in ("Equal", "Exists"):
        _fail(_at(path, "operator"), f"must be Equal or Exists, got {_describe(operator)}")
    text = _label_value(spec.get("value", ""), _at(path, "value"))
    if operator == "Equal" and not key:
        _fail(_at(path, "key"), "required with operator Equal (Exists with no key tolerates every taint)")
    if operator == "Exists" and text:
        _fail(_at(path, "value"), "operator Exists takes no value")
    effect = spec.get("effect")
    return Toleration(
        key, operator, text, None if effect is None else _enum(effect, _at(path, "effect"), TaintEffect)
    )


def _items(value: object, path: str, parse: Callable[[object, str], Any]) -> tuple[Any, ...]:
    return tuple(parse(item, _item(path, i)) for i, item in enumerate(_list(value, path)))


def _group(spec: Mapping[str, Any], path: str, new: bool) -> TaskGroup:
    """One task group from a mapping whose keys are already checked (a group, or the flat job).
    `new`: of a job being submitted, held to the rules of a new one (see job_from_spec)."""
    required, preferred = (
        _affinity(spec["affinity"], _at(path, "affinity")) if "affinity" in spec else ((), ())
    )
    # In the order of the fields: the first bad one is the one reported.
    role = _label_name(spec.get("role", "main"), _at(path, "role"))
    replicas = _int(spec.get("replicas", 1), _at(path, "replicas"), 1, MAX_REPLICAS)
    resources = _resources(spec, path, new)
    command = _command(spec.get("command", _MISSING), _at(path, "command"))
    env = _env(spec.get("env", {}), _at(path, "env"))
    size = sum(len(a.encode()) + 1 for a in command) + sum(len(n) + len(v.encode()) + 2 for n, v in env)
    if size > MAX_ARGV_ENV_BYTES:
        _fail(_at(path, "command"), f"command and env take {size} bytes; at most {MAX_ARGV_ENV_BYTES}")
    return TaskGroup(
        role=role,
        replicas=replicas,
        resources=resources,
        command=command,
        env=env,
        gpu_models=_gpu_models(spec.get("gpu_models", []), _at(path, "gpu_models")),
        gpu_topology=_gpu_topology(
            spec.get("gpu_topology", GpuTopologyMode.PREFERRED.value), _at(path, "gpu_topology"), resources
        ),
        node_selector=_labels(spec.get("node_selector", {}), _at(path, "node_selector")),
        required_affinity=required,
        preferred_affinity=preferred,
        anti_affinity=_items(spec.get("anti_affinity", []), _at(path, "anti_affinity"), _anti_affinity),
        tolerations=_items(spec.get("tolerations", []), _at(path, "tolerations"), _toleration),
        image=_image(spec.get("image", ""), _at(path, "image")),
    )


def group_from_spec(spec: object, path: str) -> TaskGroup:
    """One task group of a job spec (as under "groups"); `path` prefixes the fields in errors. It may
    be of a job read back, so the rules of new jobs are left to `job_from_spec` (given `now`)."""
    return _group(_mapping(spec, path, _GROUP_KEYS), path, new=False)


def _groups(value: object, path: str) -> tuple[TaskGroup, ...]:
    items = _list(value, path)
    if not items:
        _fail(path, "needs at least one group")
    groups: list[TaskGroup] = []
    for i, item in enumerate(items):
        where = _item(path, i)
        group = _group(_mapping(item, where, _GROUP_KEYS), where, new=True)
        for j, other in enumerate(groups):
            if other.role == group.role:
                _fail(_at(where, "role"), f"duplicate role {group.role!r} (also {_item(path, j)})")
        groups.append(group)
    return tuple(groups)


# == jobs ========================================================================================
RELATIVE_WITH_SUBMISSION_ID = (
    "is counted from now, a new moment at every retry, so a retry under the submission_id would "
    "not repeat the request: give a time (ISO-8601 or unix seconds)"
)


def is_relative_deadline(value: object) -> bool:
    """Whether a spec's deadline is written from now ("now+6h")."""
    return isinstance(value, str) and value.strip().lower().startswith("now+")


def _deadline(value: object, path: str, now: float | None) -> float | None:
    if value is None:
        return None
    moment: datetime | None = None
    if isinstance(value, datetime):  # YAML reads an unquoted ISO time (2030-01-01T00:00:00Z) as one
        moment = value
    elif isinstance(value, date):  # and an unquoted date (2030-01-01) as this: its midnight
        moment = datetime(value.year, value.month, value.day)
    elif is_relative_deadline(value):  # Slurm's now+<count><unit>
        assert isinstance(value, str)
        base = time.time() if now is None else now
        # now+3600 is seconds, as Slurm's --deadline reads it.
        return _deadline(base + _duration_text(value.strip()[4:], path, bare_seconds=True), path, now)
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            hint = "give unix seconds as a number, or now+DURATION as now+2h"
            _fail(path, f"{_short(value)} is not an ISO-8601 time ({hint})")
    if moment is not None:
        if moment.tzinfo is None:  # a zone-less time or date is read as UTC, not as this machine's zone
            moment = moment.replace(tzinfo=UTC)
        deadline = moment.timestamp()
    else:
        if isinstance(value, bool) or not isinstance(value, int | float):
            _fail(path, f"expected an ISO-8601 time, unix seconds or now+DURATION, got {_describe(value)}")
        deadline = _number(value, path)
    if deadline <= 0:
        _fail(path, f"must be after 1970-01-01, got {value!r}")
    # Checked at submission only (`now` given), as the one below: a job taken before either check
    # must stay readable (clients read jobs back through this function).
    if now is not None and deadline > MAX_DEADLINE:
        _fail(path, f"{_short(value)} is past 9999-12-31T23:59:59Z, the latest time a deadline may be")
    if now is not None and deadline <= now:
        _fail(path, f"{value!r} is not in the future (now is {format_moment(now)})")
    return deadline


_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_SECONDS = re.compile(r"\d+(?:\.\d+)?")
_UNITS = re.compile(r"(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")
# Slurm's --time forms that have a colon or a day: MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_CLOCK = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def _time_limit(value: object, path: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        seconds = _duration_text(value.strip(), path)
    elif isinstance(value, bool) or not isinstance(value, int | float):
        _fail(path, f"expected a number of seconds or a duration (1h30m), got {_describe(value)}")
    else:
        seconds = _number(value, path)
    if seconds <= 0:
        _fail(path, f"must be more than 0 seconds, got {value!r}")
    if seconds > MAX_TIME_LIMIT:
        _fail(path, f"{_short(value)} is over 365 days, the longest time limit")
    return seconds


def _duration_text(text: str, path: str, bare_seconds: bool = False) -> float:
    """A duration written as text, in seconds: "1h30m", "01:30:00", "2-12:30"; a negative one
    refused. A bare number ("90") is seconds only with `bare_seconds` (a deadline's now+90, as
    Slurm's): as a time limit it is refused, since Slurm's --time reads it as minutes and a spec's
    number is seconds; the message says how to write either."""
    if text.startswith("-"):
        try:
            _duration_text(text[1:].strip(), path, bare_seconds=True)  # a duration, however written
        except SpecError:
            pass  # not a negative duration either: said below
        else:
            _fail(path, f"must be more than 0 seconds, got {_short(text)}")
    if _SECONDS.fullmatch(text):
        if bare_seconds or float(text) == 0:  # 0 is 0 in any unit: the caller says it is too short
            return float(text)
        minutes = float(text) / 60
        _fail(
            path,
            f"{_short(text)} is a bare number, which Slurm reads as minutes and a spec's number as "
            f"seconds: write {text}s for seconds, or {minutes:g}m as Slurm would read it",
        )
    units = _UNITS.fullmatch(text)
    if text and units is not None and any(units.groups()):
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in zip(units.groups(), "dhms", strict=True) if n)
    clock = _CLOCK.fullmatch(text)
    if clock is not None and (":" in text or "-" in text):
        days, first, second, third = clock.groups()
        if days is not None:  # D-HH[:MM[:SS]]
            parts = [int(days) * 24 + int(first), int(second or 0), int(third or 0)]
        elif third is not None:  # HH:MM:SS
            parts = [int(first), int(second), int(third)]
        else:  # MM:SS
            parts = [0, int(first), int(second)]
        if parts[1] > 59 or parts[2] > 59:
            _fail(path, f"{_short(text)}: minutes and seconds go up to 59")
        return float(parts[0] * 3600 + parts[1] * 60 + parts[2])
    hint = "one with a unit (3600s, 45m, 2h, 1d, 1h30m) or HH:MM:SS (in a spec, a number is seconds)"
    _fail(path, f"{_short(text)} is not a duration: give {hint}")


def format_duration(seconds: float) -> str:
    """A time limit as a spec writes it: "1h30m", "45s", "1d2h"; fractions of a second as "0.5s"."""
    whole = int(seconds)
    if whole != seconds or whole == 0:
        return f"{seconds:g}s"
    out = []
    for unit, size in _UNIT_SECONDS.items():
        count, whole = divmod(whole, size)
        if count:
            out.append(f"{count}{unit}")
    return "".join(out)


def format_moment(t: float) -> str:
    """A unix time as ISO-8601 UTC to the second; past datetime's range (a deadline stored before
    specs refused those), the number itself."""
    try:
        return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return f"{t!r} (unix seconds)"


def _submit_time(value: object, path: str, now: float | None) -> float:
    """A client's submit_time: within the clock skew of now. The dispatcher stamps its own clock in
    any case; a time far off says the client expects it to count (a replay, a backdated job), and
    it would not."""
    t = _number(value, path)
    if t < 0:
        _fail(path, f"must be >= 0, got {value!r}")
    if now is not None and t > now + MAX_CLOCK_SKEW_S:
        at = format_moment(now)
        _fail(path, f"{_short(value)} is in the future (now is {at}); omit it to use the current time")
    if now is not None and t < now - MAX_CLOCK_SKEW_S:
        _fail(
            path,
            f"{_short(value)} is in the past (now is {format_moment(now)}): the server stamps the time it "
            "accepts a job, which may not be backdated; omit it",
        )
    return t


def job_from_spec(
    spec: Mapping[str, Any],
    *,
    known_queues: Collection[str] | None = None,
    now: float | None = None,
    groups: tuple[TaskGroup, ...] | None = None,
) -> Job:
    """Validate an external job spec (see the module docstring) and build the Job; SpecError if invalid.

    `groups`: task groups already validated (e.g. remembered from an identical earlier spec); the
    spec then holds the job-level fields only, and the checks across groups still run here.

    Some rules hold for new jobs only (ids starting with a letter or digit, no built-in resource
    under `extended`), so that a job taken before them stays readable: they apply to a spec read
    whole (a file, a client's own check before it submits) and, given `now`, to one submitted. A
    job read back (api/convert.job_from_proto: its groups given, no `now`) is spared them.
    """
    new = groups is None or now is not None
    if groups is not None:
        root = _mapping(spec, "", _JOB_KEYS)
        for i, group in enumerate(groups):
            for j in range(i):
                if groups[j].role == group.role:
                    where = _at(_item("groups", i), "role")
                    _fail(where, f"duplicate role {group.role!r} (also groups[{j}])")
            extended = group.resources.extended
            if new and extended:  # the path as a JobSpec message holds them (api/convert reads its groups)
                _refuse_builtin(extended, f"groups[{i}].resources.extended")
    elif isinstance(spec, Mapping) and "groups" in spec:
        misplaced = sorted(_GROUP_KEYS & spec.keys())
        if misplaced:
            _fail(misplaced[0], "a task field at the top level next to 'groups': move it into a group")
        root = _mapping(spec, "", _JOB_KEYS | {"groups"})
        groups = _groups(root["groups"], "groups")
    else:  # flat form: the job is its one group
        root = _mapping(spec, "", _JOB_KEYS | _GROUP_KEYS)
        groups = (_group(root, "", new=True),)

    queue = _queue_name(root.get("queue", DEFAULT_QUEUE), "queue")
    if known_queues is not None and queue not in known_queues:
        # A JobSpec message always names one: "default" there is most likely a job that named none.
        unnamed = f": {NO_DEFAULT_QUEUE}" if queue == DEFAULT_QUEUE else ""
        _fail("queue", f"unknown queue {queue!r}{unnamed} (known: {', '.join(sorted(known_queues))})")
    total = sum(g.replicas for g in groups)
    if total > MAX_TASKS_PER_JOB:
        _fail("groups", f"{total} tasks in all; a job holds at most {MAX_TASKS_PER_JOB} (split it into jobs)")
    min_member = _int(root.get("min_member", 1), "min_member", lo=1)
    if min_member > total:
        _fail("min_member", f"min_member {min_member} > total replicas {total}")
    budget = root.get("disruption_budget")
    if "submit_time" in root:
        submit_time = _submit_time(root["submit_time"], "submit_time", now)
    else:
        submit_time = time.time() if now is None else now
    submission_id = _str(root.get("submission_id", ""), "submission_id", MAX_ID_LEN)
    if submission_id and is_relative_deadline(root.get("deadline")):
        _fail("deadline", f"{root['deadline']!r} {RELATIVE_WITH_SUBMISSION_ID}")
    return Job(
        id=_job_id(root.get("id", _MISSING), "id", submission_id, new),
        groups=groups,
        tenant=_queue_name(root.get("tenant", "default"), "tenant"),
        queue=queue,
        priority=_int(root.get("priority", 0), "priority", -MAX_PRIORITY, MAX_PRIORITY),
        min_member=min_member,
        preemptible=_bool(root.get("preemptible", True), "preemptible"),
        deadline=_deadline(root.get("deadline"), "deadline", now),
        kind=_enum(root.get("kind", "batch"), "kind", JobKind),
        labels=_labels(root.get("labels", {}), "labels"),
        disruption_budget=None if budget is None else _int(budget, "disruption_budget", lo=0),
        submit_time=submit_time,
        submission_id=submission_id,
        time_limit=_time_limit(root.get("time_limit"), "time_limit"),
        max_retries=_int(root.get("max_retries", 0), "max_retries", 0, MAX_RETRIES),
    )


# == job -> spec =================================================================================
def _resources_to_spec(r: ResourceRequest) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if r.cpu_milli:
        out["cpu"] = format_milli(r.cpu_milli)
    if r.memory:
        out["memory"] = r.memory  # plain bytes: exact, unlike a rounded "1.5Gi"
    if r.gpus:
        out["gpus"] = r.gpus
    if r.gpu_milli:
        out["gpu_milli"] = r.gpu_milli
    if r.gpu_memory_mib:
        out["gpu_memory_mib"] = r.gpu_memory_mib
    if r.extended:
        out["extended"] = dict(r.extended)
    return out


def _requirement_to_spec(r: Requirement) -> dict[str, Any]:
    out: dict[str, Any] = {"key": r.key, "operator": r.op.value}
    if r.values:
        out["values"] = list(r.values)
    return out


def _term_to_spec(term: NodeSelectorTerm) -> list[dict[str, Any]]:
    return [_requirement_to_spec(r) for r in term.requirements]


def _toleration_to_spec(t: Toleration) -> dict[str, Any]:
    out: dict[str, Any] = {"key": t.key, "operator": t.operator, "value": t.value}
    if t.effect is not None:
        out["effect"] = t.effect.value
    return out


def _group_to_spec(g: TaskGroup) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": g.role,
        "replicas": g.replicas,
        "command": list(g.command),
        "resources": _resources_to_spec(g.resources),
    }
    if g.env:
        out["env"] = dict(g.env)
    if g.gpu_models:
        out["gpu_models"] = list(g.gpu_models)
    if g.gpu_topology is not GpuTopologyMode.PREFERRED:
        out["gpu_topology"] = g.gpu_topology.value
    if g.node_selector:
        out["node_selector"] = dict(g.node_selector)
    affinity: dict[str, Any] = {}
    if g.required_affinity:
        affinity["required"] = [_term_to_spec(t) for t in g.required_affinity]
    if g.preferred_affinity:
        affinity["preferred"] = [
            {"weight": p.weight, "match": _term_to_spec(p.term)} for p in g.preferred_affinity
        ]
    if affinity:
        out["affinity"] = affinity
    if g.anti_affinity:
        out["anti_affinity"] = [
            {"topology_key": a.topology_key, "match_labels": dict(a.match_labels)} for a in g.anti_affinity
        ]
    if g.tolerations:
        out["tolerations"] = [_toleration_to_spec(t) for t in g.tolerations]
    if g.image:
        out["image"] = g.image
    return out


def job_to_spec(job: Job) -> dict[str, Any]:
    """The spec of a job (plain JSON/YAML-friendly values); `job_from_spec` turns it back into `job`."""
    spec: dict[str, Any] = {
        "id": job.id,
        "tenant": job.tenant,
        "queue": job.queue,
        "priority": job.priority,
        "min_member": job.min_member,
        "preemptible": job.preemptible,
        "kind": job.kind.value,
        "submit_time": job.submit_time,
        "groups": [_group_to_spec(g) for g in job.groups],
    }
    if job.deadline is not None:
        spec["deadline"] = job.deadline
    if job.labels:
        spec["labels"] = dict(job.labels)
    if job.disruption_budget is not None:
        spec["disruption_budget"] = job.disruption_budget
    if job.submission_id:
        spec["submission_id"] = job.submission_id
    if job.time_limit is not None:
        spec["time_limit"] = job.time_limit  # seconds: exact, as "1h30m" would be for whole ones only
    if job.max_retries:
        spec["max_retries"] = job.max_retries
    return spec


# == nodes =======================================================================================
def _gpu(value: object, path: str, position: int) -> Gpu:
    spec = _mapping(value, path, _GPU_KEYS)
    entries = {k: (v, _at(path, k)) for k, v in spec.items()}
    return Gpu(
        index=_int(spec.get("index", position), _at(path, "index"), 0, MAX_GPUS - 1),
        uuid=_str(spec.get("uuid", ""), _at(path, "uuid"), MAX_TEXT_LEN),
        model=_str(spec.get("model", ""), _at(path, "model"), MAX_TEXT_LEN),
        memory_mib=_gpu_memory_mib(entries, ("memory", "memory_mib"), round_up=False),
        numa_node=_int(spec.get("numa_node", -1), _at(path, "numa_node"), -1, 1023),
        nvlink_peers=tuple(
            sorted(
                _items(spec.get("nvlink_peers", []), _at(path, "nvlink_peers"), lambda v, p: _int(v, p, 0))
            )
        ),
    )


def _check_gpus(gpus: Sequence[Gpu], path: str) -> None:
    """Indexes and uuids unique; NVLink peers are other GPUs of the node that list this one back."""
    by_index: dict[int, Gpu] = {}
    uuids: dict[str, int] = {}
    for i, gpu in enumerate(gpus):
        where = _item(path, i)
        if gpu.index in by_index:
            _fail(_at(where, "index"), f"duplicate GPU index {gpu.index}")
        if gpu.uuid and gpu.uuid in uuids:
            _fail(_at(where, "uuid"), f"duplicate uuid {gpu.uuid!r} (also GPU {uuids[gpu.uuid]})")
        by_index[gpu.index] = gpu
        uuids[gpu.uuid] = gpu.index
    for i, gpu in enumerate(gpus):
        where = _at(_item(path, i), "nvlink_peers")
        if len(set(gpu.nvlink_peers)) != len(gpu.nvlink_peers):
            _fail(where, "a peer is listed twice")
        for peer in gpu.nvlink_peers:
            if peer == gpu.index:
                _fail(where, f"GPU {gpu.index} cannot be its own peer")
            if peer not in by_index:
                _fail(where, f"no GPU with index {peer} on this node")
            if gpu.index not in by_index[peer].nvlink_peers:  # NVLink is symmetric
                _fail(where, f"GPU {peer} does not list GPU {gpu.index} as a peer")


def _gpu_shorthand(spec: Mapping[str, Any], path: str) -> tuple[Gpu, ...]:
    count = _int(_required(spec, "count", path, "how many GPUs"), _at(path, "count"), 0, MAX_GPUS)
    model = _str(spec.get("model", ""), _at(path, "model"), MAX_TEXT_LEN)
    entries = {k: (v, _at(path, k)) for k, v in spec.items()}
    memory_mib = _gpu_memory_mib(entries, ("memory", "memory_mib"), round_up=False)
    numa_nodes = _int(spec.get("numa_nodes", 0), _at(path, "numa_nodes"), 0, 1024)
    pairs = _bool(spec.get("nvlink_pairs", False), _at(path, "nvlink_pairs"))
    per_numa = -(-count // numa_nodes) if numa_nodes else 0  # spread evenly, as node.make_node does
    return tuple(
        Gpu(
            index=i,
            model=model,
            memory_mib=memory_mib,
            numa_node=i // per_numa if per_numa else -1,
            nvlink_peers=(i ^ 1,) if pairs and (i ^ 1) < count else (),
        )
        for i in range(count)
    )


def _node_gpus(value: object, path: str) -> tuple[Gpu, ...]:
    if isinstance(value, Mapping):
        return _gpu_shorthand(_mapping(value, path, _GPU_SHORTHAND_KEYS), path)
    items = _list(value, path, "a list of GPUs or a mapping (count, model, ...)")
    if len(items) > MAX_GPUS:
        _fail(path, f"{len(items)} GPUs, at most {MAX_GPUS} per node")
    gpus = [_gpu(item, _item(path, i), i) for i, item in enumerate(items)]
    _check_gpus(gpus, path)
    return tuple(sorted(gpus, key=lambda g: g.index))


def _taint(value: object, path: str) -> Taint:
    spec = _mapping(value, path, {"key", "value", "effect"})
    return Taint(
        key=_label_key(_required(spec, "key", path, "the taint's key"), _at(path, "key")),
        value=_label_value(spec.get("value", ""), _at(path, "value")),
        effect=_enum(spec.get("effect", TaintEffect.NO_SCHEDULE.value), _at(path, "effect"), TaintEffect),
    )


def _taints(value: object, path: str) -> tuple[Taint, ...]:
    taints: tuple[Taint, ...] = _items(value, path, _taint)
    for i, taint in enumerate(taints):
        if any((t.key, t.effect) == (taint.key, taint.effect) for t in taints[:i]):
            _fail(_item(path, i), f"duplicate taint {taint.key!r} with effect {taint.effect}")
    return taints


def _positive(amount: int, path: str) -> int:
    if amount <= 0:
        _fail(path, "must be more than 0")
    return amount


def node_from_spec(spec: Mapping[str, Any], *, new: bool = True) -> Node:
    """Validate an external node spec (see the module docstring) and build the Node; SpecError if invalid.
    A `new` node (one registering) may not name a built-in resource under `extended`: the master
    would read it beside the node's own CPUs, memory or GPUs and no task could ask for it. `new=False`
    reads back a node the master already holds (a client's view), which may predate that rule."""
    root = _mapping(spec, "", _NODE_KEYS)
    extended = _extended(root.get("extended", {}), "extended")
    if new:
        _refuse_builtin(extended, "extended", node=True)
    cpu = _required(root, "cpu", "", 'the node\'s cores, e.g. 64 or "63500m"')
    memory = _required(root, "memory", "", "the node's memory, e.g. 512Gi")
    return Node(
        name=_label_name(_required(root, "name", "", "the node's name"), "name", MAX_NODE_NAME_LEN),
        cpu_milli=_positive(_cpu(cpu, "cpu"), "cpu"),
        memory=_positive(_memory(memory, "memory"), "memory"),
        gpus=_node_gpus(root.get("gpus", []), "gpus"),
        labels=_labels(root.get("labels", {}), "labels"),
        taints=_taints(root.get("taints", []), "taints"),
        extended=extended,
        state=_enum(root.get("state", NodeState.READY.value), "state", NodeState),
    )


def gpu_spec(g: Any) -> dict[str, Any]:
    """The spec of one GPU, from a Gpu or anything with its fields (e.g. its protobuf message)."""
    return {
        "index": g.index,
        "uuid": g.uuid,
        "model": g.model,
        "memory_mib": g.memory_mib,
        "numa_node": g.numa_node,
        "nvlink_peers": list(g.nvlink_peers),
    }


def node_to_spec(node: Node) -> dict[str, Any]:
    """The spec of a node; `node_from_spec` turns it back into `node`."""
    spec: dict[str, Any] = {"name": node.name, "cpu": format_milli(node.cpu_milli), "memory": node.memory}
    if node.gpus:
        spec["gpus"] = [gpu_spec(g) for g in node.gpus]
    if node.labels:
        spec["labels"] = dict(node.labels)
    if node.taints:
        spec["taints"] = [{"key": t.key, "value": t.value, "effect": t.effect.value} for t in node.taints]
    if node.extended:
        spec["extended"] = dict(node.extended)
    spec["state"] = node.state.value
    return spec
