"""What one actor's 300 KB answer costs through Ray's object store and inline.

Usage: python probe_inline.py none | BYTES
  none   Ray's default limit (100 KiB): the answer goes through the shared-memory object store
  BYTES  RAY_max_direct_call_object_size for the actor, through its runtime_env: inline

Prints the wall time per call, and per call the CPU of the actor (all its threads, and the
thread that runs its calls), of the raylet, and of this caller.
"""

import resource
import sys
import time

import psutil
import ray

CALLS = 500
HALF = 150_000  # the answer: 150 KB, and 8 pieces of 18.75 KB, as a commit's verdicts and segments


class Answers:
    def answer(self, n: int) -> tuple[str, bytes, list[bytes], int, bool]:
        return ("x", b"a" * n, [b"b" * (n // 8)] * 8, 3, False)

    def cpu(self) -> tuple[float, float]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime, time.thread_time()


def main(limit: str) -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    env = {} if limit == "none" else {"runtime_env": {"env_vars": {"RAY_max_direct_call_object_size": limit}}}
    actor = ray.remote(num_cpus=0, **env)(Answers).remote()
    raylet = next(
        p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and "raylet" in p.info["cmdline"][0]
    )
    ray.get(actor.answer.remote(10))
    actor0 = ray.get(actor.cpu.remote())
    raylet0 = sum(raylet.cpu_times()[:2])
    me0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    for _ in range(CALLS):
        ray.get(actor.answer.remote(HALF))
    wall = (time.perf_counter() - start) / CALLS
    actor1 = ray.get(actor.cpu.remote())
    raylet1 = sum(raylet.cpu_times()[:2])
    me1 = resource.getrusage(resource.RUSAGE_SELF)
    me = (me1.ru_utime + me1.ru_stime) - (me0.ru_utime + me0.ru_stime)

    def ms(seconds: float) -> str:
        return f"{seconds / CALLS * 1e3:.2f} ms"

    print(
        f"{limit} {HALF * 2} {wall * 1e3:.2f} ms/call; actor cpu {ms(actor1[0] - actor0[0])} "
        f"(call thread {ms(actor1[1] - actor0[1])}); raylet {ms(raylet1 - raylet0)}; caller {ms(me)}"
    )


if __name__ == "__main__":
    main(sys.argv[1])
