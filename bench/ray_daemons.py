"""Ray's own processes on this machine (its GCS, raylet, dashboard, monitors): not ours, so the
benchmarks report them apart from the control plane's actors."""

import psutil

RAY_DAEMONS = ("gcs_server", "raylet", "dashboard", "log_monitor", "monitor.py", "runtime_env_agent")


def _daemons(attrs: list[str]) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", *attrs]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if any(d in cmd for d in RAY_DAEMONS):
            found.append(proc)
    return found


def daemons_rss_mib() -> float:
    """Their resident memory now, summed."""
    procs = _daemons(["memory_info"])
    return sum(p.info["memory_info"].rss / 2**20 for p in procs if p.info["memory_info"] is not None)


def daemons_cpu_s() -> float:
    """Their CPU seconds so far (user + system), summed: the raylet's share grows with every
    message that goes through the shared-memory object store rather than inline."""
    procs = _daemons(["cpu_times"])
    return sum(p.info["cpu_times"].user + p.info["cpu_times"].system for p in procs if p.info["cpu_times"])
