"""The server's Prometheus metrics, in a registry of its own (several apps in one process stay apart)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("ostinato_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.queue = Gauge("ostinato_queue_depth", "audios waiting to start, by model", ["model"],
                           registry=self.registry)
        self.running = Gauge("ostinato_running_audios", "audios being transcribed, by model", ["model"],
                             registry=self.registry)
        self.busy = Gauge("ostinato_busy_windows", "windows in decoder rows now, by model", ["model"],
                          registry=self.registry)
        self.audio = Counter("ostinato_audio_seconds", "seconds of audio transcribed, by model", ["model"],
                             registry=self.registry)
        self.latency = Histogram("ostinato_request_latency_seconds", "time from upload to response, by endpoint",
                                 ["endpoint"], registry=self.registry,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))

    def observe_services(self, services: dict) -> None:
        for name, service in services.items():
            stats = service.stats()
            self.queue.labels(name).set(stats["queued"])
            self.running.labels(name).set(stats["running"])
            self.busy.labels(name).set(stats["busy_windows"])
