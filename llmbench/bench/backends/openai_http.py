"""A minimal HTTP/1.1 client on asyncio streams, enough to stream Server-Sent Events from one POST.

Standard library only (no aiohttp/httpx: the machines that run benchmarks may not have them). One
connection per request (``Connection: close``), so requests never wait for each other in a pool; bodies
framed by ``Transfer-Encoding: chunked``, ``Content-Length`` or the connection closing are all read, and
each SSE event is handed over as soon as its blank line arrives, so the caller can stamp it then.

A connection that closes in the middle of a chunk raises ``asyncio.IncompleteReadError``; a status other
than 2xx raises :class:`HTTPStatusError` with the start of the body (what servers put their reason in).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import NamedTuple
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024  # a response head larger than this is not from an inference server
ERROR_BODY_BYTES = 2048  # how much of an error response is kept for the record


class HTTPStatusError(Exception):
    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {body}".rstrip(": "))
        self.status = status
        self.body = body


class Endpoint(NamedTuple):
    scheme: str
    host: str
    port: int
    path: str  # with the query, as sent on the request line

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.scheme, parts.hostname or "", port, path)

    def with_path(self, path: str) -> Endpoint:
        return self._replace(path=path)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.path}"

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


class Response(NamedTuple):
    status: int
    reason: str
    headers: dict[str, str]  # lower-case names
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


async def request(
    endpoint: Endpoint,
    method: str,
    body: bytes | None,
    headers: dict[str, str],
    connect_timeout: float,
) -> Response:
    """Send one request and read the response head; the body is left to :func:`body_lines`."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(endpoint.host, endpoint.port, limit=MAX_HEAD_BYTES), connect_timeout
        )
    except TimeoutError:
        raise ConnectionError(f"no connection within connect_timeout_s={connect_timeout:g}") from None
    if endpoint.scheme == "https":
        await _start_tls(writer, endpoint, connect_timeout)
    try:
        lines = [f"{method} {endpoint.path} HTTP/1.1", f"Host: {endpoint.host_header}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
        await writer.drain()
        status_line = (await reader.readuntil(b"\n")).decode("latin-1").strip()
        version, _, rest = status_line.partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/") or not code.isdigit():
            raise ConnectionError(f"not an HTTP response: {status_line[:80]!r}")
        head: dict[str, str] = {}
        while True:
            line = (await reader.readuntil(b"\n")).decode("latin-1").strip()
            if not line:
                break
            name, _, value = line.partition(":")
            head[name.strip().lower()] = value.strip()
    except BaseException:
        writer.close()
        raise
    return Response(int(code), reason, head, reader, writer)


async def _start_tls(writer: asyncio.StreamWriter, endpoint: Endpoint, connect_timeout: float) -> None:
    """TLS on a connection made: a failure names the handshake, not the connection (a plain-HTTP port
    never answers a TLS hello, or answers it in plain text)."""
    where = f"{endpoint.host}:{endpoint.port}"
    try:
        await asyncio.wait_for(
            writer.start_tls(ssl.create_default_context(), server_hostname=endpoint.host), connect_timeout
        )
    except TimeoutError:
        writer.close()
        raise ConnectionError(
            f"connected to {where}, but the TLS handshake did not finish within connect_timeout_s="
            f"{connect_timeout:g}: is it a plain-HTTP server (an http:// URL)?"
        ) from None
    except ssl.SSLError as exc:
        writer.close()
        plain = (
            " (the server answered in plain HTTP: use an http:// URL)" if "WRONG_VERSION" in str(exc) else ""
        )
        raise ConnectionError(f"the TLS handshake with {where} failed: {exc.reason or exc}{plain}") from None


async def body_bytes(resp: Response) -> AsyncIterator[bytes]:
    """The body as it arrives, whatever its framing."""
    reader = resp.reader
    if "chunked" in resp.headers.get("transfer-encoding", "").lower():
        while True:
            size_line = (await reader.readuntil(b"\n")).split(b";")[0].strip()
            size = int(size_line or b"0", 16)
            if size == 0:
                while (await reader.readuntil(b"\n")).strip():  # trailers, then the final blank line
                    pass
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)  # the CRLF after each chunk
    elif "content-length" in resp.headers:
        left = int(resp.headers["content-length"])
        while left > 0:
            data = await reader.read(min(left, 65536))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(data)
            yield data
    else:  # the body ends when the server closes the connection
        while data := await reader.read(65536):
            yield data


async def body_lines(resp: Response) -> AsyncIterator[str]:
    """Lines of the body (without their line endings), each as soon as it is complete."""
    pending = b""
    async for data in body_bytes(resp):
        pending += data
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", "replace")


async def read_error_body(resp: Response) -> str:
    """The start of an error response's body, for the record (best effort, never raises)."""
    got = b""
    try:
        async for data in body_bytes(resp):
            got += data
            if len(got) >= ERROR_BODY_BYTES:
                break
    except (OSError, asyncio.IncompleteReadError, ValueError, asyncio.LimitOverrunError):
        pass
    return " ".join(got[:ERROR_BODY_BYTES].decode("utf-8", "replace").split())


class SSEEvent(NamedTuple):
    event: str  # "message" unless the server named it
    data: str


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[SSEEvent]:
    """Server-Sent Events: ``data:`` lines joined, dispatched at each blank line (and at the end)."""
    data: list[str] = []
    event = "message"
    async for line in lines:
        if not line:
            if data:
                yield SSEEvent(event, "\n".join(data))
            data, event = [], "message"
        elif line.startswith(":"):  # a comment (keep-alive)
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value
    if data:
        yield SSEEvent(event, "\n".join(data))


async def close(resp: Response) -> None:
    resp.writer.close()
    try:
        await asyncio.wait_for(resp.writer.wait_closed(), 1.0)
    except (TimeoutError, OSError, ssl.SSLError):
        pass
