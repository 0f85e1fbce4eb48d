"""Prometheus metrics of one scheduler service (served at /metrics by gosched.api.http)."""

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gosched.api.service import SchedulerService, Unavailable
from gosched.runtime.control import ControlPlane, ControlUnavailable


class SchedulerMetrics:
    """Prometheus metrics of one service, in their own registry (several servers per process work).

    Counters and gauges are read from the control plane at scrape time; the latency histogram is
    fed after each round with the latencies of the tasks bound since the round before.
    """

    def __init__(self, service: SchedulerService) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=False)
        self.latency = Histogram(
            "gosched_bind_latency_seconds",
            "Seconds from dispatch to bind, per task",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self.registry.register(self)

    def observe_round(self, control: ControlPlane) -> None:
        for seconds in control.drain_latencies():
            self.latency.observe(seconds)

    def collect(self) -> Iterator[Metric]:
        s = self.service
        # A family given `value` carries that one unlabelled sample (prometheus_client's own form).
        yield GaugeMetricFamily(
            "gosched_ready", "1 when the scheduler is ready to serve", value=float(s.ready)
        )
        if not s.ready:
            return
        try:
            status = s.status()
            pending_tasks = s.pending_tasks()
            queues = s.queues()
        except (Unavailable, ControlUnavailable):  # a component stopped answering meanwhile
            return
        yield GaugeMetricFamily("gosched_pending_tasks", "Tasks waiting to be placed", value=pending_tasks)
        yield GaugeMetricFamily(
            "gosched_pending_jobs", "Jobs waiting for dispatch", value=status.pending_jobs
        )
        yield GaugeMetricFamily(
            "gosched_active_jobs", "Jobs with a task not yet ended", value=status.active_jobs
        )
        yield CounterMetricFamily(
            "gosched_bound_tasks",
            "Bindings of tasks to nodes since the master started (not the tasks bound now)",
            value=status.bound_tasks,
        )
        yield CounterMetricFamily(
            "gosched_binder_conflicts",
            "Units the binder refused whole (optimistic-concurrency conflicts)",
            value=status.binder_conflicts,
        )
        yield GaugeMetricFamily(
            "gosched_binder_unwritten_batches",
            "Batches the binder applied that its store writer has not made durable yet",
            value=status.unwritten_batches,
        )
        yield CounterMetricFamily(
            "gosched_binder_writer_cpu_seconds",
            "CPU seconds the binder's store writer spent writing",
            value=status.writer_cpu_seconds,
        )
        yield CounterMetricFamily(
            "gosched_scheduling_rounds", "Scheduling rounds that dispatched work", value=status.rounds
        )
        nodes = GaugeMetricFamily("gosched_nodes", "Live nodes, by schedulability", labels=["schedulable"])
        nodes.add_metric(["true"], status.schedulable_nodes)
        nodes.add_metric(["false"], status.nodes - status.schedulable_nodes)
        yield nodes
        # Capacity of all live nodes, of the schedulable ones, and what tasks hold: the cluster's fill.
        st = status
        for name, what, scale, total, schedulable, used in (
            (
                "gosched_cpu_cores",
                "CPU cores",
                1000,
                st.cpu_milli,
                st.schedulable_cpu_milli,
                st.cpu_used_milli,
            ),
            ("gosched_memory_bytes", "Memory", 1, st.memory, st.schedulable_memory, st.memory_used),
            ("gosched_gpus", "GPUs", 1000, st.gpu_milli, st.schedulable_gpu_milli, st.gpu_used_milli),
        ):
            family = GaugeMetricFamily(name, f"{what} of the live nodes, by kind", labels=["kind"])
            family.add_metric(["capacity"], total / scale)
            family.add_metric(["schedulable"], schedulable / scale)
            family.add_metric(["used"], used / scale)
            yield family
        share = GaugeMetricFamily(
            "gosched_queue_share",
            "Dominant share of the cluster held + in flight per queue",
            labels=["queue"],
        )
        for q in queues:
            share.add_metric([q.name], q.share)
        yield share
