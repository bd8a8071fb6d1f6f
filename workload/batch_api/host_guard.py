"""The local server's answer to a browser on the same machine (issue 60): a `Host` it does not serve, or a page of
another site, is refused before any route runs.

- DNS rebinding: a page of `evil.example` whose name is made to resolve to 127.0.0.1 reaches the loopback server
  as a same-origin request, but its `Host` header still says `evil.example`. Only the bind address, `localhost`
  when bound to loopback, and the names given with `--allowed-host` are served (as Django's ALLOWED_HOSTS and
  Starlette's TrustedHostMiddleware do); the port is not compared, the name is what rebinding changes.
- CSRF: a page of another site may POST `text/plain` to the server without a preflight (a "simple" request), and
  a body that is JSON creates a batch. Browsers send `Origin` with every cross-origin POST (and `Sec-Fetch-Site`):
  a request whose `Origin` is not a served host, or `null`, or whose `Sec-Fetch-Site` is `cross-site`, is
  refused. Clients that are not browsers (the official SDK, curl) send neither header and pass.

A refusal is OpenAI's error body with 403 (`openai.PermissionDeniedError` in the official client).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from workload.batch_api.objects import ApiError


def served_hosts(bind: str, names: Iterable[str] = ()) -> frozenset[str]:
    """The host names a server bound to `bind` answers: the bind address, `localhost` on loopback, `names`."""
    hosts = {bind.lower().strip("[]"), *(name.lower().strip() for name in names)}
    try:
        loopback = ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        loopback = bind.lower() == "localhost"
    if loopback:
        hosts |= {"localhost", "127.0.0.1", "::1"}
    if "" in hosts:
        raise ValueError("an allowed host name is empty")
    return frozenset(hosts)


def _hostname(authority: str) -> str | None:
    """The name of `host[:port]` (IPv6 in brackets), lowercased; None when it is not one."""
    try:
        return urlsplit(f"//{authority}").hostname
    except ValueError:
        return None


class HostGuard:
    """ASGI middleware: only requests for `hosts`, and from no other site, reach `app`."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str]) -> None:
        self.app, self.hosts = app, hosts

    def _refusal(self, headers: Headers) -> ApiError | None:
        host = _hostname(headers.get("host", ""))
        if host not in self.hosts:
            allowed = ", ".join(sorted(self.hosts))
            message = (
                f"host {headers.get('host', '')!r} is not served here (allowed: {allowed}; --allowed-host adds one)"
            )
            return ApiError(403, message, code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and (origin == "null" or _hostname(urlsplit(origin).netloc) not in self.hosts):
            return ApiError(403, f"requests from another site ({origin}) are refused", code="cross_site_request")
        if headers.get("sec-fetch-site") == "cross-site":
            return ApiError(403, "requests from another site are refused", code="cross_site_request")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(Headers(scope=scope))
            if refusal is not None:
                await JSONResponse(refusal.body(), status_code=refusal.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)
