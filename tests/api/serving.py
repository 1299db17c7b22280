"""`reminders serve-api` as a real subprocess, configured only by its environment."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from reminders_svc.config import CassandraSettings
from tests.platform.helpers import REMINDERS, free_port

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def cassandra_env(settings: CassandraSettings) -> dict[str, str]:
    env = {
        "REMINDERS_CASSANDRA_CONTACT_POINTS": ",".join(settings.contact_points),
        "REMINDERS_CASSANDRA_PORT": str(settings.port),
        "REMINDERS_CASSANDRA_KEYSPACE": settings.keyspace,
    }
    if settings.local_dc:
        env["REMINDERS_CASSANDRA_LOCAL_DC"] = settings.local_dc
    return env


@dataclass
class ServedApi:
    process: subprocess.Popen[str]
    target: str
    metrics_port: int

    def health(self, service: str = "", credentials: grpc.ChannelCredentials | None = None) -> int:
        channel = (
            grpc.insecure_channel(self.target)
            if credentials is None
            else grpc.secure_channel(self.target, credentials)
        )
        with channel:
            request = health_pb2.HealthCheckRequest(service=service)
            status: int = health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status
            return status

    def wait_for_health(
        self,
        wanted: int,
        timeout_s: float = 60,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"serve-api exited early:\n{self.output()}")
            try:
                last = self.health(credentials=credentials)
                if last == wanted:
                    return
            except grpc.RpcError as error:
                last = error.code()
            time.sleep(0.2)
        raise AssertionError(f"health stayed {last}, wanted {wanted}")

    def terminate(self, timeout_s: float = 60) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def output(self) -> str:
        if self.process.poll() is None:
            return "(still running)"
        assert self.process.stdout is not None
        return self.process.stdout.read()


@contextmanager
def serve_api(cassandra: CassandraSettings, **env: str) -> Iterator[ServedApi]:
    """A running server on free ports; REMINDERS_ENV=dev unless `env` says otherwise."""
    port, metrics_port = free_port(), free_port()
    environment: Mapping[str, str] = {
        **os.environ,
        "REMINDERS_ENV": "dev",
        "REMINDERS_API_PORT": str(port),
        "REMINDERS_API_METRICS_PORT": str(metrics_port),
        "REMINDERS_API_HEALTH_PROBE_INTERVAL_S": "0.5",
        "REMINDERS_CASSANDRA_CONNECT_TIMEOUT": "3",
        **cassandra_env(cassandra),
        **env,
    }
    process = subprocess.Popen(
        [REMINDERS, "serve-api"],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield ServedApi(process, f"127.0.0.1:{port}", metrics_port)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
