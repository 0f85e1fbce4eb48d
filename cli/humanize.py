"""Numbers and tables for people: cores as 3.5, memory as 16Gi, GPU shares as 0.25, ages as 5m."""

from collections.abc import Sequence

from gosched.common.resources import ResourceRequest

_UNITS = (("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def _decimal(value: float, places: int) -> str:
    """`value` with at most `places` decimals and no trailing zeros (3.5, 8, 0.25)."""
    text = f"{value:.{places}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def cores(milli: int) -> str:
    return _decimal(milli / 1000, 3)


def gpus(milli: int) -> str:
    """A GPU amount in GPUs; a share of one GPU as a fraction (500 milli -> 0.5)."""
    return _decimal(milli / 1000, 3)


def memory(n: int) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1, to one decimal (1.5Gi)."""
    for unit, size in _UNITS:
        if n >= size:
            return f"{_decimal(n / size, 1)}{unit}"
    return str(n)


def age(seconds: float) -> str:
    """A duration as its largest unit: 42s, 5m, 3h, 2d, 4y (negatives, from clock skew, as 0s)."""
    s = max(0, int(seconds))
    for unit, size in (("y", 365 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def request(r: ResourceRequest) -> str:
    """What a task (or a job in total) asks for: "cpu 4, mem 16Gi, gpu 2"."""
    parts = []
    if r.cpu_milli:
        parts.append(f"cpu {cores(r.cpu_milli)}")
    if r.memory:
        parts.append(f"mem {memory(r.memory)}")
    if r.gpu_total_milli:
        parts.append(f"gpu {gpus(r.gpu_total_milli)}")
    if r.gpu_memory_mib:
        parts.append(f"gpu-mem {memory(r.gpu_memory_mib * 2**20)}")
    parts.extend(f"{name} {amount}" for name, amount in r.extended)
    return ", ".join(parts) or "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, a header row first; no trailing blanks."""
    cells = [list(headers), *[[str(c) if c != "" else "-" for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def fields(pairs: Sequence[tuple[str, str]]) -> str:
    """`Name:  value` lines, the values aligned."""
    width = max((len(k) for k, _ in pairs), default=0) + 1
    return "\n".join(f"{(k + ':').ljust(width)}  {v}" for k, v in pairs)
