"""Hypothesis strategies for valid model objects, in the canonical form `job_from_spec` builds.

Canonical: mapping-like pairs (labels, env, selectors, extended) sorted by key, GPUs sorted by index,
NVLink peers sorted and symmetric, a Gt/Lt value as a plain decimal string.
"""

from hypothesis import strategies as st

from gosched.common.cluster_state import Resident
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
from gosched.common.spec import BUILTIN_RESOURCES

# -- names --------------------------------------------------------------------------------------
# A new job's id starts with a letter or digit (common/spec.py).
job_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}", fullmatch=True)
queue_names = st.from_regex(r"[a-z0-9]([-a-z0-9_.]{0,10}[a-z0-9])?", fullmatch=True)
label_names = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?", fullmatch=True)
label_prefixes = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?(\.[a-z0-9]{1,6}){0,2}", fullmatch=True)
label_keys = st.one_of(label_names, st.builds(lambda p, n: f"{p}/{n}", label_prefixes, label_names))
label_values = st.one_of(st.just(""), label_names)
# An extended resource's name is no built-in one (cpu, memory, gpus...: refused in a job's spec).
extended_names = label_keys.filter(lambda k: k.lower() not in BUILTIN_RESOURCES)
env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
texts = st.text(max_size=12)
finite_times = st.floats(min_value=0.0, max_value=4e9, allow_nan=False, allow_infinity=False)


def sorted_pairs(keys: st.SearchStrategy[str], values: st.SearchStrategy) -> st.SearchStrategy[tuple]:
    return st.dictionaries(keys, values, max_size=3).map(lambda d: tuple(sorted(d.items())))


labels = sorted_pairs(label_keys, label_values)


# -- resources ----------------------------------------------------------------------------------
@st.composite
def resources(draw: st.DrawFn) -> ResourceRequest:
    gpus, gpu_milli = draw(
        st.one_of(
            st.just((0, 0)),
            st.tuples(st.integers(1, 16), st.just(0)),
            st.tuples(st.just(0), st.integers(1, 999)),
        )
    )
    wants_gpu = gpus > 0 or gpu_milli > 0
    cpu = draw(st.integers(0 if wants_gpu else 1, 100_000_000))
    return ResourceRequest(
        cpu_milli=cpu,
        memory=draw(st.integers(0, 2**50)),
        gpus=gpus,
        gpu_milli=gpu_milli,
        gpu_memory_mib=draw(st.integers(0, 2**20)) if wants_gpu else 0,
        extended=draw(sorted_pairs(extended_names, st.integers(0, 10**15))),
    )


# -- placement constraints ----------------------------------------------------------------------
@st.composite
def requirements(draw: st.DrawFn) -> Requirement:
    op = draw(st.sampled_from(SelectorOp))
    if op in (SelectorOp.IN, SelectorOp.NOT_IN):
        values = tuple(draw(st.lists(label_values, min_size=1, max_size=3)))
    elif op in (SelectorOp.GT, SelectorOp.LT):
        values = (str(draw(st.integers(-(10**6), 10**6))),)
    else:
        values = ()
    return Requirement(draw(label_keys), op, values)


terms = st.lists(requirements(), min_size=1, max_size=3).map(lambda rs: NodeSelectorTerm(tuple(rs)))
preferred_terms = st.builds(PreferredTerm, st.integers(1, 100), terms)
anti_affinities = st.builds(AntiAffinity, st.one_of(st.just("node"), label_keys), labels)


@st.composite
def tolerations(draw: st.DrawFn) -> Toleration:
    effect = draw(st.one_of(st.none(), st.sampled_from(TaintEffect)))
    if draw(st.booleans()):
        return Toleration(draw(st.one_of(st.just(""), label_keys)), "Exists", "", effect)
    return Toleration(draw(label_keys), "Equal", draw(label_values), effect)


def small_tuples(elements: st.SearchStrategy) -> st.SearchStrategy[tuple]:
    return st.lists(elements, max_size=2).map(tuple)


# -- jobs ---------------------------------------------------------------------------------------
@st.composite
def task_groups(draw: st.DrawFn, role: str, max_replicas: int = 100_000) -> TaskGroup:
    command = draw(st.lists(texts, min_size=1, max_size=4).filter(lambda argv: argv[0] != ""))
    return TaskGroup(
        role=role,
        replicas=draw(st.one_of(st.integers(1, 8), st.integers(1, max_replicas))),
        resources=draw(resources()),
        command=tuple(command),
        env=draw(sorted_pairs(env_names, texts)),
        gpu_models=tuple(draw(st.lists(st.text(min_size=1, max_size=8), max_size=3, unique=True))),
        node_selector=draw(labels),
        required_affinity=draw(small_tuples(terms)),
        preferred_affinity=draw(small_tuples(preferred_terms)),
        anti_affinity=draw(small_tuples(anti_affinities)),
        tolerations=draw(small_tuples(tolerations())),
        image=draw(st.sampled_from(["", "python:3.12", "ghcr.io/org/app:1.0"])),
    )


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    roles = draw(st.lists(label_names, min_size=1, max_size=3, unique=True))
    # Within the job's limit on tasks over all its groups (common.spec.MAX_TASKS_PER_JOB).
    groups = tuple(draw(task_groups(role, 100_000 // len(roles))) for role in roles)
    total = sum(g.replicas for g in groups)
    return Job(
        id=draw(job_ids),
        groups=groups,
        tenant=draw(queue_names),
        queue=draw(queue_names),
        priority=draw(st.integers(-1_000_000, 1_000_000)),
        min_member=draw(st.integers(1, total)),
        preemptible=draw(st.booleans()),
        deadline=draw(st.one_of(st.none(), st.floats(min_value=1.0, max_value=4e9))),
        kind=draw(st.sampled_from(JobKind)),
        labels=draw(labels),
        disruption_budget=draw(st.one_of(st.none(), st.integers(0, 1000))),
        submit_time=draw(finite_times),
        submission_id=draw(st.text(max_size=20)),
    )


# -- nodes --------------------------------------------------------------------------------------
@st.composite
def gpu_lists(draw: st.DrawFn) -> tuple[Gpu, ...]:
    indexes = sorted(draw(st.sets(st.integers(0, 15), max_size=8)))
    # NVLink: disjoint pairs of the node's GPUs, so that every link is listed from both ends.
    shuffled = draw(st.permutations(indexes))
    pairs = [(a, b) for a, b in zip(shuffled[::2], shuffled[1::2], strict=False) if draw(st.booleans())]
    peers = {a: b for a, b in pairs} | {b: a for a, b in pairs}
    model = draw(st.sampled_from(["A100", "H100", "L4", ""]))
    return tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{i}" if draw(st.booleans()) else "",
            model=model,
            memory_mib=draw(st.integers(0, 2**20)),
            numa_node=draw(st.integers(-1, 3)),
            nvlink_peers=(peers[i],) if i in peers else (),
        )
        for i in indexes
    )


@st.composite
def taint_lists(draw: st.DrawFn) -> tuple[Taint, ...]:
    taints = draw(
        st.lists(st.builds(Taint, label_keys, label_values, st.sampled_from(TaintEffect)), max_size=3)
    )
    return tuple({(t.key, t.effect): t for t in taints}.values())  # (key, effect) unique


nodes = st.builds(
    Node,
    name=label_names,
    cpu_milli=st.integers(1, 100_000_000),
    memory=st.integers(1, 2**50),
    gpus=gpu_lists(),
    labels=labels,
    taints=taint_lists(),
    extended=sorted_pairs(extended_names, st.integers(0, 10**15)),
    state=st.sampled_from(NodeState),
)

# -- residents (for message round-trips) --------------------------------------------------------
gpu_holdings = small_tuples(st.tuples(st.integers(0, 15), st.integers(1, 1000)))
residents = st.builds(
    Resident,
    task_id=st.builds(lambda j, i: f"{j}/{i}", job_ids, st.integers(0, 100)),
    job_id=job_ids,
    cpu_milli=st.integers(0, 10**8),
    memory=st.integers(0, 2**50),
    gpus=gpu_holdings,
    extended=sorted_pairs(label_keys, st.integers(0, 100)),
    priority=st.integers(-(10**6), 10**6),
    preemptible=st.booleans(),
    queue=queue_names,
    tenant=queue_names,
    start_time=finite_times,
    job_labels=labels,
    role=label_names,
    min_member=st.integers(1, 10),
)
