"""`gosched bench` output: a readable table, a JSON file and a PNG plot under one results folder."""

import json
import platform
from collections.abc import Sequence
from pathlib import Path

import psutil

from gosched.bench.runner import RunResult


def machine() -> dict[str, object]:
    return {
        "cpus": psutil.cpu_count(logical=True),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def write_result(out_dir: Path, name: str, result: dict[str, object]) -> Path:
    """One measurement as JSON, with the machine it was taken on (ingest, memory)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    path.write_text(json.dumps({"machine": machine(), "result": result}, indent=2))
    return path


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def notes(r: RunResult) -> list[str]:
    """Why a run's counts are not simply --pods measured and all bound once."""
    out = []
    if r.asked is not None and r.asked != r.tasks:
        why = f" ({r.note})" if r.note else ""
        out.append(f"measures {r.tasks:,} of the {r.asked:,} tasks asked{why}")
    if r.bound < r.tasks:
        out.append(f"{r.tasks - r.bound:,} of its {r.tasks:,} tasks never bound")
    if r.bindings is not None and r.bindings > r.bound:
        out.append(
            f"{r.bindings - r.bound:,} more bindings of tasks evicted and placed again, not counted "
            f"in tasks/s ({r.bindings:,} bindings of {r.bound:,} tasks)"
        )
    return out


def table(results: Sequence[RunResult]) -> str:
    """tasks: the tasks measured; bound: how many of them were bound (each once); tasks/s: bound
    over the seconds from the first dispatch to the last binding."""
    head = (
        f"{'workload':<18}{'runtime':<11}{'profile':<9}{'nodes':>7}{'shards':>7}{'tasks':>8}{'bound':>8}"
        f"{'tasks/s':>10}{'p50ms':>8}{'p95ms':>8}{'p99ms':>8}{'conflicts':>10}{'retries':>8}{'rss MiB':>9}"
    )
    lines = [head]
    for r in results:
        lines.append(
            f"{r.workload:<18}{r.runtime:<11}{r.profile:<9}{r.nodes:>7}{r.shards:>7}{r.tasks:>8}{r.bound:>8}"
            f"{r.tasks_per_s:>10,.0f}{_ms(r.p50_ms):>8}{_ms(r.p95_ms):>8}{_ms(r.p99_ms):>8}"
            f"{r.conflict_rate:>10.2%}{r.retries:>8}{r.peak_rss_mib:>9.0f}"
        )
    noted = [(r, n) for r in results if (n := notes(r))]
    if noted:
        lines += ["", "notes:"]
        for r, n in noted:
            lines.append(f"  {r.workload} {r.runtime} {r.profile} {r.shards} shard(s): " + "; ".join(n))
    serial = [r for r in results if r.serial_cpu_s and r.bound]
    if serial:
        lines += ["", "serial threads' CPU, us per task (Ray runs; each part one thread at a time):"]
        for r in serial:
            parts = ", ".join(f"{k} {v / r.bound * 1e6:.1f}" for k, v in r.serial_cpu_s.items())
            cap = r.serial_cap_tasks_per_s
            lines.append(
                f"  {r.workload} {r.profile} {r.shards} shard(s): {parts}"
                + (f"; alone they allow {cap:,.0f} tasks/s" if cap else "")
            )
            extra = []
            if r.ray_daemons_cpu_s is not None:
                extra.append(f"Ray's daemons {r.ray_daemons_cpu_s / r.bound * 1e6:.1f} us/task")
            if r.reply_bytes is not None and r.largest_reply_bytes is not None:
                extra.append(
                    f"commit answers {r.reply_bytes / r.bound:.0f} B/task, "
                    f"largest {r.largest_reply_bytes / 1024:.0f} KiB"
                )
            if extra:
                lines.append("    " + "; ".join(extra))
    return "\n".join(lines)


def write(results: Sequence[RunResult], out_dir: Path, command: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"command": command, "machine": machine(), "runs": [r.as_dict() for r in results]}
    paths = [out_dir / "bench.json", out_dir / "bench.txt"]
    paths[0].write_text(json.dumps(data, indent=2))
    paths[1].write_text(table(results) + "\n")
    png = plot(results, out_dir / "bench.png")
    if png is not None:
        paths.append(png)
    return paths


def plot(results: Sequence[RunResult], path: Path) -> Path | None:
    """Throughput and conflict rate against shard count, one line per workload/profile/runtime."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    series: dict[str, list[RunResult]] = {}
    for r in results:
        series.setdefault(f"{r.workload} ({r.runtime}, {r.profile})", []).append(r)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for label, runs in series.items():
        runs = sorted(runs, key=lambda r: r.shards)
        xs = [r.shards for r in runs]
        ax1.plot(xs, [r.tasks_per_s for r in runs], marker="o", label=label)
        ax2.plot(xs, [100 * r.conflict_rate for r in runs], marker="o", label=label)
    ax1.set_xlabel("shards")
    ax1.set_ylabel("tasks bound per second")
    ax1.set_title("throughput")
    ax2.set_xlabel("shards")
    ax2.set_ylabel("binder conflicts (% of proposals)")
    ax2.set_title("conflict rate")
    ax1.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)  # rates are never negative, also when every run had none
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
