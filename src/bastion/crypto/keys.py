"""The gateway's Ed25519 signing key and the public keys that verify its claims (DESIGN section 4).

This is the hazmat boundary (STYLE "crypto/"): key bytes live here and in
``sign.py`` only. Everything else holds a :class:`Keyring` (which can sign
through :func:`bastion.crypto.sign.sign_claim`) or a :class:`VerifyingKey`
(which can only verify), and names keys by their key id.

Layout of the data directory::

    <data_dir>/keys/             mode 0700
        signing.pem              the active private key, PKCS#8 PEM, mode 0600
        public/<key_id>.pem      every public key this gateway ever signed with
        bastion-keys.json        the published key set (``key_set.py``), signed at rotation

A key id is the RFC 7638 JWK thumbprint of the public key (base64url SHA-256,
no padding), so anyone holding the public key can recompute it. Rotation
writes a new private key over the old one (the old private key is gone) and
keeps the old public key under ``public/``, so claims signed before the
rotation still verify.

Fail closed: a signing key file readable by group or others, a symlink, or a
key that is not Ed25519 is refused with :class:`KeyringError`; the gateway
never falls back to an ephemeral key.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bastion.crypto.jcs import canonical_json
from bastion.crypto.key_set import key_set_body, sign_key_set
from bastion.crypto.public_key import KeyringError, VerifyingKey, b64url_decode, b64url_encode

__all__ = [
    "Keyring",
    "KeyringError",
    "UnknownKeyId",
    "VerifyingKey",
    "b64url_decode",
    "b64url_encode",
]

_KEY_DIR = "keys"
_SIGNING_FILE = "signing.pem"
_PUBLIC_DIR = "public"
_KEY_SET_FILE = "bastion-keys.json"
_KEY_ID_RE = re.compile(r"[A-Za-z0-9_-]{43}")


class UnknownKeyId(KeyringError):
    """No public key with this key id is kept in the data directory."""


class Keyring:
    """The active signing key of one data directory, plus every public key it ever used.

    Open it with :meth:`open`. It signs only through
    :func:`bastion.crypto.sign.sign_claim`; no method hands out private key bytes.
    Rotate from one process at a time: another process holding the same data
    directory keeps signing with the key it loaded until it reopens.
    """

    __slots__ = ("_dir", "_private", "_verifying")

    def __init__(self, key_dir: Path, private: Ed25519PrivateKey) -> None:
        self._dir = key_dir
        self._private = private
        self._verifying = VerifyingKey(private.public_key())

    @classmethod
    def open(cls, data_dir: Path) -> Keyring:
        """Load the signing key under ``data_dir``, creating it (mode 0600) on first use.

        Raises :class:`KeyringError` when the key directory is writable by
        group or others, or the key file is a symlink, is not a regular file,
        is readable or writable by group or others, or does not hold an
        Ed25519 private key.
        """
        key_dir = data_dir / _KEY_DIR
        key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = stat.S_IMODE(os.stat(key_dir).st_mode)
        if mode & 0o022:
            # Whoever can write the directory can swap the key files.
            raise KeyringError(
                f"key directory {key_dir} has mode {mode:04o}; it must not be group/other-writable"
            )
        (key_dir / _PUBLIC_DIR).mkdir(mode=0o700, exist_ok=True)
        signing = key_dir / _SIGNING_FILE
        if not os.path.lexists(signing):
            _install_new_key(key_dir, replace=False)
        keyring = cls(key_dir, _load_private(signing))
        keyring._keep_public(keyring._verifying)
        if keyring._published_active() != keyring.key_id:
            # First use, or a data directory from before key sets: the active key signs alone.
            keyring._publish((keyring._private,))
        return keyring

    @property
    def key_id(self) -> str:
        """The key id of the active signing key."""
        return self._verifying.key_id

    @property
    def active(self) -> VerifyingKey:
        """The public half of the active signing key."""
        return self._verifying

    def rotate(self) -> str:
        """Replace the signing key with a fresh one and return its key id.

        The old public key stays under ``public/`` so old claims keep verifying;
        the old private key is overwritten. Issue the claims of sessions that
        the old key opened (close reason ``rotation``) before rotating.
        """
        self._keep_public(self._verifying)
        previous = self._private
        private = _install_new_key(self._dir, replace=True)
        self._private = private
        self._verifying = VerifyingKey(private.public_key())
        self._keep_public(self._verifying)
        # The previous key endorses its successor before its private half is gone.
        self._publish((private, previous))
        return self._verifying.key_id

    def key_set(self) -> dict[str, Any]:
        """The published key set document (``key_set.py``), as last signed."""
        document: dict[str, Any] = json.loads((self._dir / _KEY_SET_FILE).read_bytes())
        return document

    def _published_active(self) -> str | None:
        try:
            active = json.loads((self._dir / _KEY_SET_FILE).read_bytes()).get("active")
        except (OSError, ValueError, AttributeError):
            return None
        return active if isinstance(active, str) else None

    def _publish(self, signers: tuple[Ed25519PrivateKey, ...]) -> None:
        body = key_set_body(self.verifying_keys(), self._verifying, issued_at=int(time.time()))
        document = sign_key_set(body, signers)
        _write_file(self._dir / _KEY_SET_FILE, canonical_json(document) + b"\n", mode=0o644, replace=True)

    def verifying_key(self, key_id: str) -> VerifyingKey:
        """The public key with this id, current or retired; raises :class:`UnknownKeyId`."""
        if not _KEY_ID_RE.fullmatch(key_id):
            raise UnknownKeyId(f"not a key id: {key_id!r}")
        if key_id == self._verifying.key_id:
            return self._verifying
        path = self._dir / _PUBLIC_DIR / f"{key_id}.pem"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise UnknownKeyId(f"no public key {key_id!r} in {self._dir / _PUBLIC_DIR}") from None
        key = VerifyingKey.from_pem(data)
        if key.key_id != key_id:
            raise KeyringError(f"{path} holds key {key.key_id!r}, not {key_id!r}")
        return key

    def verifying_keys(self) -> list[VerifyingKey]:
        """Every public key kept in the data directory, sorted by key id."""
        ids = sorted(p.stem for p in (self._dir / _PUBLIC_DIR).glob("*.pem"))
        return [self.verifying_key(key_id) for key_id in ids]

    def _sign(self, message: bytes) -> bytes:
        """Ed25519 signature by the active key. Package-private: call ``sign_claim``."""
        return self._private.sign(message)

    def _keep_public(self, key: VerifyingKey) -> None:
        path = self._dir / _PUBLIC_DIR / f"{key.key_id}.pem"
        if not path.exists():
            _write_file(path, key.to_pem(), mode=0o644, replace=True)


def _load_private(path: Path) -> Ed25519PrivateKey:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise KeyringError(f"signing key {path} is missing") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        raise KeyringError(f"signing key {path} is not a regular file")
    if info.st_mode & 0o077:
        raise KeyringError(
            f"signing key {path} has mode {stat.S_IMODE(info.st_mode):04o}; it must be 0600 (owner only)"
        )
    try:
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise KeyringError(f"signing key {path} is not a PEM private key: {exc}") from exc
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyringError(f"signing key {path} is not an Ed25519 key: {type(private).__name__}")
    return private


def _install_new_key(key_dir: Path, *, replace: bool) -> Ed25519PrivateKey:
    """Write a fresh key to ``signing.pem`` (0600) atomically; returns the key now installed.

    On first use two processes may race: the loser keeps the winner's key.
    """
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )
    # The public half is written before the private key is installed, so a
    # claim signed by any installed key can always find its verifying key.
    public = VerifyingKey(private.public_key())
    _write_file(key_dir / _PUBLIC_DIR / f"{public.key_id}.pem", public.to_pem(), mode=0o644, replace=True)
    target = key_dir / _SIGNING_FILE
    if replace:
        _write_file(target, pem, mode=0o600, replace=True)
        return private
    try:
        _write_file(target, pem, mode=0o600, replace=False)
    except FileExistsError:
        return _load_private(target)
    return private


def _write_file(path: Path, data: bytes, *, mode: int, replace: bool) -> None:
    """Write ``data`` to a private temporary file, fsync it, then move it into place.

    ``replace=False`` links instead of renaming, so an existing file is never
    overwritten (``FileExistsError``).
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # the umask may have narrowed it; never wider than mode
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
