"""The dispatcher shares one TaskGroup object per distinct group (memory, and pickle's memo)."""

from gosched.common import wire
from gosched.common.config import Settings
from gosched.common.messages import UnitBatch
from gosched.dispatcher.dispatcher import Dispatcher
from gosched.dispatcher.group_interner import GroupInterner
from tests.builders import make_job


def test_equal_groups_become_one_object_and_the_job_is_otherwise_unchanged() -> None:
    interner = GroupInterner()
    a = make_job("a").cpu("1").mem("1Gi").build()
    b = make_job("b").cpu("1").mem("1Gi").build()
    c = make_job("c").cpu("2").build()
    assert a.groups[0] is not b.groups[0] and a.groups[0] == b.groups[0]
    ia, ib, ic = (interner.intern(j) for j in (a, b, c))
    assert ia is a  # the first of its kind is kept as it is
    assert ib == b and ib.groups[0] is ia.groups[0]
    assert ic is c and ic.groups[0] is not ia.groups[0]
    assert len(interner) == 2


def test_the_table_starts_afresh_when_full() -> None:
    interner = GroupInterner(max_groups=2)
    for cpu in ("1", "2", "3"):
        interner.intern(make_job(f"j{cpu}").cpu(cpu).build())
    assert len(interner) == 1
    again = interner.intern(make_job("again").cpu("3").build())
    assert len(interner) == 1 and again.groups[0].resources.cpu_milli == 3000


def test_a_dispatched_batch_of_alike_jobs_pickles_their_group_once() -> None:
    d = Dispatcher(Settings(shards=1))
    d.submit_many([make_job(f"j{i}").cpu("1").mem("1Gi").command("sleep", "1").build() for i in range(200)])
    (batch,) = d.next_batches()
    groups = {id(u.job.groups[0]) for u in batch.units}
    assert len(batch.units) == 200 and len(groups) == 1
    back = wire.unpack(wire.pack(batch))
    assert isinstance(back, UnitBatch) and back == batch
    assert len({id(u.job.groups[0]) for u in back.units}) == 1
