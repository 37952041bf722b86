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
import heapq
import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
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


class Deadlines:
    """Every exchange's deadline kept by one thread (a ``threading.Timer`` per request started a
    thread for each ``/metrics`` scrape and ``/health`` probe): :meth:`at` registers a callback for a
    monotonic time, :meth:`cancel` forgets it; the thread starts with the first deadline and sleeps
    until the nearest one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._live: set[int] = set()
        self._next = 0
        self._thread: threading.Thread | None = None

    def at(self, when: float, fire: Callable[[], None]) -> int:
        with self._cond:
            self._next += 1
            key = self._next
            heapq.heappush(self._heap, (when, key, fire))
            self._live.add(key)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="http-deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0][1] == key:
                self._cond.notify()  # sooner than what the thread sleeps for
            return key

    def cancel(self, key: int) -> None:
        with self._cond:
            self._live.discard(key)  # its heap entry is dropped when its time comes

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                when, key, fire = self._heap[0]
                left = when - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                self._live.discard(key)
            with contextlib.suppress(Exception):  # one callback's failure never stops the others
                fire()


DEADLINES = Deadlines()


def connection(url: str, timeout: float) -> http.client.HTTPConnection:
    """A new connection to ``url``'s server (never through a proxy)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"only http:// and https:// URLs are asked, not {redact(url)!r}")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), timeout=timeout)


def _body(
    resp: http.client.HTTPResponse, url: str, cap: int, sock: socket.socket | None, end: float
) -> bytes:
    """``resp``'s body, at most ``cap`` bytes (:class:`TooLarge` past it), each read's socket timeout
    what is left until ``end``."""
    chunks: list[bytes] = []
    size = 0
    while chunk := resp.read1(65536):
        size += len(chunk)
        if size > cap:
            raise TooLarge(f"{redact(url)}: an answer of more than {cap} bytes")
        chunks.append(chunk)
        if sock is not None:
            sock.settimeout(max(0.001, end - time.monotonic()))
    # read1 never marks a response read to its Content-Length as done, and the connection refuses its
    # next request until it is (ResponseNotReady): closed here, the kept socket stays open
    resp.close()
    return b"".join(chunks)


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
    # the exchange's socket, kept: http.client lets go of conn.sock once an answer says the connection
    # closes after it (HTTP/1.0), while the body is still read from that socket
    held: list[socket.socket] = []

    def expire() -> None:
        expired.set()
        sock = held[0] if held else conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # a blocked read returns: the deadline holds

    timer = DEADLINES.at(end, expire)
    try:
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        conn.request(method, path, body=body, headers=headers or {})
        if conn.sock is not None:
            held.append(conn.sock)
        resp = conn.getresponse()
        data = _body(resp, url, cap, held[0] if held else None, end)
        if expired.is_set():  # the deadline's shutdown ends a read as the end of the body would
            raise TimeoutError(f"{redact(url)}: no whole answer within {timeout:g} s")
        return resp.status, data, not resp.will_close
    except TooLarge:
        raise
    except (http.client.HTTPException, OSError) as e:
        if expired.is_set():
            raise TimeoutError(f"{redact(url)}: no whole answer within {timeout:g} s") from None
        raise e if isinstance(e, OSError) else OSError(f"{redact(url)}: {type(e).__name__}: {e}") from None
    finally:
        DEADLINES.cancel(timer)


class Client:
    """One server asked again and again (``/metrics`` every tick, ``/health`` every few seconds) over one
    kept-alive HTTP/1.1 connection: a new TCP connection per question cost more CPU than the answer.
    The server decides: an answer that says it closes (HTTP/1.0, ``Connection: close``) drops the
    connection and the next question opens another. A kept connection the server closed meanwhile (its
    keep-alive timeout) gets one fresh try; a timeout or an answer over the cap does not (the deadline
    is the question's, not each attempt's). Not for concurrent use: one asker per client."""

    def __init__(self, base_url: str, timeout: float = 2.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self.connects = 0  # connections opened (kept-alive ones are opened once)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self,
        path: str,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        cap: int = MAX_BODY,
    ) -> tuple[int, bytes]:
        """``(status, body)`` of a GET of ``path``; raises as :func:`exchange` does."""
        url = self.base_url + path
        took = self.timeout if timeout is None else timeout
        for attempt in (0, 1):
            fresh = self._conn is None
            if self._conn is None:
                self._conn = connection(url, took)
                self.connects += 1
            try:
                status, body, keep = exchange(self._conn, url, headers=headers, timeout=took, cap=cap)
            except (TimeoutError, TooLarge):
                self.close()
                raise
            except (http.client.HTTPException, OSError):
                self.close()
                if attempt or fresh:  # a new connection that fails: the server is not there
                    raise
                continue
            if not keep:
                self.close()
            return status, body
        raise OSError(f"{redact(url)}: unreachable")  # not reached

    def get(self, path: str, timeout: float | None = None) -> tuple[int, bytes] | None:
        """As :func:`get`, on the kept connection: None when nothing answered in time."""
        try:
            return self.request(path, timeout=timeout)
        except (OSError, ValueError):
            return None


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
