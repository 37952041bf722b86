"""HTTP to a vLLM server: the one way hwprofile asks one anything (``/health``, ``/metrics``,
``/v1/models``, completions, ``/detokenize``), and the one rule for the URLs users give.

- Never through a proxy: ``urllib`` honours ``http_proxy``; with a proxy in the environment every
  ``/health`` poll to 127.0.0.1 would go to it. :mod:`http.client` is used directly.
- Bounded: a **deadline** for the whole exchange (a server that sends one byte every 200 ms passes
  every per-read socket timeout, so a timer closes the connection when the time is up), and a cap on
  the body (``/dev/zero`` behind a URL would otherwise be read until memory runs out).
- A redirect is never followed: its status is the answer (a server that sends hwprofile elsewhere
  is not the server asked, and must not be reported as it).
- :func:`check_url`: what a command accepts as a server URL (``--url``, ``--baseline-url``,
  ``--advice-from``): ``http`` or ``https``, a host, no credentials (vLLM takes an API key as a
  header, never in the URL, and a password must not end up in a report); refused with exit 2
  naming the flag. :func:`redact` shows a URL without its password.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Any

from ..errors import InputError

MAX_BODY = 16 << 20  # bytes of one answer (a /metrics page of a large server is a few hundred KiB)


class HttpError(OSError):
    """A server answered with an error status; ``status`` and the start of its ``body`` are kept."""

    def __init__(self, url: str, status: int, body: bytes = b"") -> None:
        super().__init__(f"{redact(url)}: HTTP {status}")
        self.status, self.body = status, body


class TooLarge(OSError):
    """An answer longer than the cap the caller set."""


class BadUrl(InputError):
    """A URL given on the command line that hwprofile will not use (exit 2, the flag named)."""


def redact(url: str) -> str:
    """``url`` without a password (``user:***@host``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def check_url(url: str, flag: str) -> str:
    """``url`` as a server's base URL (no trailing ``/``), or :class:`BadUrl` naming ``flag``."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise BadUrl(f"{flag} {redact(url)!r}: not a URL ({e})") from None
    if parts.scheme not in ("http", "https"):
        got = f"a {parts.scheme}:// URL" if parts.scheme else "no scheme"
        raise BadUrl(
            f"{flag} {redact(url)!r}: {got}; a vLLM server is http:// or https://, e.g. http://127.0.0.1:8000"
        )
    if not parts.hostname:
        raise BadUrl(f"{flag} {redact(url)!r}: no host; e.g. http://127.0.0.1:8000")
    if parts.username is not None or parts.password is not None:
        raise BadUrl(
            f"{flag} {redact(url)!r}: credentials in a URL are not used (vLLM takes its API key as a "
            "header: server.api_key_env); give the URL without them"
        )
    if parts.query or parts.fragment:
        raise BadUrl(f"{flag} {redact(url)!r}: a server's base URL has no query or fragment")
    if port == 0:
        raise BadUrl(f"{flag} {redact(url)!r}: port 0")
    return url.rstrip("/")


def connection(url: str, timeout: float) -> http.client.HTTPConnection:
    """A new connection to ``url``'s server (never through a proxy)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"only http:// and https:// URLs are asked, not {redact(url)!r}")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), timeout=timeout)


def exchange(
    conn: http.client.HTTPConnection,
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
    cap: int = MAX_BODY,
) -> tuple[int, bytes, bool]:
    """One request on ``conn``, the whole exchange within ``timeout`` seconds: ``(status, body,
    keep)``, ``keep`` whether the connection can be used again. Raises ``TimeoutError`` when the time
    is up, ``OSError`` (``http.client`` errors included) when the server does not answer or its
    body is over ``cap`` bytes."""
    parts = urllib.parse.urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    end = time.monotonic() + timeout
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # a blocked read returns: the deadline holds

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > cap:
                raise TooLarge(f"{redact(url)}: an answer of more than {cap} bytes")
            chunks.append(chunk)
            if conn.sock is not None:
                conn.sock.settimeout(max(0.001, end - time.monotonic()))
        return resp.status, b"".join(chunks), not resp.will_close
    except TooLarge:
        raise
    except (http.client.HTTPException, OSError) as e:
        if expired.is_set():
            raise TimeoutError(f"{redact(url)}: no whole answer within {timeout:g} s") from None
        raise e if isinstance(e, OSError) else OSError(f"{redact(url)}: {type(e).__name__}: {e}") from None
    finally:
        timer.cancel()


def request(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
    cap: int = MAX_BODY,
) -> tuple[int, bytes]:
    """``(status, body)`` of one request on a connection of its own (see :func:`exchange`)."""
    conn = connection(url, timeout)
    try:
        status, data, _ = exchange(conn, url, method, body, headers, timeout, cap)
        return status, data
    finally:
        conn.close()


def get(url: str, timeout: float = 2.0) -> tuple[int, bytes] | None:
    """(status, body) of a GET to ``url``; None when nothing answered in time."""
    try:
        return request(url, timeout=timeout)
    except (OSError, ValueError):
        return None


def healthy(base_url: str, timeout: float = 2.0) -> bool:
    got = get(base_url + "/health", timeout)
    return got is not None and got[0] == 200


def get_json(url: str, timeout: float = 10.0) -> Any:
    """The JSON answer to a GET; :class:`HttpError` for an error status, ``OSError`` when nothing
    answered, ``ValueError`` when it is not JSON."""
    status, data = request(url, headers={"Accept": "application/json"}, timeout=timeout)
    if status != 200:
        raise HttpError(url, status, data[:2000])
    return json.loads(data)


def post_json(url: str, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    """POST ``body`` as JSON to ``url`` and return the JSON reply; :class:`HttpError` for an error
    status, ``OSError`` when nothing answered, ``ValueError`` when it is not JSON."""
    status, data = request(
        url, "POST", json.dumps(body).encode(), {"Content-Type": "application/json"}, timeout
    )
    if status != 200:
        raise HttpError(url, status, data[:2000])
    reply: dict[str, Any] = json.loads(data)
    return reply
