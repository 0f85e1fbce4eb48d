"""Writing `gosched replay` results: a table, JSON, and a PNG plot."""

import json
from collections.abc import Sequence
from pathlib import Path

from gosched.bench.replay import LEVELS, PUBLISHED_AT_100, PolicyResult, table


def write_results(results: Sequence[PolicyResult], out_dir: Path, meta: dict[str, object]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "meta": meta,
        "levels": list(LEVELS),
        "published_at_100": PUBLISHED_AT_100,
        "policies": {
            r.policy: {
                f"{int(level * 100)}": {
                    "mean": r.mean(level),
                    "min": r.spread(level)[0],
                    "max": r.spread(level)[1],
                    "per_seed": r.by_level[level],
                }
                for level in LEVELS
            }
            for r in results
        },
    }
    paths = [out_dir / "replay.json", out_dir / "replay.txt"]
    paths[0].write_text(json.dumps(data, indent=2))
    paths[1].write_text(table(results) + "\n")
    png = plot(results, out_dir / "replay.png")
    if png is not None:
        paths.append(png)
    return paths


def plot(results: Sequence[PolicyResult], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plotting is optional; the table and JSON carry the numbers
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [int(level * 100) for level in LEVELS]
    for r in results:
        means = [100 * r.mean(level) for level in LEVELS]
        lows = [100 * r.spread(level)[0] for level in LEVELS]
        highs = [100 * r.spread(level)[1] for level in LEVELS]
        ax.plot(xs, means, marker="o", label=r.policy)
        ax.fill_between(xs, lows, highs, alpha=0.15)
    ax.axhline(
        100 * PUBLISHED_AT_100["fgd (paper)"],
        color="grey",
        linestyle="--",
        linewidth=0.8,
        label="FGD paper at 100%",
    )
    ax.set_xlabel("arrived GPU demand (% of cluster GPUs)")
    ax.set_ylabel("GPU allocation ratio (%)")
    ax.set_title("openb-v2023, fill until full")
    ax.set_ylim(80, 100)
    ax.set_xlim(85, 132)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
