"""Where the HTTP API key comes from: `--api-key`, `--api-key-file PATH` or `$TOKENSPEED_API_KEY`.

A key on the command line is visible to every local user (`ps`, `/proc/PID/cmdline`); the environment
of a process and a file only the owner can read are not. So the key may come from the environment or
from a file, and a file that others could read is refused rather than trusted. The console's
supervisor hands a profile's key to its servers through the environment.

`--api-key-file` is TokenSpeed's own flag (the upstream engine has only `--api-key`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

API_KEY_ENV = "TOKENSPEED_API_KEY"
BEARER = "bearer"


def bearer_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, None for any other scheme. The scheme is
    case-insensitive (RFC 7235 2.1), so `bearer`, `Bearer` and `BEARER` are the same; spaces around the
    token are not part of it."""
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != BEARER:
        return None
    return token.strip() or None


def others_can_read(mode: int) -> bool:
    """A file whose group or others bits are set is not private to its owner."""
    return bool(mode & 0o077)


def read_api_key_file(path: str) -> str:
    """The key in `path` (one line; surrounding whitespace dropped); ValueError names the fix. Every command
    that takes --api-key-file reads it here, so a file others can read is refused by each of them."""
    flag = f"--api-key-file {path}"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ValueError(f"{flag}: no such file; write the key into it (chmod 600)") from None
    except OSError as exc:
        raise ValueError(f"{flag}: cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{flag}: not a regular file")
    if others_can_read(info.st_mode):
        raise ValueError(
            f"{flag}: mode {stat.S_IMODE(info.st_mode):04o} lets group or others read it; "
            f"a key file must be private to its owner: chmod 600 {path}"
        )
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{flag}: cannot be read: {exc}") from None
    if not key:
        raise ValueError(f"{flag}: the file is empty; write the key into it")
    if "\n" in key:
        raise ValueError(f"{flag}: the file holds more than one line; put only the key in it")
    return key


def resolve_api_key(flag_value: str | None, key_file: str | None, environ: Mapping[str, str]) -> str | None:
    """The key a server requires: `--api-key`, else the file, else `$TOKENSPEED_API_KEY`; None: no key."""
    if flag_value is not None and key_file is not None:
        raise ValueError(
            "--api-key and --api-key-file both give the API key; keep --api-key-file "
            f"(or ${API_KEY_ENV}): a key on the command line is visible to every local user"
        )
    if key_file is not None:
        return read_api_key_file(key_file)
    if flag_value is not None:
        return flag_value
    return environ.get(API_KEY_ENV) or None
