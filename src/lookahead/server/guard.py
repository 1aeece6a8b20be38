"""Checks made on every HTTP request before any endpoint runs: Host, API key, body size.

``Guard`` is plain ASGI middleware (it sees the headers before the body is read):

* **Host** (``allowed_hosts``): a page in a browser can make the browser send requests to
  127.0.0.1 under a name the attacker controls (DNS rebinding); its ``Host`` header then holds
  that name. A server bound to loopback answers only ``localhost``, ``127.0.0.1`` and
  ``[::1]`` (any port) and the names the operator allowed; others get 400.
* **API key** (``api_keys``): every ``/v1`` path needs ``Authorization: Bearer <key>`` with
  one of the keys, compared in constant time (``secrets.compare_digest``); else 401, as
  vLLM's ``--api-key`` does. ``/health`` and ``/metrics`` stay open, for probes and scrapers.
* **Body size** (``max_body_bytes``): a ``Content-Length`` above the limit is refused with 413
  before a byte of the body is read. A body without one (chunked) is counted as it is read
  (``read_body``).

The index of the key that matched goes in the request's state (``api_key_index``; None
without keys), so that per-client state (``--memory``) can be kept per key.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence

from fastapi import Request
from fastapi.responses import JSONResponse

from lookahead.server.protocol import error_body

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})


class BodyTooLargeError(Exception):
    """The body passed ``max_body_bytes`` while it was read."""


def host_name(header: str) -> str:
    """The host of a ``Host`` header, port dropped, lowercase: ``[::1]:8000`` -> ``[::1]``."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        return header[: end + 1] if end > 0 else header
    return header.split(":", 1)[0]


def allowed_host_set(extra: Iterable[str]) -> frozenset[str] | None:
    """Loopback names plus ``extra`` (``--allowed-host``); None when ``extra`` holds ``*``."""
    names = {host_name(name) for name in extra}
    if "*" in names:
        return None
    return LOOPBACK_HOSTS | names


def too_large_error(limit: int) -> JSONResponse:
    return JSONResponse(error_body(f"the request body is larger than this server's limit of "
                                   f"{limit} bytes", code="request_too_large"), status_code=413)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, read chunk by chunk; ``BodyTooLargeError`` once it passes ``limit`` bytes."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError
        chunks.append(chunk)
    return b"".join(chunks)


class Guard:
    """ASGI middleware: the Host, API-key and Content-Length checks of the module docstring.

    allowed_hosts: None accepts any Host. api_keys: empty needs none.
    """

    def __init__(self, app, *, allowed_hosts: frozenset[str] | None, api_keys: Sequence[str],
                 max_body_bytes: int) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts
        self.api_keys = [key.encode("utf-8") for key in api_keys]
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {}
        for name, value in scope.get("headers", ()):
            headers.setdefault(name.lower(), value)
        refusal, key_index = self._check(scope.get("path", ""), headers)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        scope.setdefault("state", {})["api_key_index"] = key_index
        await self.app(scope, receive, send)

    def _check(self, path: str, headers: dict[bytes, bytes]):
        """(a refusal response or None, the index of the API key that matched or None)."""
        if self.allowed_hosts is not None:
            host = host_name(headers.get(b"host", b"").decode("latin-1"))
            if host not in self.allowed_hosts:
                return JSONResponse(error_body(
                    "unexpected Host header; start the server with --allowed-host NAME to "
                    "accept it", code="invalid_host"), status_code=400), None
        key_index = None
        if self.api_keys and (path == "/v1" or path.startswith("/v1/")):
            key_index = self._key_index(headers.get(b"authorization", b""))
            if key_index is None:
                return JSONResponse(error_body(
                    "Incorrect or missing API key: send the header 'Authorization: Bearer "
                    "<key>'", code="invalid_api_key"), status_code=401,
                    headers={"WWW-Authenticate": "Bearer"}), None
        length = headers.get(b"content-length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                size = -1
            if size > self.max_body_bytes:
                return too_large_error(self.max_body_bytes), None
        return None, key_index

    def _key_index(self, authorization: bytes) -> int | None:
        scheme, _, token = authorization.partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        token = token.strip()
        found = None
        for index, key in enumerate(self.api_keys):  # every key compared: timing shows nothing
            if secrets.compare_digest(token, key) and found is None:
                found = index
        return found
