"""Who is calling: bearer JWTs checked against configured keys (DESIGN.md invariant 10).

Two credentials, each with its own key and audience, so a leaked user key can never
mint an admin token:
- users: `REMINDERS_JWT_SECRET` (HS256) or `REMINDERS_JWT_PUBLIC_KEY_FILE` (RS256: one PEM
  public key, or up to 8 while the identity provider rolls its key),
  audience `REMINDERS_JWT_AUDIENCE` (default "reminders"); the user is the `sub`;
- operators: `REMINDERS_ADMIN_JWT_SECRET` or `REMINDERS_ADMIN_JWT_PUBLIC_KEY_FILE`,
  audience "reminders-admin".
With neither configured, development secrets are used, and only when REMINDERS_ENV=dev:
anywhere else the service refuses to start rather than accept forgeable tokens, and
refuses a development secret set explicitly as well (it is published in this file).

Every token needs `exp`, `iat`, `sub` and `aud`; with `REMINDERS_JWT_ISSUER` (or
`REMINDERS_ADMIN_JWT_ISSUER`) set it needs that `iss` too, which an RS256 deployment should
set: an identity provider signs tokens for many services with one key, and the audience
alone may not tell them apart. A token may live (exp - iat) at most
`REMINDERS_JWT_MAX_LIFETIME_S` (a day) or `REMINDERS_ADMIN_JWT_MAX_LIFETIME_S` (an hour):
there is no revocation, so a leaked token is good until it expires. Clocks may differ by
`REMINDERS_JWT_LEEWAY_S` (30 s, at most 300).
"""

from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey

from reminders_svc.config import ConfigError, Env, PemFile, Secret, in_development, secret_setting
from reminders_svc.domain.errors import PermissionDenied, Unauthenticated
from reminders_svc.domain.reminder import MAX_USER_ID_BYTES

Algorithm = Literal["HS256", "RS256"]
Metadata = Sequence[tuple[str, str | bytes]]

USER_AUDIENCE = "reminders"
ADMIN_AUDIENCE = "reminders-admin"
# Known to everyone who reads this file: accepted only when REMINDERS_ENV=dev.
DEV_USER_SECRET = "dev-only-reminders-user-secret-not-for-production"  # noqa: S105
DEV_ADMIN_SECRET = "dev-only-reminders-admin-secret-not-for-production"  # noqa: S105
_DEVELOPMENT_SECRETS = frozenset({DEV_USER_SECRET, DEV_ADMIN_SECRET})
# Tolerated clock difference between the token's issuer and this server.
DEFAULT_LEEWAY_S = 30.0
# The longest a token may be valid (exp - iat): without revocation, a leaked token is good
# until it expires. An operator's credential wipes accounts: shorter.
DEFAULT_USER_MAX_LIFETIME_S = 24 * 3600.0
DEFAULT_ADMIN_MAX_LIFETIME_S = 3600.0
_REQUIRED_CLAIMS = ["exp", "iat", "sub", "aud"]
# An RS256 key file holds one public key, or a few while an identity provider rolls its key.
MAX_PUBLIC_KEYS = 8
_PEM_PUBLIC_KEY = re.compile(
    r"-----BEGIN (RSA )?PUBLIC KEY-----.+?-----END (RSA )?PUBLIC KEY-----", re.DOTALL
)


# NIST SP 800-131A's floor for RSA signatures.
MIN_RSA_BITS = 2048


@dataclass(frozen=True)
class TokenKey:
    """One credential's verification key: an HS256 secret or an RS256 public key (PEM)."""

    algorithm: Algorithm
    key: Secret
    audience: str
    is_development: bool = False
    max_lifetime_s: float = DEFAULT_USER_MAX_LIFETIME_S
    # When set, a token's `iss` must equal it (and tokens minted here carry it).
    issuer: str | None = None
    # RS256: the keys of `key`'s PEM, parsed once; a token signed by any of them passes.
    public_keys: tuple[RSAPublicKey, ...] = field(default=(), repr=False)

    def can_sign(self) -> bool:
        # Only a shared secret signs; an RS256 public key verifies tokens minted elsewhere.
        return self.algorithm == "HS256"


@dataclass(frozen=True)
class AuthSettings:
    user: TokenKey
    admin: TokenKey
    leeway_s: float = DEFAULT_LEEWAY_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AuthSettings:
        env = os.environ if environ is None else environ
        user = user_key_from_env(env)
        admin = admin_key_from_env(env)
        if user.can_sign() and admin.can_sign() and user.key.value == admin.key.value:
            # A shared secret signs: whoever mints user tokens could mint admin ones. (An
            # RS256 public key signs nothing; an identity provider's key may verify both
            # kinds, which their audiences, and issuers when set, tell apart.)
            raise ConfigError(
                "REMINDERS_ADMIN_JWT_SECRET must differ from REMINDERS_JWT_SECRET: "
                "a user key must not be able to mint admin tokens"
            )
        if user.audience == admin.audience:
            raise ConfigError(f"REMINDERS_JWT_AUDIENCE must not be {ADMIN_AUDIENCE!r}")
        leeway_s = Env(env).number("REMINDERS_JWT_LEEWAY_S", DEFAULT_LEEWAY_S, low=0, high=300)
        return cls(user=user, admin=admin, leeway_s=leeway_s)


def user_key_from_env(env: Mapping[str, str]) -> TokenKey:
    """The user credential's key alone (what a client needs to sign its tokens)."""
    return _token_key(
        env,
        prefix="REMINDERS_JWT_",
        audience=env.get("REMINDERS_JWT_AUDIENCE") or USER_AUDIENCE,
        dev_secret=DEV_USER_SECRET,
        max_lifetime_s=Env(env).number(
            "REMINDERS_JWT_MAX_LIFETIME_S", DEFAULT_USER_MAX_LIFETIME_S, low=60, high=30 * 86400
        ),
    )


def admin_key_from_env(env: Mapping[str, str]) -> TokenKey:
    return _token_key(
        env,
        prefix="REMINDERS_ADMIN_JWT_",
        audience=ADMIN_AUDIENCE,
        dev_secret=DEV_ADMIN_SECRET,
        max_lifetime_s=Env(env).number(
            "REMINDERS_ADMIN_JWT_MAX_LIFETIME_S", DEFAULT_ADMIN_MAX_LIFETIME_S, low=60, high=86400
        ),
    )


def _token_key(
    env: Mapping[str, str], *, prefix: str, audience: str, dev_secret: str, max_lifetime_s: float
) -> TokenKey:
    secret = secret_setting(env, prefix + "SECRET")
    key_file = env.get(prefix + "PUBLIC_KEY_FILE") or None
    issuer = env.get(prefix + "ISSUER") or None
    if secret is not None and key_file is not None:
        raise ConfigError(f"set one of {prefix}SECRET and {prefix}PUBLIC_KEY_FILE, not both")
    if secret is not None:
        if secret != secret.strip():
            # A file's trailing newline (`kubectl create secret --from-file`) is a different
            # key from the issuer's, and would hide a development secret from the check.
            raise ConfigError(f"{prefix}SECRET: starts or ends with whitespace (a newline?)")
        published = secret in _DEVELOPMENT_SECRETS
        if published and not in_development(env):
            # Anyone can forge tokens with it; the message names the variable, never the value.
            raise ConfigError(
                f"{prefix}SECRET is a development secret: refused unless REMINDERS_ENV=dev"
            )
        if len(secret) < 32:
            # HS256 with a short secret is brute-forceable offline from any one token.
            raise ConfigError(f"{prefix}SECRET: expected at least 32 characters")
        return TokenKey("HS256", Secret(secret), audience, published, max_lifetime_s, issuer)
    if key_file is not None:
        # PEM is ASCII: anything else fails the key's parse below, naming the variable.
        pem = PemFile.load(f"{prefix}PUBLIC_KEY_FILE", key_file).data.decode("ascii", "replace")
        public_keys = _rsa_public_keys(pem, f"{prefix}PUBLIC_KEY_FILE={key_file!r}")
        return TokenKey("RS256", Secret(pem), audience, False, max_lifetime_s, issuer, public_keys)
    if in_development(env):
        return TokenKey("HS256", Secret(dev_secret), audience, True, max_lifetime_s, issuer)
    raise ConfigError(
        f"no token key: set {prefix}SECRET or {prefix}PUBLIC_KEY_FILE "
        "(development secrets are used only with REMINDERS_ENV=dev)"
    )


def _rsa_public_keys(pem: str, where: str) -> tuple[RSAPublicKey, ...]:
    """The RSA public keys of a PEM file: one, or a few while a provider rolls its key."""
    blocks = [match.group(0) for match in _PEM_PUBLIC_KEY.finditer(pem)]
    if not blocks:
        raise ConfigError(f"{where}: expected a PEM public key")
    if len(blocks) > MAX_PUBLIC_KEYS:
        # Each costs a signature check on a token the others refuse.
        raise ConfigError(f"{where}: {len(blocks)} keys, at most {MAX_PUBLIC_KEYS}")
    keys = []
    for number, block in enumerate(blocks, 1):
        try:
            key = serialization.load_pem_public_key(block.encode())
        except ValueError:
            raise ConfigError(f"{where}: key {number} is not a valid PEM public key") from None
        if not isinstance(key, RSAPublicKey):
            raise ConfigError(f"{where}: key {number} is not an RSA key (RS256)")
        if key.key_size < MIN_RSA_BITS:
            # A shorter modulus is factorable: whoever does it forges any token. (PyJWT
            # only warns, where no log shows it.)
            raise ConfigError(
                f"{where}: key {number} has {key.key_size} bits, at least {MIN_RSA_BITS}"
            )
        keys.append(key)
    return tuple(keys)


def mint_token(key: TokenKey, subject: str, ttl_s: float, *, now: float | None = None) -> str:
    """A token for `subject` valid for `ttl_s` seconds, signed with an HS256 `key`."""
    if not key.can_sign():
        raise ConfigError("an RS256 public key cannot sign: tokens come from your issuer")
    # A token's times are whole seconds: under 1 s it could expire as it is issued.
    if not 1 <= ttl_s <= key.max_lifetime_s:
        raise ConfigError(
            f"a token's lifetime must be at least 1 s and at most {key.max_lifetime_s:g} s "
            "(the server refuses longer ones)"
        )
    issued = time.time() if now is None else now
    claims = {"sub": subject, "aud": key.audience, "iat": int(issued), "exp": int(issued + ttl_s)}
    if key.issuer is not None:
        claims["iss"] = key.issuer
    return jwt.encode(claims, key.key.value, algorithm=key.algorithm)


def bearer_token(metadata: Metadata) -> str:
    """The token of the one `authorization: Bearer ...` entry, or Unauthenticated."""
    values = [value for name, value in metadata if name.lower() == "authorization"]
    if not values:
        raise Unauthenticated(
            "missing authorization metadata: expected 'Bearer <token>'",
            reason="CREDENTIALS_MISSING",
        )
    if len(values) > 1:
        raise Unauthenticated("more than one authorization metadata entry")
    raw = values[0]
    text = raw.decode("ascii", errors="replace") if isinstance(raw, bytes) else raw
    scheme, _, token = text.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("malformed authorization metadata: expected 'Bearer <token>'")
    return token.strip()


class Authenticator:
    """Turns call metadata into the caller's identity; raises domain errors otherwise.

    A token whose signature checked out is remembered (by its exact text, per key) until it
    expires, so a client reusing its token pays the signature check once, not per call.
    """

    _CACHE_SIZE = 10_000

    def __init__(self, settings: AuthSettings) -> None:
        self._settings = settings
        self._verified: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()

    def user_id(self, metadata: Metadata) -> str:
        return self._subject(bearer_token(metadata), self._settings.user)

    def require_admin(self, metadata: Metadata) -> str:
        """The operator's `sub`; a valid user token here is PermissionDenied."""
        token = bearer_token(metadata)
        try:
            return self._subject(token, self._settings.admin)
        except Unauthenticated as refused:
            if refused.reason == "TOKEN_EXPIRED":
                raise  # what the caller is to act on: get a new token
            try:
                self._subject(token, self._settings.user)
            except Unauthenticated:
                raise Unauthenticated("invalid admin credential") from None
            raise PermissionDenied("this operation needs the admin credential") from None

    def _subject(self, token: str, key: TokenKey) -> str:
        cached = self._verified.get((key.audience, token))
        if cached is not None:
            subject, expires = cached
            if time.time() < expires + self._settings.leeway_s:
                self._verified.move_to_end((key.audience, token))  # least recently used goes
                return subject
            del self._verified[(key.audience, token)]
        subject, expires = self._verify(token, key)
        self._verified[(key.audience, token)] = (subject, expires)
        if len(self._verified) > self._CACHE_SIZE:
            self._verified.popitem(last=False)
        return subject

    def _verify(self, token: str, key: TokenKey) -> tuple[str, float]:
        # A provider's key rollover: the token was signed by one of the keys listed.
        for verifier in key.public_keys or (key.key.value,):
            try:
                return self._subject_of(self._decoded(token, verifier, key), key)
            except jwt.InvalidSignatureError:
                continue
        raise Unauthenticated("token signature invalid")

    def _decoded(
        self, token: str, verifier: Any, key: TokenKey, *, check_expiry: bool = True
    ) -> dict[str, Any]:
        """The token's claims, checked with `verifier`; InvalidSignatureError is left to
        the caller (another key may verify it), every other fault is Unauthenticated."""
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                verifier,
                # One algorithm per key: never let the token choose (alg confusion).
                algorithms=[key.algorithm],
                audience=key.audience,
                issuer=key.issuer,
                leeway=self._settings.leeway_s,
                options={
                    "require": _REQUIRED_CLAIMS + (["iss"] if key.issuer else []),
                    "verify_exp": check_expiry,
                },
            )
        except jwt.InvalidSignatureError:
            raise
        except jwt.ExpiredSignatureError:
            # PyJWT checks expiry before audience and issuer. An expired token that was
            # never for this key's audience (a user's on an admin RPC, where one RS256 key
            # serves both) is refused for that: a new token of its kind would not do.
            self._decoded(token, verifier, key, check_expiry=False)
            raise Unauthenticated("token expired", reason="TOKEN_EXPIRED") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated("token audience not accepted") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated("token issuer not accepted") from None
        except jwt.MissingRequiredClaimError as error:
            raise Unauthenticated(f"token lacks the {error.claim!r} claim") from None
        except jwt.InvalidTokenError:
            raise Unauthenticated("token invalid") from None
        return claims

    def _subject_of(self, claims: dict[str, Any], key: TokenKey) -> tuple[str, float]:
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise Unauthenticated("token subject invalid")
        try:
            size = len(subject.encode())
        except UnicodeEncodeError:  # JSON lets a token carry a lone surrogate; no id can
            raise Unauthenticated("token subject invalid") from None
        if size > MAX_USER_ID_BYTES:
            raise Unauthenticated(f"token subject longer than {MAX_USER_ID_BYTES} bytes")
        try:
            expires = float(claims["exp"])
            lifetime = expires - float(claims["iat"])
        except OverflowError:  # PyJWT takes any JSON integer, 10**400 too
            raise Unauthenticated("token times out of range") from None
        if lifetime > key.max_lifetime_s:
            raise Unauthenticated(
                f"token lifetime (exp - iat) above the {key.max_lifetime_s:g} s accepted"
            )
        return subject, expires
