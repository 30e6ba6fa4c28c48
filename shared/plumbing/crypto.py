"""Encryption of stored secrets (Linear tokens) and of the OAuth `state`, with Fernet from the
`cryptography` package (authenticated encryption with a timestamp; MultiFernet for rotation).

Keys come from DEVPILOT_ENCRYPTION_KEYS, comma-separated: the first encrypts, every one decrypts,
so a rotation is "add the new key first, re-encrypt, drop the old". Never derived from another
secret: changing the admin token leaves stored credentials readable, and the admin token alone
cannot decrypt a database dump. With the embedded database and no keys set, one key is generated
once under ./.devpilot/ (mode 0600); with DATABASE_URL set and no keys, storing a credential is
refused (503 encryption_not_configured).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.plumbing import local_secrets
from shared.plumbing.settings import Settings

if TYPE_CHECKING:
    from cryptography.fernet import InvalidToken, MultiFernet

__all__ = ["InvalidToken", "NotConfigured", "keys"]


def __getattr__(name: str) -> type[InvalidToken]:
    # `cryptography` is loaded on first use, not on import: the routes an idle fleet calls (claim,
    # ack) never touch a secret, and their cold start should not pay for it.
    if name == "InvalidToken":
        from cryptography.fernet import InvalidToken

        return InvalidToken
    raise AttributeError(name)


class NotConfigured(RuntimeError):
    """No encryption keys: DEVPILOT_ENCRYPTION_KEYS is unset and the database is not embedded."""


def keys(settings: Settings) -> MultiFernet:
    from cryptography.fernet import Fernet, MultiFernet

    if settings.encryption_keys:
        try:
            return MultiFernet([Fernet(k.strip()) for k in settings.encryption_keys.split(",") if k.strip()])
        except ValueError:
            raise NotConfigured("DEVPILOT_ENCRYPTION_KEYS holds a value that is not a Fernet key") from None
    if settings.database_url:
        raise NotConfigured(
            "DEVPILOT_ENCRYPTION_KEYS is not set: generate a key with "
            "`python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`"
        )
    key, _ = local_secrets.read_or_create("encryption.key", Fernet.generate_key)
    return MultiFernet([Fernet(key)])
