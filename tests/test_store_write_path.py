"""The store's write path: how SQLite runs the statements the binder's writer repeats per row."""

from pathlib import Path

import pytest

from gosched.common import store as store_module
from gosched.common.states import TaskState
from gosched.common.store import Store


@pytest.mark.parametrize(
    ("sql", "args"),
    [
        (store_module._BIND, ("node-a", "", 1.0, 1.0, "j/0")),
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
