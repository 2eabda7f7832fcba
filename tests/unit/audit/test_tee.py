"""Binding the chain root into TEE report_data through configfs-tsm, against a simulated kernel."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from bastion.audit.claim import runtime_claims
from bastion.audit.tee import ConfigfsTsm, check_attestation_record, no_attestation, report_data_for
from bastion.crypto.keys import b64url_decode, b64url_encode

ROOT = "5d" * 32
MRTD = bytes(range(48))


def tdx_quote(report_data: bytes) -> bytes:
    """A TDX quote v4 shaped enough for its layout: header, TD report body, a signature tail."""
    header = (4).to_bytes(2, "little") + (2).to_bytes(2, "little") + (0x81).to_bytes(4, "little") + bytes(40)
    body = bytearray(584)
    body[136:184] = MRTD
    body[520:584] = report_data
    return header + bytes(body) + b"\x00" * 64


class FakeKernel(ConfigfsTsm):
    """The kernel side of configfs-tsm: attributes appear on mkdir, outblob follows inblob."""

    def __init__(
        self, root: Path, *, provider: str = "tdx_guest", report: Any = tdx_quote, race: bool = False
    ):
        super().__init__(root)
        self.provider, self.report, self.race = provider, report, race
        self.created: list[Path] = []

    def _create_entry(self, entry: Path) -> None:
        super()._create_entry(entry)
        (entry / "provider").write_text(self.provider + "\n")
        (entry / "generation").write_text("0\n")
        self.created.append(entry)

    def _write_attr(self, path: Path, data: bytes) -> None:
        super()._write_attr(path, data)
        if path.name == "inblob":
            generation = int((path.parent / "generation").read_text()) + 1
            (path.parent / "generation").write_text(f"{generation}\n")
            if self.report is not None:
                (path.parent / "outblob").write_bytes(self.report(data))

    def _read_attr(self, path: Path) -> bytes:
        data = super()._read_attr(path)
        if self.race and path.name == "outblob":
            (path.parent / "generation").write_text("99\n")  # another writer's inblob
        return data

    def _remove_entry(self, entry: Path) -> None:
        shutil.rmtree(entry)


@pytest.fixture
def tsm_root(tmp_path: Path) -> Path:
    root = tmp_path / "sys" / "kernel" / "config" / "tsm" / "report"
    root.mkdir(parents=True)
    return root


def test_report_data_is_the_root_then_zeros() -> None:
    """report_data is the 32-byte chain root followed by 32 zero bytes."""
    assert report_data_for(ROOT) == bytes.fromhex(ROOT) + bytes(32)
    with pytest.raises(ValueError):
        report_data_for("AB" * 32)
    with pytest.raises(ValueError):
        report_data_for("ab" * 31)


def test_binding_through_configfs_tsm(tsm_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With the interface present, the record carries provider, generation, report_data and the report."""
    kernel = FakeKernel(tsm_root)
    with caplog.at_level(logging.WARNING):
        record = kernel.bind_chain_root(ROOT)
    assert record["kind"] == "configfs-tsm"
    assert record["provider"] == "tdx_guest"
    assert record["generation"] == 1
    assert record["report_data"] == (bytes.fromhex(ROOT) + bytes(32)).hex()
    assert b64url_decode(record["outblob"]) == tdx_quote(report_data_for(ROOT))
    check_attestation_record(record, ROOT)
    assert caplog.records == []
    assert list(tsm_root.iterdir()) == [], "the report entry is removed afterwards"
    assert kernel.created[0].name.startswith("bastion-")


def test_a_tdx_binding_claims_intel_tdx_with_mrtd(tsm_root: Path) -> None:
    """A recognized TDX quote yields runtime intel-tdx, MRTD as sha384, report_data as nonce."""
    record = FakeKernel(tsm_root).bind_chain_root(ROOT)
    assert runtime_claims(record) == {
        "platform": "intel-tdx",
        "measurement": "sha384:" + MRTD.hex(),
        "nonce": b64url_encode(report_data_for(ROOT)),
    }


def test_an_unrecognized_report_claims_software_only(tsm_root: Path) -> None:
    """A report whose layout is not recognized never claims hardware."""
    record = FakeKernel(
        tsm_root, provider="arm_cca_guest", report=lambda data: b"cbor" + data
    ).bind_chain_root(ROOT)
    assert record["kind"] == "configfs-tsm"
    assert runtime_claims(record)["platform"] == "software-only"


def _assert_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].getMessage() == "tee_binding_unavailable"


def test_absent_interface_records_none_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Where configfs-tsm is absent the record is kind none with the reason, and one warning is logged."""
    with caplog.at_level(logging.WARNING):
        record = ConfigfsTsm(tmp_path / "missing").bind_chain_root(ROOT)
    assert record == no_attestation(f"configfs-tsm is not available at {tmp_path / 'missing'}")
    check_attestation_record(record, ROOT)
    _assert_one_warning(caplog)


@pytest.mark.parametrize(
    ("kernel", "reason"),
    [
        ({"report": None}, "report failed"),
        ({"report": lambda data: b"a report without the data"}, "does not bind the chain root"),
        ({"report": lambda data: b""}, "empty report"),
        ({"provider": ""}, "provider name is empty"),
        ({"race": True}, "another writer"),
    ],
)
def test_failures_record_none_and_warn_once(
    tsm_root: Path, caplog: pytest.LogCaptureFixture, kernel: dict[str, Any], reason: str
) -> None:
    """A missing or foreign report, an empty provider or a racing writer records kind none, warns once."""
    with caplog.at_level(logging.WARNING):
        record = FakeKernel(tsm_root, **kernel).bind_chain_root(ROOT)
    assert record["kind"] == "none"
    assert reason in record["reason"]
    _assert_one_warning(caplog)
    assert list(tsm_root.iterdir()) == []


def test_the_real_file_operations_fail_closed_on_a_plain_directory(
    tsm_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a directory that is not configfs (no attributes appear), binding fails plainly."""
    with caplog.at_level(logging.WARNING):
        record = ConfigfsTsm(tsm_root).bind_chain_root(ROOT)
    assert record["kind"] == "none"
    _assert_one_warning(caplog)


@pytest.mark.parametrize(
    "record",
    [
        [],
        {"kind": "sgx"},
        {"kind": "none"},
        {"kind": "none", "reason": ""},
        {"kind": "none", "reason": "x", "extra": 1},
        {
            "kind": "configfs-tsm",
            "provider": "tdx_guest",
            "generation": 1,
            "report_data": "00" * 64,
            "outblob": "",
        },
        {
            "kind": "configfs-tsm",
            "provider": "tdx_guest",
            "generation": -1,
            "report_data": (bytes.fromhex(ROOT) + bytes(32)).hex(),
            "outblob": b64url_encode(bytes.fromhex(ROOT) + bytes(32)),
        },
        {
            "kind": "configfs-tsm",
            "provider": "tdx_guest",
            "generation": 1,
            "report_data": (bytes.fromhex(ROOT) + bytes(32)).hex(),
            "outblob": b64url_encode(b"no data here"),
        },
        {
            "kind": "configfs-tsm",
            "provider": "tdx_guest",
            "generation": 1,
            "report_data": (bytes.fromhex(ROOT) + bytes(32)).hex(),
            "outblob": "not base64!",
        },
    ],
)
def test_malformed_or_foreign_records_are_refused(record: Any) -> None:
    """A record of the wrong shape, or one binding another root, is refused."""
    with pytest.raises(ValueError):
        check_attestation_record(record, ROOT)
