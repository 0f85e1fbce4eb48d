"""The master's HTTP endpoint: /healthz (the scheduling thread is alive), /readyz (the scheduler has
restored its state and serves: 503, with the reason, while it starts, after it stopped, and while a
component or its Ray cluster does not answer), /metrics (Prometheus)."""

import logging
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gosched.api.metrics import SchedulerMetrics
from gosched.api.service import SchedulerService

log = logging.getLogger(__name__)
TEXT = "text/plain; charset=utf-8"


def http_handler(service: SchedulerService, metrics: SchedulerMetrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._reply(*self._answer())

        def do_HEAD(self) -> None:
            # Probes (load balancers, uptime checks) often use HEAD: GET's status and headers only.
            self._reply(*self._answer(), body=False)

        def _answer(self) -> tuple[int, bytes, str]:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                ok = service.alive
                return (200 if ok else 503), (b"ok\n" if ok else b"scheduler thread failed\n"), TEXT
            if path == "/readyz":  # 503 while starting, stopped, or its control plane does not answer
                why = service.not_ready_reason
                if why is None:
                    return 200, b"ready\n", TEXT
                return 503, f"not ready: {why}\n".encode(), TEXT
            if path == "/metrics":
                return 200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST
            return 404, b"not found\n", TEXT

        def _reply(self, code: int, payload: bytes, content_type: str, *, body: bool = True) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if body:
                self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler
