"""Authentication without a server: tokens in, user ids or domain errors out."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import jwt
import pytest

from reminders_svc.api.auth import (
    DEV_ADMIN_SECRET,
    DEV_USER_SECRET,
    Authenticator,
    AuthSettings,
    Metadata,
    mint_token,
)
from reminders_svc.config import ConfigError
from reminders_svc.domain.errors import PermissionDenied, Unauthenticated
from tests.pki import rsa_token_keys
from tests.platform.helpers import run_cli

USER_SECRET = "u" * 40
ADMIN_SECRET = "a" * 40
CONFIGURED = {"REMINDERS_JWT_SECRET": USER_SECRET, "REMINDERS_ADMIN_JWT_SECRET": ADMIN_SECRET}


def authenticator(env: Mapping[str, str] = CONFIGURED) -> Authenticator:
    return Authenticator(AuthSettings.from_env(env))


def bearer(token: str) -> Metadata:
    return [("authorization", f"Bearer {token}")]


def signed(claims: dict[str, object], key: str = USER_SECRET, algorithm: str = "HS256") -> str:
    return jwt.encode(claims, key, algorithm=algorithm)


def claims(**overrides: object) -> dict[str, object]:
    now = int(time.time())
    return {"sub": "alice", "aud": "reminders", "iat": now, "exp": now + 300, **overrides}


def test_a_good_token_names_its_subject() -> None:
    assert authenticator().user_id(bearer(signed(claims()))) == "alice"


def test_minted_token_and_bytes_metadata_are_accepted() -> None:
    settings = AuthSettings.from_env(CONFIGURED)
    token = mint_token(settings.user, "bob", 60)
    assert Authenticator(settings).user_id([("authorization", f"Bearer {token}".encode())]) == "bob"


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ([], "missing"),
        ([("authorization", "Basic dXNlcjpwdw==")], "malformed"),
        ([("authorization", "Bearer")], "malformed"),
        ([("authorization", "Bearer not.a.jwt")], "invalid"),
        ([("authorization", "Bearer x"), ("authorization", "Bearer y")], "more than one"),
    ],
)
def test_missing_or_malformed_credentials(metadata: Metadata, message: str) -> None:
    with pytest.raises(Unauthenticated, match=message):
        authenticator().user_id(metadata)


def _without(claim: str) -> dict[str, object]:
    return {k: v for k, v in claims().items() if k != claim}


# Built when each test runs, not at import: a token minted at collection could expire
# before a long suite reaches it, and fail for the wrong reason.
@pytest.mark.parametrize(
    ("token", "message"),
    [
        (lambda: signed(claims(), key="x" * 40), "signature"),
        (lambda: signed(claims(exp=int(time.time()) - 120)), "expired"),
        (lambda: signed(claims(aud="someone-else")), "audience"),
        (lambda: signed(_without("exp")), "'exp'"),
        (lambda: signed(_without("sub")), "'sub'"),
        (lambda: signed(_without("iat")), "'iat'"),
        (lambda: signed(claims(exp=int(time.time()) + 25 * 3600)), "lifetime"),
        (lambda: signed(claims(), key="u" * 64, algorithm="HS512"), "invalid"),
        (lambda: jwt.encode(claims(), "", algorithm="none"), "invalid"),
        # A user id the notifier could never ring for (notifier/domain/model.py).
        (lambda: signed(claims(sub="é" * 129)), "longer than 256 bytes"),
        # Valid JSON, not valid Unicode: was an INTERNAL error and a traceback in the log.
        (lambda: signed(claims(sub="\ud800")), "subject invalid"),
        # JSON integers past a float's range: were an INTERNAL error and a traceback too.
        (lambda: signed(claims(exp=10**400)), "out of range"),
        (lambda: signed(claims(iat=-(10**400))), "out of range"),
    ],
    ids=[
        "bad-signature",
        "expired",
        "wrong-audience",
        "no-exp",
        "no-sub",
        "no-iat",
        "lives-over-a-day",
        "other-alg",
        "alg-none",
        "sub-over-256-bytes",
        "sub-lone-surrogate",
        "exp-past-float",
        "iat-past-float",
    ],
)
def test_rejected_tokens(token: Callable[[], str], message: str) -> None:
    with pytest.raises(Unauthenticated, match=message):
        authenticator().user_id(bearer(token()))


def test_an_admin_token_may_live_an_hour_at_most_unless_configured() -> None:
    two_hours = claims(sub="ops", aud="reminders-admin", exp=int(time.time()) + 7200)
    with pytest.raises(Unauthenticated, match="invalid admin credential"):
        authenticator().require_admin(bearer(signed(two_hours, key=ADMIN_SECRET)))
    longer = authenticator({**CONFIGURED, "REMINDERS_ADMIN_JWT_MAX_LIFETIME_S": "7200"})
    assert longer.require_admin(bearer(signed(two_hours, key=ADMIN_SECRET))) == "ops"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("REMINDERS_JWT_LEEWAY_S", "inf", "expected a number"),
        ("REMINDERS_JWT_LEEWAY_S", "nan", "expected a number"),
        ("REMINDERS_JWT_LEEWAY_S", "-100", "expected 0 to 300"),
        ("REMINDERS_JWT_LEEWAY_S", "1e9", "expected 0 to 300"),
        ("REMINDERS_JWT_MAX_LIFETIME_S", "0", "expected 60 to"),
        ("REMINDERS_ADMIN_JWT_MAX_LIFETIME_S", "1e12", "expected 60 to 86400"),
    ],
)
def test_token_checks_that_would_accept_any_token_are_refused_at_startup(
    name: str, value: str, message: str
) -> None:
    """A leeway of inf or nan accepted a token expired ten years ago."""
    with pytest.raises(ConfigError, match=f"^{name}.*{message}"):
        AuthSettings.from_env({**CONFIGURED, name: value})


@pytest.mark.parametrize("ttl_s", [0, -60, 25 * 3600, math.inf, math.nan])
def test_mint_refuses_a_lifetime_the_server_would_refuse(ttl_s: float) -> None:
    with pytest.raises(ConfigError, match="lifetime"):
        mint_token(AuthSettings.from_env(CONFIGURED).user, "alice", ttl_s)


def test_a_configured_audience_replaces_the_default() -> None:
    auth = authenticator({**CONFIGURED, "REMINDERS_JWT_AUDIENCE": "bff"})
    assert auth.user_id(bearer(signed(claims(aud="bff")))) == "alice"
    with pytest.raises(Unauthenticated):
        auth.user_id(bearer(signed(claims())))


def test_rs256_public_key(tmp_path: Path) -> None:
    private_pem, public_file = rsa_token_keys(tmp_path)
    auth = authenticator(
        {"REMINDERS_JWT_PUBLIC_KEY_FILE": public_file, "REMINDERS_ADMIN_JWT_SECRET": ADMIN_SECRET}
    )
    assert auth.user_id(bearer(signed(claims(), key=private_pem, algorithm="RS256"))) == "alice"
    other_pem, _ = rsa_token_keys(tmp_path / "other")
    with pytest.raises(Unauthenticated, match="signature"):
        auth.user_id(bearer(signed(claims(), key=other_pem, algorithm="RS256")))
    # The public key is public: an HS256 token signed with it must not pass (alg confusion).
    with pytest.raises(Unauthenticated):
        auth.user_id(bearer(jwt.encode(claims(), "forged" * 8, algorithm="HS256")))


def test_a_key_file_of_several_keys_accepts_tokens_of_each_during_a_rollover(
    tmp_path: Path,
) -> None:
    old_pem, old_public = rsa_token_keys(tmp_path / "old")
    new_pem, new_public = rsa_token_keys(tmp_path / "new")
    stranger_pem, _ = rsa_token_keys(tmp_path / "stranger")
    both = tmp_path / "both.pem"
    both.write_text(Path(old_public).read_text() + Path(new_public).read_text())
    auth = authenticator(
        {"REMINDERS_JWT_PUBLIC_KEY_FILE": str(both), "REMINDERS_ADMIN_JWT_SECRET": ADMIN_SECRET}
    )

    def rs256(private_pem: str, **overrides: object) -> Metadata:
        return bearer(signed(claims(**overrides), key=private_pem, algorithm="RS256"))

    assert auth.user_id(rs256(old_pem)) == "alice"
    assert auth.user_id(rs256(new_pem, sub="bob")) == "bob"
    with pytest.raises(Unauthenticated, match="signature invalid"):
        auth.user_id(rs256(stranger_pem))
    # The claims are still checked when the second key is the one that verifies.
    with pytest.raises(Unauthenticated, match="expired"):
        auth.user_id(rs256(new_pem, iat=int(time.time()) - 600, exp=int(time.time()) - 300))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not a PEM file"),
        (
            b"-----BEGIN CERTIFICATE-----\nbm90IGEga2V5\n-----END CERTIFICATE-----\n",
            "expected a PEM public key",
        ),
        (b"-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n", "not a valid"),
        # Not text at all (a DER key, say): refused as such, not a decoding traceback.
        (b"\xff\xfe-----BEGIN PUBLIC KEY-----\n\xff\n-----END PUBLIC KEY-----\n", "not a valid"),
    ],
)
def test_a_key_file_without_a_usable_key_is_refused_at_startup(
    tmp_path: Path, content: bytes, message: str
) -> None:
    key_file = tmp_path / "keys.pem"
    key_file.write_bytes(content)
    with pytest.raises(ConfigError, match=f"REMINDERS_JWT_PUBLIC_KEY_FILE=.*{message}"):
        AuthSettings.from_env(
            {
                "REMINDERS_JWT_PUBLIC_KEY_FILE": str(key_file),
                "REMINDERS_ADMIN_JWT_SECRET": ADMIN_SECRET,
            }
        )


def test_an_rsa_key_shorter_than_2048_bits_is_refused_at_startup(tmp_path: Path) -> None:
    """A 1024-bit modulus is within reach of factoring: whoever does it forges any token.
    It was accepted, PyJWT's warning logged nowhere."""
    _, short = rsa_token_keys(tmp_path, bits=1024)
    with pytest.raises(ConfigError, match=r"REMINDERS_JWT_PUBLIC_KEY_FILE=.*1024 bits"):
        AuthSettings.from_env(
            {"REMINDERS_JWT_PUBLIC_KEY_FILE": short, "REMINDERS_ADMIN_JWT_SECRET": ADMIN_SECRET}
        )


def test_one_identity_providers_key_may_verify_both_kinds_which_their_audiences_tell_apart(
    tmp_path: Path,
) -> None:
    """A public key signs nothing: one provider key for both credentials is allowed, in
    whatever PEM spelling (refusing the same file alone was no protection: the same key in
    another spelling passed). A user token then still never passes for an admin one."""
    provider_pem, provider_public = rsa_token_keys(tmp_path)
    auth = authenticator(
        {
            "REMINDERS_JWT_PUBLIC_KEY_FILE": provider_public,
            "REMINDERS_ADMIN_JWT_PUBLIC_KEY_FILE": provider_public,
        }
    )
    user_token = signed(claims(sub="alice"), key=provider_pem, algorithm="RS256")
    admin_token = signed(
        claims(sub="ops", aud="reminders-admin"), key=provider_pem, algorithm="RS256"
    )

    assert auth.user_id(bearer(user_token)) == "alice"
    assert auth.require_admin(bearer(admin_token)) == "ops"
    with pytest.raises(PermissionDenied):
        auth.require_admin(bearer(user_token))
    with pytest.raises(Unauthenticated, match="audience"):
        auth.user_id(bearer(admin_token))


def test_a_configured_issuer_is_required_and_checked(tmp_path: Path) -> None:
    """An identity provider signs for many services with one key: `iss` tells them apart."""
    private_pem, public_file = rsa_token_keys(tmp_path)
    issuer = "https://idp.example.com"
    auth = authenticator(
        {
            "REMINDERS_JWT_PUBLIC_KEY_FILE": public_file,
            "REMINDERS_JWT_ISSUER": issuer,
            "REMINDERS_ADMIN_JWT_SECRET": ADMIN_SECRET,
        }
    )

    def rs256(**overrides: object) -> Metadata:
        return bearer(signed(claims(**overrides), key=private_pem, algorithm="RS256"))

    assert auth.user_id(rs256(iss=issuer)) == "alice"
    with pytest.raises(Unauthenticated, match="issuer not accepted"):
        auth.user_id(rs256(iss="https://other.example.com"))
    with pytest.raises(Unauthenticated, match="'iss' claim"):
        auth.user_id(rs256())
    # Without the setting, `iss` is not looked at (as before).
    unset = authenticator(
        {"REMINDERS_JWT_PUBLIC_KEY_FILE": public_file, "REMINDERS_ADMIN_JWT_SECRET": ADMIN_SECRET}
    )
    assert unset.user_id(rs256(iss="https://other.example.com")) == "alice"


def test_an_expired_token_for_another_audience_is_refused_for_that_not_as_expired(
    tmp_path: Path,
) -> None:
    """A client renews a token refused as expired (TOKEN_EXPIRED); one never meant for the
    call (another audience, another issuer) must not be told to, as renewing would not
    help. With an identity provider's key trusted for users and operators alike (the
    admin file lists it beside the operators' own during a rollover), an expired user
    token on an admin RPC is such a token."""
    shared_pem, shared_public = rsa_token_keys(tmp_path / "shared")
    _, operators_public = rsa_token_keys(tmp_path / "operators")
    admin_keys = tmp_path / "admin.pem"
    admin_keys.write_text(Path(operators_public).read_text() + Path(shared_public).read_text())
    issuer = "https://idp.example.com"
    auth = authenticator(
        {
            "REMINDERS_JWT_PUBLIC_KEY_FILE": shared_public,
            "REMINDERS_JWT_ISSUER": issuer,
            "REMINDERS_ADMIN_JWT_PUBLIC_KEY_FILE": str(admin_keys),
        }
    )
    past = int(time.time()) - 600

    def expired(**overrides: object) -> Metadata:
        token_claims = claims(**{"iat": past, "exp": past + 300, "iss": issuer, **overrides})
        return bearer(signed(token_claims, key=shared_pem, algorithm="RS256"))

    with pytest.raises(Unauthenticated) as user_token_on_admin_rpc:
        auth.require_admin(expired())
    with pytest.raises(Unauthenticated) as another_issuers:
        auth.user_id(expired(iss="https://other.example.com"))
    with pytest.raises(Unauthenticated) as expired_admin_token:
        auth.require_admin(expired(aud="reminders-admin"))

    assert user_token_on_admin_rpc.value.reason != "TOKEN_EXPIRED"
    assert "issuer not accepted" in str(another_issuers.value)
    assert expired_admin_token.value.reason == "TOKEN_EXPIRED"


def test_minted_tokens_carry_the_configured_issuer() -> None:
    settings = AuthSettings.from_env({**CONFIGURED, "REMINDERS_JWT_ISSUER": "reminders-dev"})
    token = mint_token(settings.user, "bob", 60)
    assert Authenticator(settings).user_id(bearer(token)) == "bob"
    assert jwt.decode(token, options={"verify_signature": False})["iss"] == "reminders-dev"


def test_admin_credential_is_separate() -> None:
    auth = authenticator()
    admin_token = signed(claims(sub="ops", aud="reminders-admin"), key=ADMIN_SECRET)
    assert auth.require_admin(bearer(admin_token)) == "ops"
    with pytest.raises(PermissionDenied):
        auth.require_admin(bearer(signed(claims())))
    with pytest.raises(Unauthenticated):
        auth.user_id(bearer(admin_token))
    # The user key with the admin audience is still not an admin credential.
    with pytest.raises(Unauthenticated):
        auth.require_admin(bearer(signed(claims(aud="reminders-admin"))))
    with pytest.raises(Unauthenticated):
        auth.require_admin([])


def test_development_secret_only_with_reminders_env_dev() -> None:
    with pytest.raises(ConfigError, match="REMINDERS_ENV=dev"):
        AuthSettings.from_env({})
    with pytest.raises(ConfigError, match="REMINDERS_ENV=dev"):
        AuthSettings.from_env({"REMINDERS_ENV": "prod"})
    settings = AuthSettings.from_env({"REMINDERS_ENV": "dev"})
    assert settings.user.is_development
    assert settings.user.key.value == DEV_USER_SECRET
    token = mint_token(settings.user, "alice", 60)
    assert Authenticator(settings).user_id(bearer(token)) == "alice"


@pytest.mark.parametrize("environment", [{}, {"REMINDERS_ENV": "prod"}], ids=["unset", "prod"])
@pytest.mark.parametrize(
    ("variable", "secret"),
    [
        ("REMINDERS_JWT_SECRET", DEV_USER_SECRET),
        ("REMINDERS_JWT_SECRET", DEV_ADMIN_SECRET),
        ("REMINDERS_ADMIN_JWT_SECRET", DEV_ADMIN_SECRET),
        ("REMINDERS_ADMIN_JWT_SECRET", DEV_USER_SECRET),
    ],
    ids=["user-key", "admin-secret-as-user-key", "admin-key", "user-secret-as-admin-key"],
)
def test_a_development_secret_set_explicitly_is_refused_outside_dev(
    environment: dict[str, str], variable: str, secret: str
) -> None:
    with pytest.raises(ConfigError, match=f"{variable} .*REMINDERS_ENV=dev") as refused:
        AuthSettings.from_env({**CONFIGURED, **environment, variable: secret})
    assert secret not in str(refused.value)
    # In development it is accepted, and flagged as what it is.
    settings = AuthSettings.from_env({**CONFIGURED, "REMINDERS_ENV": "dev", variable: secret})
    key = settings.user if variable == "REMINDERS_JWT_SECRET" else settings.admin
    assert key.is_development


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REMINDERS_JWT_SECRET": "short", "REMINDERS_ADMIN_JWT_SECRET": ADMIN_SECRET}, "32"),
        (
            {"REMINDERS_JWT_SECRET": USER_SECRET, "REMINDERS_ADMIN_JWT_SECRET": USER_SECRET},
            "differ",
        ),
        ({"REMINDERS_JWT_SECRET": USER_SECRET}, "REMINDERS_ADMIN_JWT_SECRET"),
        ({**CONFIGURED, "REMINDERS_JWT_PUBLIC_KEY_FILE": "/nonexistent"}, "not both"),
        (
            {
                "REMINDERS_JWT_PUBLIC_KEY_FILE": "/nonexistent",
                "REMINDERS_ADMIN_JWT_SECRET": "a" * 40,
            },
            "PUBLIC_KEY_FILE",
        ),
        ({**CONFIGURED, "REMINDERS_JWT_AUDIENCE": "reminders-admin"}, "AUDIENCE"),
        # A secret file's trailing newline: another key than the issuer's, and it hid the
        # development secret from the check below.
        ({**CONFIGURED, "REMINDERS_JWT_SECRET": USER_SECRET + "\n"}, "whitespace"),
        (
            {**CONFIGURED, "REMINDERS_ADMIN_JWT_SECRET": DEV_ADMIN_SECRET + "\n"},
            "REMINDERS_ADMIN_JWT_SECRET: starts or ends with whitespace",
        ),
    ],
)
def test_bad_configuration_fails_at_startup(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AuthSettings.from_env(env)


def test_secrets_never_appear_in_reprs() -> None:
    settings = AuthSettings.from_env(CONFIGURED)
    assert USER_SECRET not in repr(settings)
    assert ADMIN_SECRET not in str(settings)


def test_the_token_command_mints_what_the_server_accepts_and_only_in_dev_or_configured() -> None:
    """`reminders token --user alice [--admin]` as a developer runs it: the printed token
    is the user's (or the operator's) to the server; outside development, with no secret
    configured, it refuses rather than sign with a well-known one."""
    no_secrets = {name: "" for name in (*CONFIGURED, "REMINDERS_ENV")}
    dev = {**no_secrets, "REMINDERS_ENV": "dev"}

    user = run_cli("token", "--user", "alice", env=dev)
    admin = run_cli("token", "--user", "ops", "--admin", env=dev)
    configured = run_cli("token", "--user", "bob", env={**no_secrets, **CONFIGURED})
    refused = run_cli("token", "--user", "alice", env=no_secrets)

    dev_server = authenticator({"REMINDERS_ENV": "dev"})
    assert user.returncode == 0, user.stderr
    assert dev_server.user_id(bearer(user.stdout.strip())) == "alice"
    assert admin.returncode == 0, admin.stderr
    assert dev_server.require_admin(bearer(admin.stdout.strip())) == "ops"
    assert authenticator().user_id(bearer(configured.stdout.strip())) == "bob"
    assert refused.returncode == 2  # a setting missing, as every command's bad configuration
    assert refused.stdout == ""
    assert refused.stderr == (
        "reminders token: it signs with REMINDERS_JWT_SECRET (or REMINDERS_JWT_SECRET_FILE),"
        " or with the development secret when REMINDERS_ENV=dev: set one\n"
    )
