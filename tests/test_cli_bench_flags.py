"""Bad bench/replay/demo flags: a usage error naming the flag (exit 2), refused before any run or Ray."""

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gosched.cli.exits import ExitCode
from gosched.cli.main import app

# (command line, the flag its error must name); --out and --trace-dir are added per command below.
BAD: list[tuple[list[str], str]] = [
    (["replay", "--seeds", "0"], "--seeds"),
    (["replay", "--seeds", "-1"], "--seeds"),
    (["replay", "--policies", ","], "--policies"),
    (["replay", "--policies", "best_fit,nope"], "--policies"),
    (["replay", "--timed", "--runtime", "local", "--compress", "nan"], "--compress"),
    (["replay", "--timed", "--runtime", "local", "--compress", "inf"], "--compress"),
    (["replay", "--timed", "--runtime", "local", "--compress", "0"], "--compress"),
    (["replay", "--timed", "--runtime", "elsewhere"], "--runtime"),
    (["replay", "--timed", "--limit-s", "-5"], "--limit-s"),
    (["replay", "--timed", "--limit-s", "0"], "--limit-s"),
    (["replay", "--timed", "--limit-s", "nan"], "--limit-s"),
    (["bench", "--in-process", "--nodes", "0", "--pods", "10"], "--nodes"),
    (["bench", "--in-process", "--nodes", "10", "--pods", "0"], "--pods"),
    (["bench", "--in-process", "--nodes", "10", "--pods", "-5"], "--pods"),
    (["bench", "--nodes", "2", "--pods", "20", "--rate", "nan"], "--rate"),
    (["bench", "--nodes", "2", "--pods", "20", "--rate", "inf"], "--rate"),
    (["bench", "--in-process", "--shards", "abc", "--nodes", "10", "--pods", "10"], "--shards"),
    (["bench", "--in-process", "--shards", "1,,2", "--nodes", "10", "--pods", "10"], "--shards"),
    (["bench", "--in-process", "--shards", "1,0", "--nodes", "10", "--pods", "10"], "--shards"),
    (["bench", "--in-process", "--workload", ","], "--workload"),
    (["bench", "--ingest", "--in-process", "--replicas", "0"], "--replicas"),
    (["demo", "--jobs", "-3"], "--jobs"),
    (["demo", "--nodes", "-1"], "--nodes"),
]


def _invoke(args: list[str], tmp_path: Path, out: str | None = None) -> tuple[int, str]:
    extra: list[str] = []
    if args[0] in ("bench", "replay"):
        extra += ["--out", out or str(tmp_path / "out")]
    if args[0] == "replay":  # a trace that exists (empty files): only the flags can be refused
        trace = tmp_path / "trace"
        trace.mkdir(exist_ok=True)
        for name in ("openb_node_list_gpu_node.csv", "openb_pod_list_default.csv"):
            (trace / name).touch()
        extra += ["--trace-dir", str(trace)]
    started = time.monotonic()
    result = CliRunner().invoke(app, [*args, *extra])
    assert time.monotonic() - started < 5, "refused only after starting work"
    return result.exit_code, result.output


@pytest.mark.parametrize(("args", "flag"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_flag_is_a_usage_error_naming_it(args: list[str], flag: str, tmp_path: Path) -> None:
    code, output = _invoke(args, tmp_path)
    assert code == ExitCode.USAGE, output
    assert f"error: {flag}: " in output and "Traceback" not in output, output
    assert not (tmp_path / "out").exists()  # refused before the results folder was made


@pytest.mark.parametrize("command", ["bench", "replay"])
def test_an_out_folder_that_cannot_be_made_is_a_usage_error(command: str, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = [command, "--in-process", "--nodes", "10", "--pods", "10"] if command == "bench" else [command]
    for out in ("/dev/null/x", str(blocker), str(blocker / "below")):
        code, output = _invoke(args, tmp_path, out=out)
        assert code == ExitCode.USAGE, output
        assert f"error: --out: cannot create folder {out}: " in output and "Traceback" not in output, output
