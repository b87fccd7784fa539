"""The settings the flags give: flags over ``BLOCKPOOL_*`` environment
settings over defaults; the token read from ``--token-file``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from app.shared.settings import ObserverSettings, Settings

S = TypeVar("S", bound=BaseSettings)


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags give (those left out are None)."""
    skip = {"command", "log_level", "token_file", "mirror", "mirror_wait"}
    given = {k: v for k, v in vars(args).items() if k not in skip and v is not None}
    token_file = getattr(args, "token_file", None)
    if token_file is not None:
        given["token"] = read_token_file(token_file)
    return given


class TokenFileError(ValueError):
    """The --token-file could not be read (exit 2)."""


def read_token_file(path: str) -> str:
    """The first line of ``path``, without its line ending."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline(65536)
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"--token-file {path}: {exc}") from None
    token = first.rstrip("\r\n")
    if not token.strip():
        raise TokenFileError(f"--token-file {path}: line 1 is empty (no token)")
    return token


def settings_from(args: argparse.Namespace) -> Settings:
    given = _given(args)
    # an endpoint flag turns the publisher on unless --no-kv-events says otherwise
    if "kv_events_publisher" not in given and any(
        k in given for k in ("kv_events_endpoint", "kv_events_replay_endpoint")
    ):
        given["kv_events_publisher"] = True
    return Settings(**given)


def observer_settings_from(args: argparse.Namespace) -> ObserverSettings:
    return ObserverSettings(**_given(args))


def settings_or_none(
    build: Callable[[argparse.Namespace], S], args: argparse.Namespace, prog: str
) -> S | None:
    """The settings from the flags, or None once it said why they are not."""
    try:
        return build(args)
    except ValidationError as exc:
        # each field and what is wrong, not the input (a URL may hold a secret)
        lines = [
            f"  {'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        ]
        print(f"{prog}: invalid settings:\n" + "\n".join(lines), file=sys.stderr)
    except TokenFileError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
    return None
