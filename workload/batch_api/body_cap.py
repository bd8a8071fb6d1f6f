"""A request body counted as it arrives (issue 60): refused once it passes its cap, before the rest is read.

Starlette's form parser spools a multipart body whole (to a temporary file past 1 MB) before a route sees any
of it, and a chunked body declares no length to check up front: a 300 MB chunked upload to a server with a
200 MB limit was spooled to 255 MB before the route's own count refused it. Counting the ASGI `http.request`
messages the parser pulls stops the read at the cap; the 413 is answered and the connection closed with the rest
of the body unread.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import Message

from workload.batch_api.objects import ApiError


def capped(request: Request, most: int, what: str, param: str) -> Request:
    """`request` whose body, read through it, raises OpenAI's 413 once more than `most` bytes have come."""
    receive, seen = request.receive, 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > most:
                raise ApiError(413, f"the request is larger than this server's limit of {most} bytes for {what}", param)
        return message

    return Request(request.scope, counted)
