"""HTTP to the instances hwprofile started: never through a proxy.

``urllib.request.urlopen`` honours ``http_proxy``/``HTTP_PROXY``; with a proxy in the environment and
no matching ``no_proxy``, every ``/health`` poll to 127.0.0.1 would go to the proxy (and a start would
time out). The opener here has an empty ProxyHandler: no proxy at all, whatever the environment."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def urlopen(request: str | urllib.request.Request, timeout: float = 10.0) -> Any:
    """``urllib.request.urlopen`` without any proxy (for requests to an instance)."""
    return _DIRECT.open(request, timeout=timeout)


def get(url: str, timeout: float = 2.0) -> tuple[int, bytes] | None:
    """(status, body) of a GET to ``url`` without any proxy; None when nothing answered."""
    try:
        with _DIRECT.open(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (urllib.error.URLError, OSError, TimeoutError, ValueError):
        return None


def healthy(base_url: str, timeout: float = 2.0) -> bool:
    got = get(base_url + "/health", timeout)
    return got is not None and got[0] == 200


def post_json(url: str, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    """POST ``body`` as JSON to ``url`` without any proxy and return the JSON reply (an HTTP error
    raises ``urllib.error.HTTPError``, nothing answering ``URLError``/``OSError``)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with _DIRECT.open(req, timeout=timeout) as resp:
        reply: dict[str, Any] = json.loads(resp.read())
    return reply
