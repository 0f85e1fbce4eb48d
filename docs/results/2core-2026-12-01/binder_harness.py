"""The binder's work per task, as the Ray actor does it: BinderCore.commit of recorded
ProposalBatch bytes (N SchedulingBasic single-task jobs over 10,000 nodes, as bench/actor_bodies.py
`_binder` records them), over an on-disk store that holds the jobs, with its writer process.

    python binder_harness.py N MODE
MODE 0 stops after the set-up, 1 replays the batches, 2 replays them with the harness's own part
(comparing each reply with the reference) done twice. Under callgrind (binder_callgrind.sh), the
instructions per task of the binder's process alone are (2 * I(1) - I(0) - I(2)) / N (the writer
is a child process: callgrind without --trace-children does not count it). MODE ref replays once
and saves the replies (verdict bytes and change-segment bytes) as the reference that modes 1 and 2
check byte for byte.

The batches and the reference live in $BINDER_REF (default /tmp/binder-ref): the batches are
recorded once, the first time (their dispatch times vary from one recording to the next), and the
binder's clock is a fixed sequence, so that the replies of the same code are the same bytes. After
a change to how a ProposalBatch is packed, point $BINDER_REF at a new folder holding only the
starting code's replies-N.pkl: the batches are recorded again from the code at hand, and its
replies compared with the start's (the replies do not depend on the batches' dispatch times).
"""

import gc
import os
import pickle
import sys
import tempfile
from itertools import count
from pathlib import Path
from typing import Any

from gosched.common import wire
from gosched.common.config import Settings
from gosched.common.messages import BindReply, ProposalBatch
from gosched.runtime.pipeline import Pipeline
from gosched.runtime.ray_actors import BinderCore
from gosched.runtime.simulation import basic_jobs, sim_nodes

NODES = 10_000


class _Drop:
    def remote(self, *args: Any) -> None:
        """The binder's report to the dispatcher goes nowhere: only the binder is counted."""


class _NoDispatcher:
    report = _Drop()


def record(n: int, path: Path, tmp: str) -> None:
    """The ProposalBatch bytes of a one-process pipeline over the same jobs (bench/actor_bodies.py)."""
    pipeline = Pipeline(
        Settings(store_path=os.path.join(tmp, "record.db"), shards=1), nodes=sim_nodes(NODES, gpu_every=0)
    )
    recorded: list[bytes] = []
    commit = pipeline.binder.commit

    def recording(batch: ProposalBatch, **kw: Any) -> BindReply:
        recorded.append(wire.pack(batch))
        return commit(batch, **kw)

    setattr(pipeline.binder, "commit", recording)  # noqa: B010
    pipeline.submit_many(basic_jobs(n))
    pipeline.run_until_idle()
    pipeline.store.close()
    path.write_bytes(pickle.dumps(recorded))


n, mode = int(sys.argv[1]), sys.argv[2]
ref_dir = Path(os.environ.get("BINDER_REF", "/tmp/binder-ref"))
ref_dir.mkdir(parents=True, exist_ok=True)
tmp = tempfile.mkdtemp(prefix="binder-harness-")
batches_file = ref_dir / f"batches-{n}.pkl"
replies_file = ref_dir / f"replies-{n}.pkl"
if not batches_file.exists():
    record(n, batches_file, tmp)
batches: list[bytes] = pickle.loads(batches_file.read_bytes())
reference: list[tuple[bytes, list[bytes]]] | None = None
if mode != "ref" and replies_file.exists():
    reference = pickle.loads(replies_file.read_bytes())

core = BinderCore(os.path.join(tmp, "binder.db"), _NoDispatcher(), on_writer_failure=None)
core.add_nodes(sim_nodes(NODES, gpu_every=0))
core.store.add_jobs(basic_jobs(n))  # stored at submission by the dispatcher, as in the running system
core.binder.clock = count(1_767_225_600.0, 0.125).__next__  # the same bind times in every run
gc.collect()
if mode == "ref":
    replies = []
    for data in batches:
        _, verdicts, segments, _, _ = core.commit(data)
        replies.append((verdicts, segments))
    replies_file.write_bytes(pickle.dumps(replies))
    bound = sum(len(a.task_indexes) for v, _ in replies for a in wire.unpack(v).accepted)  # type: ignore[attr-defined]
    print(f"reference saved: {len(replies)} replies, {bound} tasks bound")
    assert bound == n, bound
elif mode != "0":
    same = True
    times = 2 if mode == "2" else 1
    for i, data in enumerate(batches):
        _, verdicts, segments, _, _ = core.commit(data)
        for _ in range(times):  # the harness's own part
            if reference is not None:
                want = reference[i]
                same = same and verdicts == want[0] and segments == want[1]
    if reference is None:
        print("no reference to compare with")
    else:
        print("replies identical" if same else "REPLIES DIFFER", flush=True)
        if not same:
            os._exit(1)
sys.stdout.flush()
os._exit(0)  # no collector pass at exit: it is not the binder's work
