"""The master's HTTP endpoint: /healthz (the scheduling thread is alive), /readyz (the scheduler has
restored its state and serves), /metrics (Prometheus)."""

import logging
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gosched.api.metrics import SchedulerMetrics
from gosched.api.service import SchedulerService

log = logging.getLogger(__name__)


def http_handler(service: SchedulerService, metrics: SchedulerMetrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                ok = service.alive
                self._reply(200 if ok else 503, b"ok\n" if ok else b"scheduler thread failed\n")
            elif path == "/readyz":
                ok = service.ready
                self._reply(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
            elif path == "/metrics":
                self._reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            else:
                self._reply(404, b"not found\n")

        def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler
