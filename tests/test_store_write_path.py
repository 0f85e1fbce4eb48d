"""The store's write path: how SQLite runs the statements the binder's writer repeats per row."""

from pathlib import Path

import pytest

from gosched.common import store as store_module
from gosched.common.states import TaskState
from gosched.common.store import Store
from gosched.runtime.simulation import basic_jobs


@pytest.mark.parametrize(
    ("sql", "args"),
    [
        (store_module._BIND, ("node-a", "", 1.0, 1.0, "j/0")),
        (store_module._BIND_NO_GPUS, ("node-a", 1.0, "j/0")),
        *[(store_module._SET_STATE, (s.value, 1.0, "j/0")) for s in TaskState],
    ],
)
def test_per_row_statements_build_no_temporary_btree(
    tmp_path: Path, sql: str, args: tuple[object, ...]
) -> None:
    # executemany runs these once per row: a temporary B-tree (an IN list of constants) would be
    # built and dropped each time.
    with Store(tmp_path / "s.db") as store:
        ops = [row[1] for row in store._conn.execute("EXPLAIN " + sql, args)]
    assert "OpenEphemeral" not in ops


def _rows(store: Store) -> list[tuple[object, ...]]:
    return store._conn.execute(
        "SELECT task_id, state, node, gpus, bound_at, updated FROM tasks ORDER BY task_id"
    ).fetchall()


def test_bindings_with_and_without_gpus_store_the_same_rows(tmp_path: Path) -> None:
    jobs = basic_jobs(4)
    with Store(tmp_path / "s.db") as store:
        store.add_jobs(jobs, now=1.0)
        store.commit_many(
            [
                (1, [("job-0/0", "n0", ()), ("job-1/0", "n1", ((0, 500), (3, 1000)))], [], 2.0),
                (2, [("job-2/0", "n2", ()), ("job-3/0", "n3", ())], [], 3.0),  # no GPUs in the batch
                (3, [("job-1/0", "n4", ())], [], 4.0),  # bound again without GPUs: its GPU text goes
            ]
        )
        assert _rows(store) == [
            ("job-0/0", "bound", "n0", "", 2.0, 2.0),
            ("job-1/0", "bound", "n4", "", 4.0, 4.0),
            ("job-2/0", "bound", "n2", "", 3.0, 3.0),
            ("job-3/0", "bound", "n3", "", 3.0, 3.0),
        ]
        assert store.load_version() == 3


def test_a_batch_without_gpus_keeps_a_final_state_and_stores_missing_jobs(tmp_path: Path) -> None:
    jobs = basic_jobs(3)
    with Store(tmp_path / "s.db") as store:
        store.add_jobs(jobs[:2], now=1.0)
        store.set_task_states([("job-1/0", TaskState.CANCELLED)], now=1.5)
        store.commit(1, [(f"job-{i}/0", f"n{i}", ()) for i in range(3)], [], now=2.0, jobs={"job-2": jobs[2]})
        assert _rows(store) == [
            ("job-0/0", "bound", "n0", "", 2.0, 2.0),
            ("job-1/0", "cancelled", None, "", None, 1.5),
            ("job-2/0", "bound", "n2", "", 2.0, 2.0),
        ]
        with pytest.raises(KeyError):
            store.commit(2, [("job-9/0", "n9", ())], [], now=3.0)
        assert store.load_version() == 1
