"""TLS between the dispatcher and the notifier, on real gRPC and the real Cassandra: the
dispatcher's NotifierClient, configured as `reminders dispatch` is (REMINDERS_NOTIFIER_TLS_*,
read by DispatcherSettings), against a notifier serving its port as `reminders notifier`
does (REMINDERS_NOTIFIER_SERVER_TLS_*, read by NotifierSettings). And the settings'
refusals, each naming its variable (the API's REMINDERS_API_TLS_* follow the same rules,
from the same code)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from dispatcher.handoff import TLS_LOOK_EVERY_S, Answer, NotifierClient, Outcome, Ring
from dispatcher.settings import DispatcherSettings
from genproto.notification.v1 import notification_pb2 as pb
from genproto.notification.v1 import notification_pb2_grpc as pb_grpc
from notifier.settings import NotifierSettings
from reminders_svc.api.settings import ApiSettings
from reminders_svc.config import ConfigError
from reminders_svc.tls import ClientTls
from tests.notifier.conftest import reminder_key, running_notifier
from tests.pki import LOCALHOST, Authority, MountedClientFiles, Pki, issue_pki
from tests.platform.helpers import free_port

CLIENT = "REMINDERS_NOTIFIER_TLS_"
SERVER = "REMINDERS_NOTIFIER_SERVER_TLS_"
REFUSED = "notifier call failed: UNAVAILABLE"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return issue_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    """A CA the notifier and the dispatcher do not trust."""
    return Authority(tmp_path_factory.mktemp("stranger"), "stranger-ca")


def server_env(pki: Pki, *, mutual: bool = True) -> dict[str, str]:
    env = {f"{SERVER}CERT_FILE": str(pki.server.cert), f"{SERVER}KEY_FILE": str(pki.server.key)}
    if mutual:
        env[f"{SERVER}CLIENT_CA_FILE"] = str(pki.ca)
    return env


def client_env(pki: Pki, *, with_cert: bool = True) -> dict[str, str]:
    env = {f"{CLIENT}CA_FILE": str(pki.ca)}
    if with_cert:
        env |= {
            f"{CLIENT}CERT_FILE": str(pki.client.cert),
            f"{CLIENT}KEY_FILE": str(pki.client.key),
        }
    return env


def notifier_settings(env: Mapping[str, str]) -> NotifierSettings:
    """`reminders notifier`'s settings from `env`, its adapter named as outside dev."""
    return NotifierSettings.from_env({"REMINDERS_NOTIFIER_ADAPTER": "logging", **env})


def dispatcher_tls(env: Mapping[str, str]) -> ClientTls | None:
    """The notifier channel's TLS as `reminders dispatch` reads it from `env`."""
    return DispatcherSettings.from_env(env).notifier_tls


@contextmanager
def notifier_serving(base: NotifierSettings, env: Mapping[str, str]) -> Iterator[str]:
    """A notifier on this session's keyspace, its port's TLS read from `env` as
    `reminders notifier` reads it; its target."""
    tls = notifier_settings(env).tls
    assert tls is not None
    with running_notifier(dataclasses.replace(base, tls=tls)) as notifier:
        yield notifier.target


def rings(user: str, count: int = 3) -> list[Ring]:
    now = datetime.now(UTC)
    return [
        Ring(reminder_key(), user, f"ring {n}", now, now + timedelta(minutes=5), now)
        for n in range(count)
    ]


def hand_off(target: str, tls: ClientTls | None, batch: list[Ring]) -> dict[str, Answer]:
    """One SendBatch through the dispatcher's client, as its hand-off batcher makes it."""

    async def send() -> dict[str, Answer]:
        client = NotifierClient(target, timeout_s=10, tls=tls)
        try:
            return await client.send(batch)
        finally:
            await client.close()

    return asyncio.run(send())


def outcomes(answers: dict[str, Answer]) -> list[tuple[Outcome, str]]:
    return [(answer.outcome, answer.reason) for answer in answers.values()]


def delivered(target: str, pki: Pki, user: str) -> list[str]:
    """The keys pushed for `user`, read over mTLS."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca.read_bytes(),
        private_key=pki.client.key.read_bytes(),
        certificate_chain=pki.client.cert.read_bytes(),
    )
    with grpc.secure_channel(target, credentials) as channel:
        request = pb.ListDeliveredRequest(user_id=user)
        reply = pb_grpc.NotificationServiceStub(channel).ListDelivered(request, timeout=10)
        return sorted(d.idempotency_key for d in reply.delivered)


@pytest.fixture
def user() -> str:
    return f"user-{uuid.uuid4().hex[:10]}"


# -- on the wire ---------------------------------------------------------------------------


def test_over_mutual_tls_the_dispatcher_hands_off_and_gets_answers(
    notifier_settings: NotifierSettings, pki: Pki, user: str
) -> None:
    tls = dispatcher_tls(client_env(pki))
    assert tls is not None
    assert tls.mutual
    batch = rings(user)
    with notifier_serving(notifier_settings, server_env(pki)) as target:
        assert outcomes(hand_off(target, tls, batch)) == [(Outcome.ACCEPTED, "")] * 3
        assert outcomes(hand_off(target, tls, batch)) == [(Outcome.DUPLICATE, "")] * 3
        assert delivered(target, pki, user) == sorted(ring.key for ring in batch)


def test_without_a_client_certificate_the_hand_off_is_refused_retryable_and_nothing_is_lost(
    notifier_settings: NotifierSettings, pki: Pki, stranger: Authority, user: str
) -> None:
    """Refused before any item reaches the notifier: every ring of the call is answered
    RETRYABLE (the dispatcher keeps its claims and retries under the same keys), and the
    later attempt with the certificate is the first the notifier sees."""
    batch = rings(user)
    impostor = stranger.issue("impostor")
    refused_clients = {
        "no client certificate": dispatcher_tls(client_env(pki, with_cert=False)),
        "plaintext": None,
        "a certificate from a CA the notifier does not trust": dispatcher_tls(
            client_env(pki)
            | {f"{CLIENT}CERT_FILE": str(impostor.cert), f"{CLIENT}KEY_FILE": str(impostor.key)}
        ),
    }
    with notifier_serving(notifier_settings, server_env(pki)) as target:
        for why, tls in refused_clients.items():
            answers = hand_off(target, tls, batch)
            assert set(answers) == {ring.key for ring in batch}, why
            assert outcomes(answers) == [(Outcome.RETRYABLE, REFUSED)] * 3, why

        assert delivered(target, pki, user) == []
        assert (
            outcomes(hand_off(target, dispatcher_tls(client_env(pki)), batch))
            == [(Outcome.ACCEPTED, "")] * 3
        )
        assert delivered(target, pki, user) == sorted(ring.key for ring in batch)


def test_the_dispatcher_refuses_a_notifier_its_ca_did_not_sign(
    notifier_settings: NotifierSettings, pki: Pki, stranger: Authority, user: str
) -> None:
    trusting_another_ca = dispatcher_tls({f"{CLIENT}CA_FILE": str(stranger.cert)})
    batch = rings(user, 1)
    with notifier_serving(notifier_settings, server_env(pki, mutual=False)) as target:
        assert outcomes(hand_off(target, trusting_another_ca, batch)) == [
            (Outcome.RETRYABLE, REFUSED)
        ]
        # Server-side TLS only: the CA alone is enough.
        only_ca = dispatcher_tls(client_env(pki, with_cert=False))
        assert outcomes(hand_off(target, only_ca, batch)) == [(Outcome.ACCEPTED, "")]


def test_server_name_checks_the_name_in_the_notifiers_certificate(
    notifier_settings: NotifierSettings, tmp_path: Path, user: str
) -> None:
    """The notifier's certificate names it by DNS only, not by the address dialled:
    refused, unless REMINDERS_NOTIFIER_TLS_SERVER_NAME says which name to check."""
    authority = Authority(tmp_path)
    named = Pki(
        authority.cert,
        authority.issue("notifier", dns=("notifier.reminders.test",)),
        authority.issue("client"),
    )
    batch = rings(user, 1)
    with notifier_serving(notifier_settings, server_env(named)) as target:
        assert target.startswith(LOCALHOST)
        plain = dispatcher_tls(client_env(named))
        assert outcomes(hand_off(target, plain, batch)) == [(Outcome.RETRYABLE, REFUSED)]
        wrong = dispatcher_tls(client_env(named) | {f"{CLIENT}SERVER_NAME": "other.reminders.test"})
        assert outcomes(hand_off(target, wrong, batch)) == [(Outcome.RETRYABLE, REFUSED)]
        right = dispatcher_tls(
            client_env(named) | {f"{CLIENT}SERVER_NAME": "notifier.reminders.test"}
        )
        assert outcomes(hand_off(target, right, batch)) == [(Outcome.ACCEPTED, "")]


def test_the_dispatchers_renewed_certificates_are_used_without_a_restart(
    notifier_settings: NotifierSettings, tmp_path: Path, user: str, caplog: pytest.LogCaptureFixture
) -> None:
    """cert-manager moves both sides to a new CA: the notifier comes back on it (a pod
    restarted; its connections are also closed every few minutes), and the dispatcher,
    still running, trusts the new CA and presents its renewed certificate from its next
    call on. Files that changed but cannot be used (a key not the certificate's) keep the
    previous ones in use, and the log says so."""
    caplog.set_level(logging.INFO, logger="reminders_svc.tls")
    files = MountedClientFiles(tmp_path)
    tls = dispatcher_tls(
        {
            f"{CLIENT}CA_FILE": str(files.ca),
            f"{CLIENT}CERT_FILE": str(files.mounted.cert),
            f"{CLIENT}KEY_FILE": str(files.mounted.key),
        }
    )
    on_one_port = dataclasses.replace(notifier_settings, port=free_port())

    def notifier_of(authority: Authority) -> AbstractContextManager[str]:
        served = authority.issue(f"notifier-of-{authority.cert.stem}", ips=(LOCALHOST,))
        return notifier_serving(
            on_one_port,
            {
                f"{SERVER}CERT_FILE": str(served.cert),
                f"{SERVER}KEY_FILE": str(served.key),
                f"{SERVER}CLIENT_CA_FILE": str(authority.cert),
            },
        )

    async def renewed_files_are_looked_at() -> None:
        await asyncio.sleep(TLS_LOOK_EVERY_S + 0.2)

    async def rotate() -> list[list[tuple[Outcome, str]]]:
        client = NotifierClient(f"{LOCALHOST}:{on_one_port.port}", timeout_s=10, tls=tls)
        answers = []
        try:
            with notifier_of(files.old):
                answers.append(outcomes(await client.send(rings(user, 1))))
            with notifier_of(files.new):
                files.break_pair()
                await renewed_files_are_looked_at()
                answers.append(outcomes(await client.send(rings(user, 1))))
                files.renew()
                await renewed_files_are_looked_at()
                answers.append(outcomes(await client.send(rings(user, 1))))
        finally:
            await client.close()
        return answers

    assert asyncio.run(rotate()) == [
        [(Outcome.ACCEPTED, "")],
        [
            (Outcome.RETRYABLE, REFUSED)
        ],  # still the old files: the new notifier and they do not trust each other
        [(Outcome.ACCEPTED, "")],
    ]
    assert f"is not the key of {CLIENT}CERT_FILE={str(files.mounted.cert)!r}" in caplog.text
    assert files.renewed_log_line() in caplog.text
    assert "BEGIN" not in caplog.text  # never a file's contents


# -- settings ------------------------------------------------------------------------------


def test_unset_means_plaintext_on_both_sides() -> None:
    assert DispatcherSettings.from_env({}).notifier_tls is None
    assert notifier_settings({}).tls is None


def test_tls_settings_are_read_at_startup_and_never_show_the_key(pki: Pki) -> None:
    dispatcher = DispatcherSettings.from_env(client_env(pki) | {f"{CLIENT}SERVER_NAME": "n.test"})
    notifier = notifier_settings(server_env(pki))
    tls, served = dispatcher.notifier_tls, notifier.tls
    assert tls is not None
    assert served is not None
    assert tls.ca.data == pki.ca.read_bytes()
    assert tls.key is not None
    assert tls.key.data == pki.client.key.read_bytes()
    assert tls.server_name == "n.test"
    assert tls.channel_options() == (("grpc.ssl_target_name_override", "n.test"),)
    assert served.mutual
    assert served.key.data == pki.server.key.read_bytes()
    for shown in (repr(dispatcher), repr(notifier)):
        assert "PRIVATE KEY" not in shown
        assert str(pki.client.key) in shown or str(pki.server.key) in shown


def _bad_files(folder: Path, pki: Pki, stranger: Authority) -> dict[str, Path]:
    secret = folder / "secret.key"
    secret.write_text("SECRET-KEY-MATERIAL-1f9 (not PEM)\n")
    broken = folder / "broken.key"
    broken.write_text(
        "-----BEGIN PRIVATE KEY-----\nSECRET-KEY-MATERIAL-1f9\n-----END PRIVATE KEY-----\n"
    )
    return {
        "missing": folder / "missing.pem",
        "directory": folder,
        "secret": secret,
        "broken": broken,
        "key": pki.client.key,
        "other key": stranger.issue("other").key,
    }


ClientCase = tuple[dict[str, str], str]


@pytest.mark.parametrize(
    "case",
    [
        # (variables, by name -> file alias or value; the message's start)
        ({"CA_FILE": "missing"}, f"{CLIENT}CA_FILE='{{missing}}': cannot read it (No such file"),
        ({"CA_FILE": "directory"}, f"{CLIENT}CA_FILE='{{directory}}': cannot read it (Is a dir"),
        ({"CA_FILE": "key"}, f"{CLIENT}CA_FILE='{{key}}': holds no PEM certificate"),
        (
            {"CA_FILE": "ca", "CERT_FILE": "cert"},
            f"set both {CLIENT}CERT_FILE and {CLIENT}KEY_FILE, or neither",
        ),
        (
            {"CA_FILE": "ca", "KEY_FILE": "key"},
            f"set both {CLIENT}CERT_FILE and {CLIENT}KEY_FILE, or neither",
        ),
        (
            {"CERT_FILE": "cert", "KEY_FILE": "key"},
            f"{CLIENT}CERT_FILE, {CLIENT}KEY_FILE need {CLIENT}CA_FILE (it turns TLS on)",
        ),
        ({"SERVER_NAME": "n.test"}, f"{CLIENT}SERVER_NAME needs {CLIENT}CA_FILE"),
        (
            {"CA_FILE": "ca", "CERT_FILE": "cert", "KEY_FILE": "missing"},
            f"{CLIENT}KEY_FILE='{{missing}}': cannot read it",
        ),
        (
            {"CA_FILE": "ca", "CERT_FILE": "cert", "KEY_FILE": "secret"},
            f"{CLIENT}KEY_FILE='{{secret}}': not a PEM file",
        ),
        (
            {"CA_FILE": "ca", "CERT_FILE": "cert", "KEY_FILE": "broken"},
            f"{CLIENT}KEY_FILE='{{broken}}': not an unencrypted PEM private key",
        ),
        (
            {"CA_FILE": "ca", "CERT_FILE": "cert", "KEY_FILE": "other key"},
            f"{CLIENT}KEY_FILE='{{other key}}' is not the key of {CLIENT}CERT_FILE='{{cert}}'",
        ),
        ({"CA_FILE": "ca", "SERVER_NAME": "two words"}, f"{CLIENT}SERVER_NAME='two words'"),
    ],
    ids=lambda case: ",".join(f"{k}={v}" for k, v in case[0].items()),
)
def test_dispatcher_tls_settings_errors_name_the_variable(
    case: ClientCase, pki: Pki, stranger: Authority, tmp_path: Path
) -> None:
    variables, expected = case
    files = _bad_files(tmp_path, pki, stranger) | {
        "ca": pki.ca,
        "cert": pki.client.cert,
    }
    env = {CLIENT + name: str(files.get(value, value)) for name, value in variables.items()}
    with pytest.raises(ConfigError) as refused:
        DispatcherSettings.from_env(env)
    message = str(refused.value)
    assert message.startswith(expected.format_map({k: str(v) for k, v in files.items()}))
    assert "SECRET-KEY-MATERIAL" not in message


ServerReader = Callable[[Mapping[str, str]], object]
SERVERS: dict[str, tuple[str, ServerReader]] = {
    "notifier": (SERVER, notifier_settings),
    "api": ("REMINDERS_API_TLS_", ApiSettings.from_env),
}


@pytest.mark.parametrize("process", SERVERS)
def test_server_tls_settings_errors_name_the_variable(
    process: str, pki: Pki, stranger: Authority, tmp_path: Path
) -> None:
    """The notifier's port and the API's follow the same rules, each under its prefix."""
    prefix, read = SERVERS[process]
    files = _bad_files(tmp_path, pki, stranger)
    cert, key, ca = str(pki.server.cert), str(pki.server.key), str(pki.ca)
    cases = [
        ({"CERT_FILE": cert}, f"set both {prefix}CERT_FILE and {prefix}KEY_FILE, or neither"),
        ({"CLIENT_CA_FILE": ca}, f"{prefix}CLIENT_CA_FILE needs {prefix}CERT_FILE and _KEY_FILE"),
        (
            {"CERT_FILE": str(files["missing"]), "KEY_FILE": key},
            f"{prefix}CERT_FILE='{files['missing']}': cannot read it",
        ),
        (
            {"CERT_FILE": cert, "KEY_FILE": str(files["secret"])},
            f"{prefix}KEY_FILE='{files['secret']}': not a PEM file",
        ),
        (
            {"CERT_FILE": cert, "KEY_FILE": str(files["other key"])},
            f"{prefix}KEY_FILE='{files['other key']}' is not the key of {prefix}CERT_FILE",
        ),
        (
            {"CERT_FILE": cert, "KEY_FILE": key, "CLIENT_CA_FILE": str(files["directory"])},
            f"{prefix}CLIENT_CA_FILE='{files['directory']}': cannot read it",
        ),
    ]
    for variables, expected in cases:
        with pytest.raises(ConfigError) as refused:
            read({prefix + name: value for name, value in variables.items()})
        assert str(refused.value).startswith(expected), variables
        assert "SECRET-KEY-MATERIAL" not in str(refused.value)
    read({prefix + "CERT_FILE": cert, prefix + "KEY_FILE": key, prefix + "CLIENT_CA_FILE": ca})


def test_the_server_and_client_variables_do_not_overlap(pki: Pki) -> None:
    """One ConfigMap feeds both processes in Kubernetes: the dispatcher's client
    certificate must not become the notifier's server certificate, nor the reverse."""
    assert notifier_settings(client_env(pki)).tls is None
    assert DispatcherSettings.from_env(server_env(pki)).notifier_tls is None


def test_a_cert_file_may_hold_a_chain(pki: Pki, tmp_path: Path) -> None:
    """The leaf first, then intermediates, as a CA hands them out."""
    chain = tmp_path / "chain.pem"
    shutil.copy(pki.client.cert, chain)
    with chain.open("ab") as out:
        out.write(pki.ca.read_bytes())
    tls = dispatcher_tls(client_env(pki) | {f"{CLIENT}CERT_FILE": str(chain)})
    assert tls is not None
    assert tls.cert is not None
    assert tls.cert.data == chain.read_bytes()
