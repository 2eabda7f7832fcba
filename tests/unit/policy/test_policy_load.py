"""Tests for policy/load.py: the TOML file format, its validation and its error messages."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from bastion.errors import ConfigError
from bastion.ids import AgentId
from bastion.policy.load import load_snapshot, snapshot_from_mapping
from bastion.policy.snapshot import (
    AgentSpec,
    GatewaySettings,
    ProcessScope,
    ServerSpec,
    Snapshot,
    UpstreamKind,
)

TOKEN_HASH = hashlib.sha256(b"demo-token").hexdigest()
OTHER_HASH = hashlib.sha256(b"other-token").hexdigest()
SECRET = "s3cr3t-upstream-token"
ENV = {"TOOLS_UPSTREAM_TOKEN": SECRET}

FULL = f"""
[gateway]
tool_separator = "__"
max_body_bytes = 2097152
allowed_origins = ["http://localhost:3000", "https://app.example.com"]
transport_session_idle_s = 900
upstream_timeout_s = 12.5
max_transport_sessions = 500

[servers.notes]
command = "python"
args = ["-m", "bastion.examples.notes_server"]
env = {{ NOTES_MODE = "demo" }}
cwd = "/srv/notes"
namespace = "memo"
timeout_s = 30

[servers.tools]
url = "http://127.0.0.1:9000/mcp"
headers = {{ Authorization = "Bearer ${{TOOLS_UPSTREAM_TOKEN}}" }}

[agents.demo]
token_sha256 = "{TOKEN_HASH}"
"""

MINIMAL = """
[servers.notes]
command = "python"
"""


def write(tmp_path: Path, text: str, name: str = "bastion.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as excinfo:
        load_snapshot(path, environ=ENV if environ is None else environ)
    message = str(excinfo.value)
    assert str(path) in message
    return message


# ---------------------------------------------------------------- valid files


def test_full_file_round_trips_into_the_expected_snapshot(tmp_path: Path) -> None:
    """Every documented key lands in the matching Snapshot field."""
    path = write(tmp_path, FULL)
    expected = Snapshot(
        version=hashlib.sha256(path.read_bytes()).hexdigest()[:16],
        gateway=GatewaySettings(
            tool_separator="__",
            max_body_bytes=2_097_152,
            allowed_origins=("http://localhost:3000", "https://app.example.com"),
            transport_session_idle_s=900.0,
            upstream_timeout_s=12.5,
            max_transport_sessions=500,
        ),
        servers={
            "notes": ServerSpec(
                name="notes",
                namespace="memo",
                kind=UpstreamKind.STDIO,
                command="python",
                args=("-m", "bastion.examples.notes_server"),
                env={"NOTES_MODE": "demo"},
                cwd="/srv/notes",
                timeout_s=30.0,
            ),
            "tools": ServerSpec(
                name="tools",
                namespace="tools",
                kind=UpstreamKind.HTTP,
                url="http://127.0.0.1:9000/mcp",
                headers={"Authorization": f"Bearer {SECRET}"},
            ),
        },
        agents=(AgentSpec(name=AgentId("demo"), token_sha256=TOKEN_HASH),),
        source=path,
    )

    snapshot = load_snapshot(path, environ=ENV)

    assert snapshot == expected
    assert isinstance(snapshot.gateway.transport_session_idle_s, float)
    assert isinstance(snapshot.servers["notes"].timeout_s, float)


def test_minimal_file_gets_protective_defaults(tmp_path: Path) -> None:
    """With no [gateway] and no [agents], the defaults of GatewaySettings apply and no agent exists."""
    snapshot = load_snapshot(write(tmp_path, MINIMAL), environ={})

    assert snapshot.gateway == GatewaySettings()
    assert snapshot.agents == ()
    assert snapshot.servers["notes"].args == ()
    assert dict(snapshot.servers["notes"].env) == {}


def test_namespace_defaults_to_the_table_name(tmp_path: Path) -> None:
    """A server without namespace is exposed under its table name."""
    snapshot = load_snapshot(write(tmp_path, MINIMAL), environ={})

    assert snapshot.servers["notes"].namespace == "notes"
    assert snapshot.server_for_namespace("notes") is snapshot.servers["notes"]


def test_snapshot_from_mapping_applies_the_same_rules_without_a_file() -> None:
    """The mapping entry point builds the snapshot and names no file in errors."""
    data = {"servers": {"notes": {"command": "python", "args": ["-m", "x"]}}}

    snapshot = snapshot_from_mapping(data, source=None, version="demo", environ={})

    assert snapshot.version == "demo"
    assert snapshot.source is None
    assert snapshot.servers["notes"].args == ("-m", "x")

    with pytest.raises(ConfigError, match=r"^servers\.notes\.args\[1\]: expected a string, got an integer$"):
        snapshot_from_mapping(
            {"servers": {"notes": {"command": "python", "args": ["-m", 3]}}},
            source=None,
            version="demo",
            environ={},
        )


# ---------------------------------------------------------------- interpolation


def test_env_references_are_resolved_in_headers_and_env(tmp_path: Path) -> None:
    """${NAME} is replaced from environ in header and env values."""
    text = """
[servers.tools]
url = "https://tools.example.com/mcp"
headers = { Authorization = "Bearer ${TOKEN}", X-Tenant = "${TENANT}-prod" }

[servers.notes]
command = "python"
env = { NOTES_KEY = "${KEY}", PLAIN = "as-is" }
"""
    environ = {"TOKEN": "abc", "TENANT": "acme", "KEY": "k1"}

    snapshot = load_snapshot(write(tmp_path, text), environ=environ)

    assert dict(snapshot.servers["tools"].headers) == {"Authorization": "Bearer abc", "X-Tenant": "acme-prod"}
    assert dict(snapshot.servers["notes"].env) == {"NOTES_KEY": "k1", "PLAIN": "as-is"}


def test_double_dollar_is_a_literal_dollar_and_values_are_not_reexpanded(tmp_path: Path) -> None:
    """$$ yields $, and a substituted value containing ${...} is kept verbatim."""
    text = """
[servers.notes]
command = "python"
env = { PRICE = "$$5 and $${NOT_A_REF}", NESTED = "${OUTER}" }
"""
    snapshot = load_snapshot(write(tmp_path, text), environ={"OUTER": "${INNER}", "INNER": "leak"})

    assert dict(snapshot.servers["notes"].env) == {"PRICE": "$5 and ${NOT_A_REF}", "NESTED": "${INNER}"}


def test_os_environ_is_the_default_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without environ, ${NAME} is read from os.environ."""
    monkeypatch.setenv("BASTION_TEST_NOTES_MODE", "from-os")
    text = """
[servers.notes]
command = "python"
env = { MODE = "${BASTION_TEST_NOTES_MODE}" }
"""
    snapshot = load_snapshot(write(tmp_path, text))

    assert snapshot.servers["notes"].env["MODE"] == "from-os"


def test_missing_env_variable_names_key_path_and_variable(tmp_path: Path) -> None:
    """An unset variable is refused, naming the key path and the variable but no value."""
    text = """
[servers.tools]
url = "https://tools.example.com/mcp"
headers = { Authorization = "Bearer ${MISSING_TOKEN} ${TOOLS_UPSTREAM_TOKEN}" }
"""
    message = load_error(tmp_path, text)

    assert "servers.tools.headers.Authorization" in message
    assert "MISSING_TOKEN" in message
    assert "is not set" in message
    assert "Bearer" not in message


def test_empty_env_variable_is_refused(tmp_path: Path) -> None:
    """A variable that is set but empty is refused: it would send a blank credential."""
    text = """
[servers.notes]
command = "python"
env = { API_KEY = "${EMPTY}" }
"""
    message = load_error(tmp_path, text, environ={"EMPTY": ""})

    assert "servers.notes.env.API_KEY" in message
    assert "EMPTY is empty" in message


@pytest.mark.parametrize("value", ["cost $5", "${lower-case}", "${", "trailing $"])
def test_lone_dollar_is_refused(tmp_path: Path, value: str) -> None:
    """A $ that is neither $$ nor ${NAME} is refused rather than passed through."""
    text = f"""
[servers.notes]
command = "python"
env = {{ VALUE = "{value}" }}
"""
    message = load_error(tmp_path, text)

    assert "servers.notes.env.VALUE" in message
    assert "'$$'" in message


def test_header_value_with_newline_after_substitution_is_refused_without_echoing_it(tmp_path: Path) -> None:
    """A CR/LF smuggled in through a variable is refused and the secret is not printed."""
    text = """
[servers.tools]
url = "https://tools.example.com/mcp"
headers = { Authorization = "Bearer ${TOOLS_UPSTREAM_TOKEN}" }
"""
    message = load_error(tmp_path, text, environ={"TOOLS_UPSTREAM_TOKEN": SECRET + "\r\nX-Evil: 1"})

    assert "servers.tools.headers.Authorization" in message
    assert "control character" in message
    assert SECRET not in message


# ---------------------------------------------------------------- file-level failures


def test_unreadable_file_names_the_file(tmp_path: Path) -> None:
    """A missing file is a ConfigError naming the path and the cause."""
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as excinfo:
        load_snapshot(path, environ={})

    assert str(path) in str(excinfo.value)
    assert "cannot read the file" in str(excinfo.value)


def test_toml_syntax_error_includes_line_and_column(tmp_path: Path) -> None:
    """A TOML syntax error carries tomllib's line and column."""
    message = load_error(tmp_path, '[servers.notes]\ncommand = "python"\nargs = [1,,]\n')

    assert "TOML syntax error" in message
    assert "line 3" in message
    assert "column" in message


def test_non_utf8_file_is_refused(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 are a ConfigError, not a UnicodeDecodeError."""
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[servers.notes]\ncommand = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="not valid UTF-8") as excinfo:
        load_snapshot(path, environ={})

    assert str(path) in str(excinfo.value)


# ---------------------------------------------------------------- content failures

INVALID = [
    pytest.param(
        MINIMAL + "\n[gatway]\ntool_separator = '__'\n",
        "gatway",
        "unknown key",
        id="unknown-top-level-key",
    ),
    pytest.param(
        "[gateway]\nmax_body_byte = 2048\n" + MINIMAL,
        "gateway.max_body_byte",
        "unknown key",
        id="unknown-gateway-key",
    ),
    pytest.param(
        '[servers.notes]\ncommand = "python"\nargv = ["x"]\n',
        "servers.notes.argv",
        "unknown key",
        id="unknown-server-key",
    ),
    pytest.param(
        MINIMAL + f'\n[agents.demo]\ntoken_sha256 = "{TOKEN_HASH}"\ntoken = "plain"\n',
        "agents.demo.token",
        "unknown key",
        id="unknown-agent-key",
    ),
    pytest.param(
        '[servers.notes]\ncommand = "python"\nargs = ["-m", "x", 3]\n',
        "servers.notes.args[2]",
        "expected a string, got an integer",
        id="wrong-type-array-item",
    ),
    pytest.param(
        '[servers.notes]\ncommand = "python"\nargs = "-m x"\n',
        "servers.notes.args",
        "expected an array of strings, got a string",
        id="wrong-type-array",
    ),
    pytest.param(
        "[gateway]\nmax_body_bytes = true\n" + MINIMAL,
        "gateway.max_body_bytes",
        "expected an integer, got a boolean",
        id="bool-is-not-an-int",
    ),
    pytest.param(
        "[gateway]\nmax_transport_sessions = 10.0\n" + MINIMAL,
        "gateway.max_transport_sessions",
        "expected an integer, got a float",
        id="float-is-not-an-int",
    ),
    pytest.param(
        "[gateway]\nupstream_timeout_s = false\n" + MINIMAL,
        "gateway.upstream_timeout_s",
        "expected a number, got a boolean",
        id="bool-is-not-a-number",
    ),
    pytest.param(
        MINIMAL + 'timeout_s = "30"\n',
        "servers.notes.timeout_s",
        "expected a number, got a string",
        id="string-is-not-a-number",
    ),
    pytest.param(
        MINIMAL + "timeout_s = nan\n",
        "servers.notes.timeout_s",
        "finite",
        id="nan-timeout",
    ),
    pytest.param(
        'gateway = "on"\n' + MINIMAL,
        "gateway",
        "expected a table, got a string",
        id="section-is-not-a-table",
    ),
    pytest.param(
        '[gateway]\nallowed_origins = ["http://localhost:3000/"]\n' + MINIMAL,
        "gateway.allowed_origins[0]",
        "no path",
        id="origin-with-trailing-slash",
    ),
    pytest.param(
        '[gateway]\nallowed_hosts = ["https://mcp.example.com"]\n' + MINIMAL,
        "gateway.allowed_hosts[0]",
        "no scheme",
        id="host-with-a-scheme",
    ),
    pytest.param(
        '[servers.notes]\ncommand = "python"\nurl = "http://127.0.0.1:9000/mcp"\n',
        "servers.notes",
        "both url and command",
        id="url-and-command",
    ),
    pytest.param(
        '[servers.notes]\nnamespace = "notes"\n',
        "servers.notes",
        "needs url (http) or command (stdio)",
        id="neither-url-nor-command",
    ),
    pytest.param(
        '[servers.tools]\nurl = "ftp://files.example.com/mcp"\n',
        "servers.tools.url",
        "scheme must be http or https, got 'ftp'",
        id="bad-url-scheme",
    ),
    pytest.param(
        '[servers.tools]\nurl = "http:///mcp"\n',
        "servers.tools.url",
        "no host",
        id="url-without-host",
    ),
    pytest.param(
        '[servers.tools]\nurl = "http://127.0.0.1:9000/mcp"\nargs = ["x"]\n',
        "servers.tools.args",
        "only a stdio server",
        id="stdio-key-on-http-server",
    ),
    pytest.param(
        '[servers.notes]\ncommand = "python"\nheaders = { Authorization = "Bearer x" }\n',
        "servers.notes.headers",
        "only an http server",
        id="headers-on-stdio-server",
    ),
    pytest.param(
        '[servers.tools]\nurl = "http://127.0.0.1:9000/mcp"\n'
        'headers = { Authorization = "a", authorization = "b" }\n',
        "servers.tools.headers.authorization",
        "repeats header",
        id="duplicate-header-ignoring-case",
    ),
    pytest.param(
        '[servers.tools]\nurl = "http://127.0.0.1:9000/mcp"\nheaders = { "Bad Header" = "a" }\n',
        'servers.tools.headers."Bad Header"',
        "not a valid HTTP header name",
        id="bad-header-name",
    ),
    pytest.param(
        '[servers."notes.v2"]\ncommand = "python"\n',
        'servers."notes.v2"',
        "server name must match",
        id="bad-server-name",
    ),
    pytest.param(
        "[servers.abcdefghijklmnopqrstuvwxyz0123456]\ncommand = 'python'\n",
        "servers.abcdefghijklmnopqrstuvwxyz0123456",
        "server name must match",
        id="server-name-too-long",
    ),
    pytest.param(
        "[gateway]\ntool_separator = '__'\n",
        "servers",
        "at least one",
        id="missing-servers",
    ),
    pytest.param(
        "servers = {}\n",
        "servers",
        "at least one",
        id="empty-servers",
    ),
    pytest.param(
        MINIMAL + "\n[agents.demo]\n",
        "agents.demo.token_sha256",
        "missing key",
        id="missing-agent-token",
    ),
    pytest.param(
        MINIMAL + 'audit_contents = "yes"\n',
        "servers.notes.audit_contents",
        "must be true or false",
        id="audit-contents-not-a-boolean",
    ),
    pytest.param(
        MINIMAL + 'max_response_bytes = "16MiB"\n',
        "servers.notes.max_response_bytes",
        "expected an integer, got a string",
        id="max-response-bytes-not-an-integer",
    ),
    pytest.param(
        MINIMAL + "max_response_bytes = 100\n",
        "servers.notes.max_response_bytes",
        "must be at least 1024",
        id="max-response-bytes-too-small",
    ),
    pytest.param(
        MINIMAL + 'scope = "per_client"\n',
        "servers.notes.scope",
        "must be one of 'transport_session', 'agent_session', 'shared'",
        id="unknown-process-scope",
    ),
    pytest.param(
        '[servers.tools]\nurl = "http://127.0.0.1:9000/mcp"\nscope = "shared"\n',
        "servers.tools.scope",
        "only a stdio server",
        id="process-scope-on-http-server",
    ),
    pytest.param(
        MINIMAL + "max_processes = 0\n",
        "servers.notes.max_processes",
        "must be at least 1",
        id="max-processes-zero",
    ),
    pytest.param(
        MINIMAL + "process_idle_s = 0\n",
        "servers.notes.process_idle_s",
        "must be positive",
        id="process-idle-not-positive",
    ),
]


def test_stdio_processes_are_owned_by_default_and_bounded(tmp_path: Path) -> None:
    """A stdio server's process belongs to one transport session unless its table says otherwise;
    the bounds default to 32 per server, 64 per gateway, 4 starting at once, 300 s idle."""
    text = MINIMAL + '\n[servers.clock]\ncommand = "python"\nscope = "shared"\nmax_processes = 3\n'
    snapshot = load_snapshot(write(tmp_path, text), environ={})
    notes, clock = snapshot.servers["notes"], snapshot.servers["clock"]
    assert (notes.scope, notes.max_processes, notes.process_idle_s) == (
        ProcessScope.TRANSPORT_SESSION,
        32,
        300.0,
    )
    assert (clock.scope, clock.max_processes) == (ProcessScope.SHARED, 3)
    assert (snapshot.gateway.max_stdio_processes, snapshot.gateway.stdio_spawn_concurrency) == (64, 4)


def test_max_response_bytes_defaults_to_16_mib_and_is_per_server(tmp_path: Path) -> None:
    """Every server reads at most 16 MiB per upstream message unless its own table says otherwise."""
    text = MINIMAL + '\n[servers.tools]\nurl = "http://127.0.0.1:9000/mcp"\nmax_response_bytes = 65536\n'
    snapshot = load_snapshot(write(tmp_path, text), environ={})
    assert snapshot.servers["notes"].max_response_bytes == 16 * 1024 * 1024
    assert snapshot.servers["tools"].max_response_bytes == 65536


@pytest.mark.parametrize(("text", "key_path", "defect"), INVALID)
def test_invalid_file_names_file_key_path_and_defect(
    tmp_path: Path, text: str, key_path: str, defect: str
) -> None:
    """Each defect is refused with the file name, the key path and what is wrong."""
    message = load_error(tmp_path, text)

    assert f"{key_path}: " in message
    assert defect in message


def test_key_path_is_attached_as_error_data(tmp_path: Path) -> None:
    """The key path is also machine-readable in ConfigError.data."""
    path = write(tmp_path, '[servers.notes]\ncommand = "python"\nargs = ["-m", "x", 3]\n')
    with pytest.raises(ConfigError) as excinfo:
        load_snapshot(path, environ={})

    assert excinfo.value.data == {"key": "servers.notes.args[2]"}


CONSTRUCTOR_INVALID = [
    pytest.param(
        "[gateway]\nmax_body_bytes = 10\n" + MINIMAL,
        "gateway.max_body_bytes must be at least 1024",
        id="gateway-limit",
    ),
    pytest.param(
        MINIMAL + 'namespace = "has space"\n',
        "servers.notes.namespace must match",
        id="bad-namespace",
    ),
    pytest.param(
        MINIMAL + "timeout_s = -1\n",
        "servers.notes.timeout_s must be positive",
        id="negative-timeout",
    ),
    pytest.param(
        MINIMAL + '\n[servers.other]\ncommand = "python"\nnamespace = "notes"\n',
        "servers.other.namespace 'notes' is already used by servers.notes",
        id="duplicate-namespace",
    ),
    pytest.param(
        MINIMAL + f'\n[agents.demo]\ntoken_sha256 = "{TOKEN_HASH.upper()}"\n',
        "agents.demo.token_sha256 must be 64 lowercase hex characters",
        id="agent-hash-not-lowercase-hex",
    ),
    pytest.param(
        MINIMAL
        + f'\n[agents.a]\ntoken_sha256 = "{OTHER_HASH}"\n\n[agents.b]\ntoken_sha256 = "{OTHER_HASH}"\n',
        "agents.b.token_sha256: the same credential as agents.a.token_sha256",
        id="shared-token",
    ),
    # Issue #12: each of these named no key before.
    pytest.param(
        "[gateway]\nupstream_timeout_s = -1\n" + MINIMAL,
        "gateway.upstream_timeout_s must be positive",
        id="negative-gateway-timeout",
    ),
    pytest.param(
        "[gateway]\ntransport_session_idle_s = 0\n" + MINIMAL,
        "gateway.transport_session_idle_s must be positive",
        id="zero-idle-timeout",
    ),
    pytest.param(
        "[gateway]\nmax_transport_sessions_per_agent = 0\n" + MINIMAL,
        "gateway.max_transport_sessions_per_agent must be at least 1",
        id="zero-sessions-per-agent",
    ),
    pytest.param(
        "[gateway]\nheader_timeout_s = 0\n" + MINIMAL,
        "gateway.header_timeout_s must be positive",
        id="zero-header-timeout",
    ),
    pytest.param(
        "[gateway]\nmax_header_bytes = 100\n" + MINIMAL,
        "gateway.max_header_bytes must be at least 1024",
        id="tiny-header-cap",
    ),
    pytest.param(
        "[gateway]\nmax_connections_per_address = 0\n" + MINIMAL,
        "gateway.max_unauthenticated_connections_per_address must be at least 1",
        id="zero-connections-per-address",
    ),
    pytest.param(
        "[gateway]\nsse_keepalive_s = 0\n" + MINIMAL,
        "gateway.sse_keepalive_s must be between 0.1 and 300 (seconds)",
        id="zero-sse-keepalive",
    ),
    pytest.param(
        "[gateway]\nsse_keepalive_s = 301\n" + MINIMAL,
        "gateway.sse_keepalive_s must be between 0.1 and 300 (seconds)",
        id="rare-sse-keepalive",
    ),
    pytest.param(
        '[gateway]\nkeep_alive_s = "5"\n' + MINIMAL,
        "gateway.keep_alive_s",
        id="keep-alive-not-a-number",
    ),
    pytest.param(
        MINIMAL + '\n[auth]\nadmin_token_sha256 = "abc"\n',
        "auth.admin_token_sha256 must be 64 lowercase hex characters",
        id="bad-admin-digest",
    ),
    pytest.param(
        MINIMAL + f'\n[auth]\nauditor_token_sha256 = ["{OTHER_HASH}", "abc"]\n',
        "auth.auditor_token_sha256[1] must be 64 lowercase hex characters",
        id="bad-auditor-digest",
    ),
    pytest.param(
        MINIMAL + f'\n[auth]\nadmin_token_sha256 = "{OTHER_HASH}"\nauditor_token_sha256 = ["{OTHER_HASH}"]\n',
        "auth.auditor_token_sha256[0]: the same credential as auth.admin_token_sha256",
        id="admin-is-auditor",
    ),
    pytest.param(
        MINIMAL
        + f'\n[agents.demo]\ntoken_sha256 = "{OTHER_HASH}"\n\n[auth]\nadmin_token_sha256 = "{OTHER_HASH}"\n',
        "auth.admin_token_sha256: the same credential as agents.demo.token_sha256",
        id="agent-is-admin",
    ),
    pytest.param(
        MINIMAL
        + '\n[auth.oauth]\nissuer = "https://id.example.com"\njwks_url = "https://id.example.com/jwks"\n',
        "auth.oauth.audience must be this gateway's resource URL",
        id="oauth-without-audience",
    ),
    pytest.param(
        MINIMAL
        + '\n[auth]\nresource_url = "https://gw.example.com/mcp"\n[auth.oauth]\nissuer = "https://id.example.com"\n'
        + 'jwks_url = "ftp://id.example.com/jwks"\n',
        "auth.oauth.jwks_url must be https",
        id="oauth-jwks-not-https",
    ),
]


@pytest.mark.parametrize(("text", "defect"), CONSTRUCTOR_INVALID)
def test_snapshot_constructor_errors_are_prefixed_with_the_file(
    tmp_path: Path, text: str, defect: str
) -> None:
    """A ConfigError from a snapshot constructor is re-raised with the file name in front."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as excinfo:
        load_snapshot(path, environ={})

    assert str(excinfo.value).startswith(f"{path}: {defect}")


def test_agent_token_hash_is_never_echoed(tmp_path: Path) -> None:
    """A malformed token_sha256 (perhaps a pasted raw token) does not appear in the message."""
    message = load_error(tmp_path, MINIMAL + f'\n[agents.demo]\ntoken_sha256 = "{SECRET}"\n')

    assert "agents.demo.token_sha256" in message
    assert SECRET not in message


# ---------------------------------------------------------------- version and immutability


def test_version_is_stable_for_the_same_bytes_and_changes_with_them(tmp_path: Path) -> None:
    """version is the 16-hex SHA-256 prefix of the file bytes."""
    path = write(tmp_path, MINIMAL)
    first = load_snapshot(path, environ={}).version
    second = load_snapshot(path, environ={}).version

    path.write_text(MINIMAL + "# a comment changes the bytes\n", encoding="utf-8")
    third = load_snapshot(path, environ={}).version

    assert first == second
    assert first == hashlib.sha256(MINIMAL.encode()).hexdigest()[:16]
    assert len(first) == 16
    assert third != first


def test_snapshot_is_immutable(tmp_path: Path) -> None:
    """Neither the snapshot nor its nested mappings accept assignment."""
    snapshot = load_snapshot(write(tmp_path, FULL), environ=ENV)

    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.version = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.gateway.max_body_bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        snapshot.servers["evil"] = snapshot.servers["notes"]  # type: ignore[index]
    with pytest.raises(TypeError):
        snapshot.servers["tools"].headers["Authorization"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        snapshot.servers["notes"].env["NOTES_MODE"] = "x"  # type: ignore[index]
    assert snapshot.servers["notes"].env["NOTES_MODE"] == "demo"


def test_audit_contents_is_off_unless_a_server_opts_in(tmp_path: Path) -> None:
    """Reads and gets keep digests only by default; ``audit_contents = true`` opts one server in."""
    snapshot = load_snapshot(
        write(tmp_path, MINIMAL + "audit_contents = true\n[servers.other]\ncommand = 'x'\n")
    )
    assert snapshot.servers["notes"].audit_contents is True
    assert snapshot.servers["other"].audit_contents is False
