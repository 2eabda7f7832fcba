"""Binding an evidence session's chain root into TEE ``report_data`` (DESIGN section 4).

At evidence-session open the gateway asks the platform for an attestation
report whose ``report_data`` carries the chain root, through the Linux
configfs-tsm interface (``Documentation/ABI/testing/configfs-tsm``)::

    mkdir  <root>/<entry>            a private report entry
    write  <entry>/inblob            the 64 bytes of report_data
    read   <entry>/generation        g1
    read   <entry>/outblob           the report (a TDX quote, an SEV-SNP report, ...)
    read   <entry>/provider          e.g. "tdx_guest", "sev_guest"
    read   <entry>/generation        g2; g1 != g2 means another writer raced us
    rmdir  <entry>

``report_data`` is decided here, once: the 32 bytes of the chain root (the
SHA-256 hash of the genesis entry) followed by 32 zero bytes. A relying party
reads the root straight out of the quote, with no second hash to recompute.

The result is an *attestation record*, a small JSON object recorded in the
chain (entry seq 1, see ``chain.py``) and committed to by the TRACE claim::

    {"kind": "configfs-tsm", "provider": "tdx_guest", "generation": 1,
     "report_data": "<128 hex>", "outblob": "<unpadded base64url>"}
    {"kind": "none", "reason": "configfs-tsm is not available at /sys/kernel/config/tsm/report"}

Where the interface is absent, or any step fails, the record says so plainly
(``kind: none`` with the reason) and one warning is logged: the session still
opens, and its claim says ``software-only``. Nothing here verifies the quote's
signature chain; a relying party does that with the vendor's roots.

The record helpers (:func:`report_data_for`, :func:`check_attestation_record`)
are pure; the offline verifier imports them. Only :class:`ConfigfsTsm` does I/O
(files only, never sockets).
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import Any, Final

from bastion.crypto.keys import b64url_decode, b64url_encode

__all__ = [
    "DEFAULT_TSM_REPORT_ROOT",
    "KIND_CONFIGFS_TSM",
    "KIND_NONE",
    "ConfigfsTsm",
    "check_attestation_record",
    "no_attestation",
    "report_data_for",
]

logger = logging.getLogger(__name__)

DEFAULT_TSM_REPORT_ROOT: Final = Path("/sys/kernel/config/tsm/report")
KIND_CONFIGFS_TSM: Final = "configfs-tsm"
KIND_NONE: Final = "none"

_REPORT_DATA_LEN = 64
#: An attestation report is a few KiB (a TDX quote with its certification data
#: is the largest); refusing more keeps a broken provider from bloating the chain.
_MAX_OUTBLOB = 64 * 1024
_TSM_FIELDS = frozenset({"kind", "provider", "generation", "report_data", "outblob"})
_NONE_FIELDS = frozenset({"kind", "reason"})


def report_data_for(chain_root: str) -> bytes:
    """The 64 bytes of ``report_data`` that bind ``chain_root``: root || 32 zero bytes.

    Raises ``ValueError`` if ``chain_root`` is not 64 lowercase hex digits.
    """
    root = bytes.fromhex(chain_root)
    if len(root) != 32 or root.hex() != chain_root:
        raise ValueError("chain root must be 64 lowercase hex digits")
    return root + bytes(32)


def no_attestation(reason: str) -> dict[str, Any]:
    """The record for a session whose root is not bound to any TEE."""
    return {"kind": KIND_NONE, "reason": reason}


def check_attestation_record(record: Any, chain_root: str) -> None:
    """Check the shape of an attestation record and that it binds ``chain_root``.

    For ``configfs-tsm`` the ``report_data`` must be :func:`report_data_for`
    the root and must appear in the report itself. Raises ``ValueError`` naming
    the defect. The report's signature is not checked here.
    """
    if not isinstance(record, dict):
        raise ValueError("attestation record is not a JSON object")
    kind = record.get("kind")
    if kind == KIND_NONE:
        if record.keys() != _NONE_FIELDS or not isinstance(record["reason"], str) or not record["reason"]:
            raise ValueError("a 'none' attestation record holds exactly kind and a non-empty reason")
        return
    if kind != KIND_CONFIGFS_TSM:
        raise ValueError(f"unknown attestation kind {kind!r}")
    if record.keys() != _TSM_FIELDS:
        raise ValueError(f"a configfs-tsm attestation record holds exactly {sorted(_TSM_FIELDS)}")
    provider, generation = record["provider"], record["generation"]
    if not isinstance(provider, str) or not provider:
        raise ValueError("attestation provider must be a non-empty string")
    if type(generation) is not int or generation < 0:
        raise ValueError("attestation generation must be a non-negative integer")
    if record["report_data"] != report_data_for(chain_root).hex():
        raise ValueError("attestation report_data does not bind this chain root")
    try:
        outblob = b64url_decode(record["outblob"])
    except ValueError as exc:
        raise ValueError(f"attestation outblob is not base64url: {exc}") from exc
    if report_data_for(chain_root) not in outblob:
        raise ValueError("attestation report does not carry the report_data")


class ConfigfsTsm:
    """Requests attestation reports through configfs-tsm under ``root``.

    ``root`` is a parameter so tests can point it at a directory tree that
    simulates the kernel; the file operations go through the small methods at
    the bottom of the class for the same reason.
    """

    def __init__(self, root: Path = DEFAULT_TSM_REPORT_ROOT) -> None:
        self._root = root

    def bind_chain_root(self, chain_root: str) -> dict[str, Any]:
        """An attestation record binding ``chain_root``; never raises for platform failures.

        On any failure the record is ``kind: none`` with the reason, and one
        warning is logged. Raises ``ValueError`` only for a malformed ``chain_root``.
        """
        report_data = report_data_for(chain_root)
        if not self._root.is_dir():
            return self._unavailable(f"configfs-tsm is not available at {self._root}")
        entry = self._root / f"bastion-{secrets.token_hex(8)}"
        try:
            self._create_entry(entry)
        except OSError as exc:
            return self._unavailable(f"configfs-tsm report entry could not be created: {exc}")
        try:
            record = self._request(entry, report_data)
        except (OSError, ValueError) as exc:
            return self._unavailable(f"configfs-tsm report failed: {exc}")
        finally:
            try:
                self._remove_entry(entry)
            except OSError as exc:
                # Secondary to the outcome above, which already logged if it failed.
                logger.info("tee_report_entry_not_removed", extra={"entry": str(entry), "error": str(exc)})
        # A provider that produced a report without our report_data has bound nothing.
        try:
            check_attestation_record(record, chain_root)
        except ValueError as exc:
            return self._unavailable(f"configfs-tsm report does not bind the chain root: {exc}")
        return record

    def _request(self, entry: Path, report_data: bytes) -> dict[str, Any]:
        self._write_attr(entry / "inblob", report_data)
        before = self._read_generation(entry)
        outblob = self._read_attr(entry / "outblob")
        provider = self._read_attr(entry / "provider").decode("utf-8").strip()
        after = self._read_generation(entry)
        if before != after:
            raise ValueError(f"another writer changed the report entry (generation {before} -> {after})")
        if not outblob:
            raise ValueError("provider returned an empty report")
        if len(outblob) > _MAX_OUTBLOB:
            raise ValueError(f"report is {len(outblob)} bytes, more than {_MAX_OUTBLOB}")
        if not provider:
            raise ValueError("provider name is empty")
        return {
            "kind": KIND_CONFIGFS_TSM,
            "provider": provider,
            "generation": after,
            "report_data": report_data.hex(),
            "outblob": b64url_encode(outblob),
        }

    def _read_generation(self, entry: Path) -> int:
        text = self._read_attr(entry / "generation").decode("ascii").strip()
        if not text.isdigit():
            raise ValueError(f"generation is not a number: {text!r}")
        return int(text)

    def _unavailable(self, reason: str) -> dict[str, Any]:
        logger.warning("tee_binding_unavailable", extra={"reason": reason, "tsm_root": str(self._root)})
        return no_attestation(reason)

    # The file operations, one line each: the kernel's side of the interface.

    def _create_entry(self, entry: Path) -> None:
        os.mkdir(entry, 0o700)

    def _remove_entry(self, entry: Path) -> None:
        os.rmdir(entry)

    def _write_attr(self, path: Path, data: bytes) -> None:
        with open(path, "wb", buffering=0) as handle:
            handle.write(data)

    def _read_attr(self, path: Path) -> bytes:
        with open(path, "rb") as handle:
            return handle.read(_MAX_OUTBLOB + 1)

    def __repr__(self) -> str:
        return f"ConfigfsTsm(root={str(self._root)!r})"
