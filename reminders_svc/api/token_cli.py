"""`reminders token --user alice [--admin] [--ttl 3600]`: mint a token for local use.

It signs with the configured HS256 secret, or the development secret when
REMINDERS_ENV=dev; with neither it refuses (see reminders_svc.api.auth).
"""

from __future__ import annotations

import argparse
import os
import sys

from reminders_svc.api.auth import admin_key_from_env, mint_token, user_key_from_env
from reminders_svc.api.client_cli import positive_seconds, user_id
from reminders_svc.config import ConfigError, in_development, secret_setting


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "token",
        help="print a bearer token (needs REMINDERS_ENV=dev or a configured HS256 secret)",
    )
    parser.add_argument(
        "--user", required=True, type=user_id, help="the token's subject (the user id)"
    )
    parser.add_argument("--admin", action="store_true", help="an admin credential instead")
    parser.add_argument(
        "--ttl", type=positive_seconds, default=3600.0, help="seconds (default 3600)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    env = os.environ
    prefix = "REMINDERS_ADMIN_JWT_" if args.admin else "REMINDERS_JWT_"
    try:
        if secret_setting(env, f"{prefix}SECRET") is None and not in_development(env):
            # Said here, not by the key's loader: a server may verify with a public key
            # file, but nothing here can sign with one.
            print(
                f"reminders token: it signs with {prefix}SECRET (or {prefix}SECRET_FILE), or"
                " with the development secret when REMINDERS_ENV=dev: set one",
                file=sys.stderr,
            )
            return 2
        key = admin_key_from_env(env) if args.admin else user_key_from_env(env)
        print(mint_token(key, args.user, args.ttl))
    except ConfigError as error:
        print(f"reminders token: {error}", file=sys.stderr)
        return 2  # as every command's bad configuration
    return 0
