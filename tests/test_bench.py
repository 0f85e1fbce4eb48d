"""The benchmark's own arithmetic on tiny runs, and its command line."""

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gosched.bench.actor_bodies import BodyCost, ceilings
from gosched.bench.memory import measure_memory
from gosched.bench.report import table, write
from gosched.bench.runner import _Submitter, run_in_process, run_ray
from gosched.bench.workloads import WORKLOADS
from gosched.cli.main import app
from gosched.common.config import MINIMAL_PROFILE, ProfileConfig
from gosched.runtime.simulation import basic_jobs


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_measured_task_is_counted_once(name: str) -> None:
    w = WORKLOADS[name](40, 60)
    r = run_in_process(w, shards=2, profile=ProfileConfig())
    assert r.tasks == w.measured_tasks
    # Distinct tasks, each once: gpu-mix's random priorities let measured tasks evict (and rebind)
    # each other, which `bindings` counts and `bound` does not.
    assert 0 < r.bound <= r.tasks
    assert r.bindings is not None and r.bindings >= r.bound
    if name in ("scheduling-basic", "node-affinity", "gang", "fill-90"):
        assert r.bound == r.tasks  # room for all of them
    assert r.tasks_per_s == pytest.approx(r.bound / r.seconds)
    assert 0.0 <= r.conflict_rate <= 1.0


def test_report_files(tmp_path: Path) -> None:
    w = WORKLOADS["scheduling-basic"](20, 50)
    runs = [
        run_in_process(w, shards=s, profile=p) for s in (1, 2) for p in (ProfileConfig(), MINIMAL_PROFILE)
    ]
    paths = write(runs, tmp_path, "gosched bench test")
    data = json.loads((tmp_path / "bench.json").read_text())
    assert [r["shards"] for r in data["runs"]] == [1, 1, 2, 2]
    assert data["runs"][0]["tasks_per_s"] == pytest.approx(runs[0].bound / runs[0].seconds)
    assert "scheduling-basic" in table(runs) and all(p.exists() for p in paths)


def test_cli_prints_tasks_per_second(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        app,
        ["bench", "--in-process", "--nodes", "50", "--pods", "200", "--shards", "1", "--out", str(tmp_path)],
    )
    assert out.exit_code == 0, out.output
    assert " tasks/s" in out.output and (tmp_path / "bench.json").exists()


@pytest.mark.parametrize("args", [["--workload", "nope"], ["--shards", "0"], ["--profile", "fast"]])
def test_cli_rejects_bad_arguments(args: list[str]) -> None:
    out = CliRunner().invoke(app, ["bench", "--in-process", *args])
    assert out.exit_code == 2


def test_fill_90_asks_for_nine_tenths_of_the_cluster() -> None:
    w = WORKLOADS["fill-90"](100, 500)
    cpu = sum(j.groups[0].resources.cpu_milli for j in w.measured)
    memory = sum(j.groups[0].resources.memory for j in w.measured)
    capacity_cpu = sum(n.cpu_milli for n in w.nodes)
    capacity_mem = sum(n.memory for n in w.nodes)
    assert 0.89 * capacity_cpu <= cpu <= 0.9 * capacity_cpu
    assert 0.89 * capacity_mem <= memory <= 0.9 * capacity_mem


def test_submitter_sends_every_job_once_in_order_at_the_rate() -> None:
    sent: list[str] = []
    jobs = basic_jobs(300)
    sub = _Submitter(lambda chunk: sent.extend(j.id for j in chunk), jobs, rate=3000.0)
    start = time.perf_counter()
    sub.start()
    sub.join(timeout=10)
    assert sub.done.is_set() and sub.error is None
    assert sent == [j.id for j in jobs]
    # 300 tasks at 3,000/s cannot all go out before 0.1 s (less the first slice's share)
    assert time.perf_counter() - start >= 0.09


def test_ray_run_at_a_rate_and_memory_report() -> None:
    w = WORKLOADS["scheduling-basic"](30, 200)
    r = run_ray(w, 2, ProfileConfig(), batch_size=32, rate=1000.0)
    assert r.bound == r.tasks == 200 and r.offered_rate == 1000.0
    assert r.p50_ms is not None and r.p99_ms is not None and 0 < r.p50_ms <= r.p99_ms
    assert set(r.process_rss_mib) == {"dispatcher", "binder", "shard-0", "shard-1", "driver"}
    assert r.peak_rss_mib == pytest.approx(sum(r.process_rss_mib.values()))
    assert r.component_s["binder"] > 0 and r.component_s["shards"] > 0
    # Each component's processes used CPU during the run (user + system seconds of the actors).
    assert set(r.component_cpu_s) == {"dispatcher", "shards", "binder"}
    assert all(v > 0 for v in r.component_cpu_s.values())
    # Each serial part's one thread: part of its process's CPU (the writer is the binder's child).
    assert set(r.serial_cpu_s) == {"dispatcher", "binder", "writer", "busiest shard"}
    # (the writer's CPU is read in the kernel's ticks, 10 ms: a tiny run may read none)
    assert all(v > 0 for k, v in r.serial_cpu_s.items() if k != "writer") and r.serial_cpu_s["writer"] >= 0
    assert r.serial_cpu_s["dispatcher"] <= r.component_cpu_s["dispatcher"]
    assert r.serial_cpu_s["binder"] + r.serial_cpu_s["writer"] <= r.component_cpu_s["binder"]
    assert r.serial_cpu_s["busiest shard"] <= r.component_cpu_s["shards"]
    assert r.ray_daemons_cpu_s is not None and r.ray_daemons_cpu_s >= 0
    # Every commit's answer holds its verdicts, so the answers carry bytes for every bound task.
    assert r.reply_bytes is not None and r.largest_reply_bytes is not None
    assert r.reply_bytes > r.bound and 0 < r.largest_reply_bytes <= r.reply_bytes
    assert "serial threads' CPU" in table([r])
    m = measure_memory(40, 500, 2)
    assert m.pending_tasks == 500 and {"dispatcher", "binder", "shard-0", "shard-1"} <= set(m.rss_mib)
    assert m.control_plane_mib == pytest.approx(sum(m.rss_mib.values())) and m.control_plane_mib > 0


def test_the_serial_cap_is_the_tasks_over_the_busiest_threads_seconds() -> None:
    w = WORKLOADS["scheduling-basic"](20, 50)
    r = run_in_process(w, shards=1, profile=ProfileConfig())
    assert r.serial_cap_tasks_per_s is None  # in process: no threads of their own measured
    r.serial_cpu_s = {"dispatcher": 0.01, "binder": 0.025, "writer": 0.002, "busiest shard": 0.02}
    assert r.serial_cap_tasks_per_s == pytest.approx(r.bound / 0.025)
    assert r.as_dict()["serial_cap_tasks_per_s"] == pytest.approx(r.bound / 0.025)
    line = next(x for x in table([r]).splitlines() if "binder" in x and "busiest" in x)
    assert f"binder {0.025 / r.bound * 1e6:.1f}" in line and f"{r.bound / 0.025:,.0f} tasks/s" in line


@pytest.mark.parametrize("rate", ["fast", "-5", "0"])
def test_cli_rejects_a_bad_rate(rate: str) -> None:
    out = CliRunner().invoke(app, ["bench", "--rate", rate])
    assert out.exit_code == 2 and "--rate" in out.output


def test_message_costs_cover_the_four_hot_messages_per_task() -> None:
    from gosched.bench.message_costs import measure, table

    costs = measure(tasks=64, repeat=2)
    assert [c.name.split()[0] for c in costs] == ["units", "proposals", "changes", "verdicts"]
    for c in costs:
        assert c.bytes_per_task > 10 and c.pack_us > 0 and c.unpack_us > 0
    assert table(costs).splitlines()[-1].startswith("total")


def test_bench_messages_writes_its_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "--messages", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "messages.json").read_text())
    assert len(data["result"]["messages"]) == 4 and data["machine"]["cpus"] >= 1


def test_the_actor_bodies_bench_counts_every_task_through_every_actor(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["bench", "--bodies", "--pods", "600", "--nodes", "20", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    bodies = json.loads((tmp_path / "bodies.json").read_text())["result"]["bodies"]
    assert [(b["actor"], b["step"]) for b in bodies] == [
        ("dispatcher", "next_batch"),
        ("dispatcher", "report"),
        ("binder", "commit"),
        ("binder", "writer"),
        ("shard", "plan"),
        ("shard", "reply"),
        ("shard", "others"),
    ]
    assert all(b["tasks"] == 600 and b["us_per_task"] > 0 for b in bodies)


def test_the_bodies_ceiling_is_the_slowest_actor_with_the_shards_work_split() -> None:
    us = {
        ("dispatcher", "next_batch"): 3.0,
        ("dispatcher", "report"): 2.0,  # dispatcher: 5 us per task
        ("binder", "commit"): 8.0,
        ("binder", "writer"): 3.0,  # its own process: the binder is the slower of the two
        ("shard", "plan"): 18.0,
        ("shard", "reply"): 2.0,  # a shard's own tasks: 20 us each
        ("shard", "others"): 4.0,  # every other shard's binding: 4 us
    }
    costs = [BodyCost(actor, step, 100, v) for (actor, step), v in us.items()]
    got = ceilings(costs, (1, 2, 4, 8))
    # 1 shard: 20 us; 2: 10 + 2 = 12; 4: 5 + 3 = 8 (ties the binder); 8: 2.5 + 3.5 = 6 < binder's 8
    assert got == pytest.approx({1: 50_000, 2: 1e6 / 12, 4: 125_000, 8: 125_000})
    us[("binder", "writer")] = 10.0  # a writer slower than the binder's checks is the ceiling
    got = ceilings([BodyCost(actor, step, 100, v) for (actor, step), v in us.items()], (8,))
    assert got == pytest.approx({8: 100_000})
