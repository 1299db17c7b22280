"""The dispatcher -> notifier link over mutual TLS, as real processes: `reminders notifier`
serving its port with REMINDERS_NOTIFIER_SERVER_TLS_*, `reminders dispatch` dialling it
with REMINDERS_NOTIFIER_TLS_*. A dispatcher without its client certificate is refused:
its hand-offs fail as retryable and it keeps the claim, so once a dispatcher with the
certificate takes over, the reminder rings, once. And both commands refuse to start on a
TLS file they cannot use, naming the variable."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genproto.notification.v1 import notification_pb2 as npb
from genproto.notification.v1 import notification_pb2_grpc as npb_grpc
from reminders_svc.config import CassandraSettings
from tests.dispatcher.stack import Stack, closing, new_user, scrape, soon
from tests.pki import Pki, issue_pki
from tests.platform.helpers import free_port, run_cli

CLIENT = "REMINDERS_NOTIFIER_TLS_"
SERVER = "REMINDERS_NOTIFIER_SERVER_TLS_"
SERVING = health_pb2.HealthCheckResponse.SERVING


def tls_env(pki: Pki, *, client_cert: bool = True) -> dict[str, str]:
    """Both sides' variables, as one ConfigMap would hold them for every pod."""
    env = {
        f"{SERVER}CERT_FILE": str(pki.server.cert),
        f"{SERVER}KEY_FILE": str(pki.server.key),
        f"{SERVER}CLIENT_CA_FILE": str(pki.ca),
        f"{CLIENT}CA_FILE": str(pki.ca),
    }
    if client_cert:
        env |= {
            f"{CLIENT}CERT_FILE": str(pki.client.cert),
            f"{CLIENT}KEY_FILE": str(pki.client.key),
        }
    return env


def mtls_channel(target: str, pki: Pki) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca.read_bytes(),
        private_key=pki.client.key.read_bytes(),
        certificate_chain=pki.client.cert.read_bytes(),
    )
    return grpc.secure_channel(target, credentials)


def wait_serving(channel: grpc.Channel, timeout_s: float = 60) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == SERVING:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    raise AssertionError("the notifier did not become SERVING over mTLS")


def pushed(channel: grpc.Channel, user: str) -> list[npb.Delivered]:
    stub = npb_grpc.NotificationServiceStub(channel)
    reply = stub.ListDelivered(npb.ListDeliveredRequest(user_id=user), timeout=10)
    return list(reply.delivered)


def test_over_mtls_a_ring_goes_out_once_and_without_the_client_cert_nothing_is_lost(
    cassandra_settings: CassandraSettings, tmp_path: Path
) -> None:
    pki = issue_pki(tmp_path)
    with closing(Stack(cassandra_settings)) as stack:
        stack.start_api()
        stack.spawn("notifier", "notifier", **tls_env(pki))
        target = f"127.0.0.1:{stack.notifier_port}"
        with mtls_channel(target, pki) as notifier:
            wait_serving(notifier)

            # A dispatcher that trusts the notifier but has no certificate to show.
            metrics_port = free_port()
            without_cert = stack.start_dispatcher(
                "without-cert",
                **tls_env(pki, client_cert=False),
                REMINDERS_DISPATCH_METRICS_PORT=str(metrics_port),
            )
            user = new_user()
            due = soon(3)
            created = stack.create_at(user, due, text="over mtls")
            # The handshake refused, the notifier counts as unreachable: the ring, due, is
            # left unclaimed (nothing for a successor to wait out).
            deadline = time.monotonic() + 45
            reachable = None
            while reachable != 0 and time.monotonic() < deadline:
                time.sleep(0.5)
                try:
                    reachable = scrape(metrics_port).get("reminders_dispatch_notifier_reachable")
                except OSError:
                    continue  # /metrics not up yet
            assert reachable == 0, "the refused handshake went unnoticed"
            time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()) + 3)
            assert pushed(notifier, user) == []
            assert stack.row(user, created.id).status == "pending"  # type: ignore[attr-defined]
            assert stack.stop(without_cert) == 0

            # One with its certificate takes the ring over, under the same key.
            stack.start_dispatcher("with-cert", **tls_env(pki))
            deadline = time.monotonic() + 45
            while not pushed(notifier, user) and time.monotonic() < deadline:
                time.sleep(0.25)
            row = stack.wait_status(user, created.id, "done")
            assert row.status == "done"  # type: ignore[attr-defined]
            time.sleep(1)
            [push] = pushed(notifier, user)
            assert push.idempotency_key.startswith(created.id)
            assert push.push_time.ToDatetime() >= push.due_time.ToDatetime()


def test_commands_refuse_to_start_on_a_tls_file_they_cannot_use(tmp_path: Path) -> None:
    """Before any database or network work: the settings are read first."""
    pki = issue_pki(tmp_path)
    missing = tmp_path / "missing.pem"
    secret = tmp_path / "secret.key"
    secret.write_text("SECRET-KEY-MATERIAL-8c1\n")

    dispatch = run_cli("dispatch", env={f"{CLIENT}CA_FILE": str(missing)}, timeout=60)
    assert dispatch.returncode == 2, dispatch.stdout + dispatch.stderr
    assert f"{CLIENT}CA_FILE='{missing}': cannot read it" in dispatch.stderr

    dispatch = run_cli(
        "dispatch",
        env={
            f"{CLIENT}CA_FILE": str(pki.ca),
            f"{CLIENT}CERT_FILE": str(pki.client.cert),
            f"{CLIENT}KEY_FILE": str(secret),
        },
        timeout=60,
    )
    assert dispatch.returncode == 2, dispatch.stdout + dispatch.stderr
    assert f"{CLIENT}KEY_FILE='{secret}': not a PEM file" in dispatch.stderr
    assert "SECRET-KEY-MATERIAL" not in dispatch.stdout + dispatch.stderr

    notifier = run_cli(
        "notifier",
        env={f"{SERVER}CERT_FILE": str(pki.server.cert), f"{SERVER}KEY_FILE": str(secret)},
        timeout=60,
    )
    assert notifier.returncode == 2, notifier.stdout + notifier.stderr
    assert f"{SERVER}KEY_FILE='{secret}': not a PEM file" in notifier.stderr
    assert "SECRET-KEY-MATERIAL" not in notifier.stdout + notifier.stderr
