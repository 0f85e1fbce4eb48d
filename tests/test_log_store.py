"""The master's task output files (api/logs.py), on real files."""

from pathlib import Path

from gosched.api.logs import LogStore


def test_reads_at_any_offset_past_the_end_are_empty(tmp_path: Path) -> None:
    logs = LogStore(tmp_path)
    logs.write("j/0", "stdout", 0, b"hello")
    assert logs.read("j/0", "stdout", 2) == b"llo"
    assert logs.read("j/0", "stdout", 5) == b""
    assert logs.read("j/0", "stdout", 10**15) == b""  # past what the file system can seek to
    assert logs.read("j/1", "stdout", 0) == b""  # no output yet
