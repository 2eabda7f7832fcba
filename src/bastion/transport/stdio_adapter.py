"""The local stdio adapter behind ``bastion connect`` (DESIGN sections 0 and 1; issue #4 item 6).

Owns the relay between one local MCP client, speaking newline-delimited
JSON-RPC on stdin/stdout, and the gateway's Streamable HTTP endpoint, in the
session era: ``initialize`` and ``Mcp-Session-Id``, JSON or SSE answers, and
the GET stream for what the gateway sends unasked. It is a transparent relay:
JSON-RPC ids and progress tokens pass through unchanged, so
``notifications/cancelled`` and progress keep meaning what the client meant,
and server-to-client requests (sampling, elicitation, roots) reach the client
from any SSE stream while its answers go back by POST.

What it adds, and why:

- **Renewal without a reconnect.** The credential file is re-read when it
  changes, and once more after a 401; the client stays connected.
- **A gateway 404** means the gateway ended this transport session (idle
  expiry, restart, revocation cleanup). The adapter initializes a new one
  with the client's own ``initialize`` params, replays the request that met
  the 404 (refused before dispatch, so it never ran), and tells the client
  ``notifications/tools/list_changed``, since the new session's surface may
  differ. A request whose answer stream ends without an answer is answered
  with an error, never replayed: it may have run.

It must never write the credential anywhere but the ``Authorization``
header: not in a log line, on stderr, or in an error sent to the client.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx

__all__ = ["CredentialFile", "CredentialUnavailable", "StdioAdapter", "connect_stdio"]

logger = logging.getLogger(__name__)

Message = dict[str, Any]
SendToClient = Callable[[Message], Awaitable[None]]

_ACCEPT = "application/json, text/event-stream"
_REPLAYS_AFTER_404 = 2
_STREAM_BACKOFF_S = (0.1, 5.0)
_DELETE_TIMEOUT_S = 2.0
# An answer the gateway let go mid-call (its upstream's polling close, SEP-1699) is fetched again
# with GET and Last-Event-ID; at most this many times in a row.
_ANSWER_RESUMES = 5
_INTERNAL_ERROR = -32603


class CredentialUnavailable(Exception):
    """The credential file has never held a usable token (its path is named; its contents never)."""


class CredentialFile:
    """A bearer credential kept in a file, re-read whenever the file changes (renewal)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token: str | None = None

    def __repr__(self) -> str:
        return f"CredentialFile({str(self._path)!r})"

    def authorization(self, *, reread: bool = False) -> str:
        """The ``Authorization`` value from the file as it is now.

        A missing, empty or multi-word file (one being replaced, say) keeps
        the last good credential. Raises :class:`CredentialUnavailable` if
        there never was one.
        """
        try:
            stat = os.stat(self._path)
            stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if reread or stamp != self._stamp:
                token = self._path.read_text(encoding="utf-8").strip()
                if token and not any(c.isspace() for c in token):
                    self._token, self._stamp = token, stamp
        except (OSError, UnicodeDecodeError):
            pass
        if self._token is None:
            raise CredentialUnavailable(f"no usable credential in {self._path}")
        return "Bearer " + self._token


class _GatewayFailed(Exception):
    """The gateway refused or could not be reached; ``error`` is the JSON-RPC error object to relay."""

    def __init__(self, error: Message) -> None:
        super().__init__(error.get("message", "gateway failure"))
        self.error = error


class StdioAdapter:
    """One local client's relay to one gateway transport session (re-made as often as needed)."""

    def __init__(
        self, url: str, credential: CredentialFile, http: httpx.AsyncClient, send_to_client: SendToClient
    ) -> None:
        self._url = url
        self._credential = credential
        self._http = http
        self._to_client = send_to_client
        self._session_id: str | None = None
        self._protocol_version: str | None = None
        self._initialize_params: Message | None = None
        self._initialized = anyio.Event()
        self._reinitialize_lock = anyio.Lock()
        self._reinitializations = 0
        self._stream_started = False
        self._task_group: anyio.abc.TaskGroup | None = None

    @property
    def session_id(self) -> str | None:
        """The gateway transport session in use now."""
        return self._session_id

    async def serve(self, lines: AsyncIterable[bytes | str]) -> None:
        """Relay until the client closes its side (``lines`` ends), then end the gateway session."""
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                async for line in lines:
                    if line.strip():
                        await self._route(line)
                tg.cancel_scope.cancel()
        finally:
            await self._end_session()

    # ------------------------------------------------------------------ from the client

    async def _route(self, line: bytes | str) -> None:
        assert self._task_group is not None
        try:
            message = json.loads(line)
        except ValueError:
            await self._to_client(_error(None, -32700, "Parse error: not JSON"))
            return
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            request_id = message.get("id") if isinstance(message, dict) else None
            await self._to_client(_error(request_id, -32600, "Invalid Request: not a JSON-RPC 2.0 message"))
            return
        if "method" in message and "id" in message:
            if message["method"] == "initialize":
                # Set before any later line is read, so requests behind it wait for it.
                self._initialize_params = dict(message.get("params") or {})
                self._initialized = anyio.Event()
                self._task_group.start_soon(self._initialize, message)
            else:
                self._task_group.start_soon(self._request, message)
        elif "method" in message:
            self._task_group.start_soon(self._notify, message)
        else:
            self._task_group.start_soon(self._answer_gateway, message)

    async def _initialize(self, message: Message) -> None:
        previous = self._session_id
        try:
            reply = await self._open_session(message)
        except _GatewayFailed as exc:
            reply = {"jsonrpc": "2.0", "id": message["id"], "error": exc.error}
        finally:
            self._initialized.set()
        await self._to_client(reply)
        if previous is not None and self._session_id != previous:
            await self._delete(previous)  # the client started over: its old session is done

    async def _request(self, message: Message) -> None:
        if self._initialize_params is None:
            # e.g. server/discover from a client probing for the sessionless era: it falls back to initialize.
            await self._to_client(
                _error(
                    message["id"], -32601, "Method not found: this adapter speaks the session era; initialize"
                )
            )
            return
        await self._initialized.wait()
        try:
            reply = await self._exchange(message)
        except _GatewayFailed as exc:
            reply = {"jsonrpc": "2.0", "id": message["id"], "error": exc.error}
        await self._to_client(reply)

    async def _notify(self, message: Message) -> None:
        if self._initialize_params is None:
            return
        await self._initialized.wait()
        for _ in range(2):
            session_id = self._session_id
            if session_id is None:
                return
            status = await self._post_quietly(message, session_id)
            if status != 404 or message["method"] in ("notifications/cancelled", "notifications/initialized"):
                break
            # Anything else still matters to the new session (roots changed, say): send it there.
            if not await self._reinitialize_quietly(session_id):
                return
        if message["method"] == "notifications/initialized" and not self._stream_started:
            self._stream_started = True
            assert self._task_group is not None
            self._task_group.start_soon(self._server_stream)

    async def _answer_gateway(self, message: Message) -> None:
        # An answer to a server-to-client request; one for an ended session has nowhere to go.
        if self._session_id is not None:
            await self._post_quietly(message, self._session_id)

    # ------------------------------------------------------------------ to the gateway

    def _headers(self, session_id: str | None, authorization: str, accept: str = _ACCEPT) -> dict[str, str]:
        headers = {"authorization": authorization, "accept": accept, "content-type": "application/json"}
        if session_id is not None:
            headers["mcp-session-id"] = session_id
            if self._protocol_version is not None:
                headers["mcp-protocol-version"] = self._protocol_version
        return headers

    async def _open_session(self, initialize: Message) -> Message:
        """POST ``initialize`` with no session; adopt the session it opens. Returns the reply."""
        headers = self._headers(None, self._credential.authorization())
        try:
            async with self._http.stream(
                "POST", self._url, content=_dumps(initialize), headers=headers
            ) as response:
                reply = await self._relay(initialize["id"], response)
                session_id = response.headers.get("mcp-session-id")
        except httpx.HTTPError as exc:
            raise _GatewayFailed(_unreachable(exc)) from None
        if "result" in reply and session_id:
            self._session_id = session_id
            result = reply["result"]
            self._protocol_version = result.get("protocolVersion") if isinstance(result, dict) else None
        return reply

    async def _exchange(self, message: Message) -> Message:
        """POST one request on the current session; re-initialize and replay after a 404."""
        body = _dumps(message)
        for _ in range(_REPLAYS_AFTER_404 + 1):
            session_id = self._session_id
            if session_id is None:
                raise _GatewayFailed(
                    {"code": _INTERNAL_ERROR, "message": "the gateway session was never opened"}
                )
            authorization = self._credential.authorization()
            headers = self._headers(session_id, authorization)
            try:
                async with self._http.stream("POST", self._url, content=body, headers=headers) as response:
                    if response.status_code == 404:
                        await response.aread()
                        await self._reinitialize(session_id)
                        continue
                    if (
                        response.status_code == 401
                        and self._credential.authorization(reread=True) != authorization
                    ):
                        await response.aread()
                        continue  # renewed under us: the same request, with the new credential
                    return await self._relay(message["id"], response)
            except httpx.HTTPError as exc:
                raise _GatewayFailed(_unreachable(exc)) from None
        raise _GatewayFailed({"code": _INTERNAL_ERROR, "message": "the gateway session keeps ending"})

    async def _relay(self, request_id: Any, response: httpx.Response) -> Message:
        """The reply to ``request_id``; whatever the gateway streams before it goes to the client."""
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            last_event_id: str | None = None
            stream = response
            async with contextlib.AsyncExitStack() as resumed:
                for _ in range(_ANSWER_RESUMES + 1):
                    async for event_id, message in _sse_messages(stream.aiter_lines()):
                        last_event_id = event_id or last_event_id
                        if message is None:
                            continue  # a priming event: only where to resume from
                        if _is_reply(message) and message.get("id") == request_id:
                            return message
                        await self._to_client(message)
                    # Ended without the answer: the gateway let the stream go mid-call, and the
                    # rest waits on that stream for a GET with Last-Event-ID.
                    if last_event_id is None or self._session_id is None:
                        break
                    headers = self._headers(
                        self._session_id, self._credential.authorization(), accept="text/event-stream"
                    )
                    headers.pop("content-type")
                    headers["last-event-id"] = last_event_id
                    await resumed.aclose()
                    stream = await resumed.enter_async_context(
                        self._http.stream("GET", self._url, headers=headers)
                    )
                    if stream.status_code != 200:
                        break
            return _error(
                request_id,
                _INTERNAL_ERROR,
                "the gateway ended the answer without a reply; the request may have run",
            )
        raw = await response.aread()
        try:
            decoded = json.loads(raw)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict) and _is_reply(decoded):
            # Refusals before dispatch carry id null: they answer this request.
            return {**decoded, "id": request_id}
        return _error(request_id, _INTERNAL_ERROR, f"the gateway answered HTTP {response.status_code}")

    async def _reinitialize(self, stale_session_id: str) -> None:
        """Open a new gateway session in place of ``stale_session_id`` (once, however many noticed)."""
        async with self._reinitialize_lock:
            if self._session_id != stale_session_id:
                return  # another task already did
            assert self._initialize_params is not None
            self._reinitializations += 1
            initialize = {
                "jsonrpc": "2.0",
                "id": f"bastion-connect-reinitialize-{self._reinitializations}",
                "method": "initialize",
                "params": self._initialize_params,
            }
            reply = await self._open_session(initialize)
            if "error" in reply or self._session_id == stale_session_id:
                raise _GatewayFailed(
                    reply.get("error") or {"code": _INTERNAL_ERROR, "message": "no new session"}
                )
            logger.warning(
                "gateway transport session ended; re-initialized", extra={"count": self._reinitializations}
            )
            await self._post_quietly(
                {"jsonrpc": "2.0", "method": "notifications/initialized"}, self._session_id
            )
        await self._to_client({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})

    async def _reinitialize_quietly(self, stale_session_id: str) -> bool:
        try:
            await self._reinitialize(stale_session_id)
        except _GatewayFailed as exc:
            logger.warning(
                "could not re-initialize the gateway session", extra={"detail": exc.error.get("message")}
            )
            return False
        return True

    async def _post_quietly(self, message: Message, session_id: str | None) -> int | None:
        """POST a notification or an answer; the HTTP status, or ``None`` if the gateway was unreachable."""
        try:
            response = await self._http.post(
                self._url,
                content=_dumps(message),
                headers=self._headers(session_id, self._credential.authorization()),
            )
        except httpx.HTTPError as exc:
            logger.warning("gateway unreachable", extra={"detail": type(exc).__name__})
            return None
        return response.status_code

    async def _server_stream(self) -> None:
        """Hold the GET stream of the current session, relaying what it carries; follow re-initializations."""
        delay = _STREAM_BACKOFF_S[0]
        last_event_id: str | None = None
        streamed_session: str | None = None
        while True:
            session_id = self._session_id
            if session_id != streamed_session:
                last_event_id, streamed_session = None, session_id  # ids resume only their own stream
            if session_id is not None:
                headers = self._headers(
                    session_id, self._credential.authorization(), accept="text/event-stream"
                )
                headers.pop("content-type")
                if last_event_id is not None:
                    headers["last-event-id"] = last_event_id
                try:
                    async with self._http.stream("GET", self._url, headers=headers) as response:
                        if response.status_code == 405:
                            return  # this gateway offers no GET stream
                        if response.status_code == 404:
                            await self._reinitialize_quietly(session_id)
                            continue
                        if response.status_code == 401:
                            self._credential.authorization(reread=True)
                        elif response.status_code == 200:
                            delay = _STREAM_BACKOFF_S[0]
                            async for event_id, message in _sse_messages(response.aiter_lines()):
                                last_event_id = event_id or last_event_id
                                if message is not None:
                                    await self._to_client(message)
                except httpx.HTTPError:
                    pass
            await anyio.sleep(delay)
            delay = min(delay * 2, _STREAM_BACKOFF_S[1])

    async def _end_session(self) -> None:
        if self._session_id is not None:
            await self._delete(self._session_id)

    async def _delete(self, session_id: str) -> None:
        with anyio.move_on_after(_DELETE_TIMEOUT_S, shield=True), contextlib.suppress(httpx.HTTPError):
            await self._http.delete(
                self._url, headers=self._headers(session_id, self._credential.authorization())
            )


async def connect_stdio(url: str, credential_path: Path) -> None:
    """``bastion connect``: relay this process's stdin/stdout to the gateway at ``url``.

    Raises :class:`CredentialUnavailable` before anything is sent if the file holds no token.
    """
    credential = CredentialFile(credential_path)
    credential.authorization()
    stdin = anyio.wrap_file(sys.stdin.buffer)
    stdout = anyio.wrap_file(sys.stdout.buffer)
    write_lock = anyio.Lock()

    async def send_to_client(message: Message) -> None:
        async with write_lock:
            await stdout.write(_dumps(message) + b"\n")
            await stdout.flush()

    timeout = httpx.Timeout(30.0, read=None)  # answer streams stay open as long as their calls run
    async with httpx.AsyncClient(timeout=timeout) as http:
        await StdioAdapter(url, credential, http, send_to_client).serve(_lines(stdin))


async def _lines(stdin: anyio.AsyncFile[bytes]) -> AsyncIterator[bytes]:
    while line := await stdin.readline():
        yield line


async def _sse_messages(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str | None, Message | None]]:
    """``(event id, JSON-RPC message)`` per SSE event; a priming event (an id, empty data) gives
    ``(id, None)``: no message, but where to resume from. Comments are skipped."""
    data: list[str] = []
    event_id: str | None = None
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if line == "":
            payload = "\n".join(data)
            if not payload:
                if event_id:
                    yield event_id, None  # not dispatched (SSE), but its id counts
            else:
                try:
                    message = json.loads(payload)
                except ValueError:
                    message = None
                if isinstance(message, dict):
                    yield event_id, message
                else:
                    logger.warning("the gateway sent an SSE event that is not a JSON-RPC message")
            data, event_id = [], None
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
        elif field == "id":
            event_id = value


def _is_reply(message: Message) -> bool:
    return "method" not in message and ("result" in message or "error" in message)


def _error(request_id: Any, code: int, text: str) -> Message:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": text}}


def _unreachable(exc: httpx.HTTPError) -> Message:
    return {"code": _INTERNAL_ERROR, "message": f"the gateway is unreachable ({type(exc).__name__})"}


def _dumps(message: Message) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
