"""What every request is held to before a route sees it: the size of its body, the nesting of its JSON, and
no NUL character anywhere (path, query, headers, body).

Why here, once, and not in each schema:
- size: a body is read whole before it is parsed; past `ApiSettings.max_body_bytes` (the driver's report
  route: `max_report_body_bytes`) the answer is 413 as soon as the count is passed, from Content-Length
  or while the body arrives;
- NaN and Infinity: not JSON, though Python's parser reads them; PostgreSQL's JSON refuses them and a
  response holding one cannot be written;
- nesting: a JSON parser recurses (Python's fails with RecursionError near 1,000 levels, which the API
  answered with a 500 or a 400 depending on the place); the depth is read from the text without parsing
  it (`jobspec.bounds.json_too_deep`, the same limit as a spec's JSON parameters);
- NUL: PostgreSQL refuses NUL in text, so a NUL anywhere would reach the database as a 500. A driver's
  report is a process's output rather than a request to judge: its NULs become U+FFFD (a refused report
  would be resent forever).

Refusals use the error envelope (api/errors.py) and are audited like any refused call: this middleware
runs inside the request-id and audit middlewares.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import envelope
from jobspec.bounds import MAX_JSON_DEPTH, json_skeleton, json_too_deep
from jobspec.issues import SpecIssue
from scheduler.domain.errors import request_issue
from scheduler.settings import ApiSettings

# A JSON escape of NUL: \u0000 after an even number of backslashes (after an odd one it is text).
_NUL_ESCAPE = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")
_REPLACEMENT = rb"\1\\ufffd"
# NaN and Infinity: Python's parser takes them, JSON has no such numbers, and PostgreSQL's JSON refuses them.
_NON_FINITE = re.compile(rb"(?<![A-Za-z0-9_])-?(NaN|Infinity)(?![A-Za-z0-9_])")
# Routes whose NULs are replaced, not refused: what job drivers send (`/v1/internal/jobs/{id}/report`).
_REPORT = re.compile(r"^/v1/internal/jobs/[^/]+/report$")
# Routes that take a file's bytes (multipart/form-data): streamed to the route, never held here, within
# `max_upload_body_bytes` (api/routes/files.py writes them to disk as they come).
_UPLOAD = re.compile(r"^/v1/(files|uploads/[^/]+/parts)$")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class BodyTooLarge(Exception):
    """The body passed its limit: answered 413 without reading the rest."""


class RequestLimits:
    """ASGI middleware: see the module's docstring."""

    def __init__(self, app: ASGIApp, settings: ApiSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        nul = self._nul_outside_body(scope)
        if nul is not None:
            await self._refuse_nul(scope, send, nul)
            return
        if scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        if _UPLOAD.match(scope["path"]) and _is_multipart(scope):
            await self._stream_upload(scope, receive, send)
            return
        report = bool(_REPORT.match(scope["path"]))
        limit = self.settings.max_report_body_bytes if report else self.settings.max_body_bytes
        try:
            body = await self._read(scope, receive, limit)
        except BodyTooLarge:
            request = Request(scope)
            response = envelope(
                request,
                413,
                "request.too_large",
                f"the request body is larger than {limit} bytes",
                {"limit": limit},
            )
            await response(scope, receive, send)
            return
        if _is_json(scope):
            skeleton = json_skeleton(body)
            # (each regular expression behind a plain search for its literal: 30 us a submission less)
            non_finite = b"NaN" in skeleton or b"Infinity" in skeleton
            if not report and non_finite and _NON_FINITE.search(skeleton):  # a driver reports NaN as it was
                issue = SpecIssue(
                    "request.non_finite_number",
                    "body",
                    "the JSON body holds NaN or Infinity, which are not JSON numbers",
                    "send finite numbers",
                )
                await self._refuse(scope, send, issue)
                return
            if json_too_deep(skeleton):
                issue = SpecIssue(
                    "request.too_deep",
                    "body",
                    f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels",
                    f"nest arrays and objects at most {MAX_JSON_DEPTH} levels deep",
                )
                await self._refuse(scope, send, issue)
                return
            if b"\x00" in body or (b"\\u0000" in body and _NUL_ESCAPE.search(body)):
                if not report:
                    await self._refuse_nul(scope, send, "body")
                    return
                body = _NUL_ESCAPE.sub(_REPLACEMENT, body.replace(b"\x00", b""))
        await self.app(scope, _replay(body, receive), send)

    async def _stream_upload(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An upload's body, passed on as it arrives: 413 up front when its Content-Length is over the limit, or
        as soon as the bytes received pass it (the route keeps nothing of a body it did not finish reading)."""
        limit = self.settings.max_upload_body_bytes

        async def too_large() -> None:
            response = envelope(
                Request(scope),
                413,
                "request.too_large",
                f"the upload's body is larger than {limit} bytes",
                {"limit": limit, "hint": "send a large file in parts: POST /v1/uploads"},
            )
            await response(scope, _replay(b"", None), send)

        if _declared_over(scope, limit):
            await too_large()
            return
        size = 0
        started = False

        async def counted() -> Message:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > limit:
                raise BodyTooLarge
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge:
            if started:
                raise
            await too_large()

    @staticmethod
    async def _read(scope: Scope, receive: Receive, limit: int) -> bytes:
        if _declared_over(scope, limit):
            raise BodyTooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    @staticmethod
    def _nul_outside_body(scope: Scope) -> str | None:
        """Where a NUL is in the path, the query or a header value, or None."""
        if "\x00" in scope["path"]:
            return "path"
        if b"\x00" in unquote_to_bytes(scope.get("query_string", b"")):
            return "query"
        for name, value in scope["headers"]:
            if b"\x00" in value:
                return f"header:{name.decode('latin-1')}"
        return None

    async def _refuse_nul(self, scope: Scope, send: Send, where: str) -> None:
        issue = SpecIssue(
            "request.nul_character",
            where,
            f"the request's {where.split(':')[0]} holds a NUL character (U+0000)",
            "remove the NUL character: no text the platform stores may hold one",
        )
        await self._refuse(scope, send, issue)

    @staticmethod
    async def _refuse(scope: Scope, send: Send, issue: SpecIssue) -> None:
        request = Request(scope)
        response = envelope(
            request,
            422,
            "request.invalid",
            f"{issue.field}: {issue.message}",
            {"issues": [request_issue(issue)]},
        )
        await response(scope, _replay(b"", None), send)


def _is_json(scope: Scope) -> bool:
    """FastAPI parses a body as JSON when its type says so, or when it has no type."""
    content_type = dict(scope["headers"]).get(b"content-type", b"").split(b";")[0].strip().lower()
    return not content_type or content_type == b"application/json" or content_type.endswith(b"+json")


def _declared_over(scope: Scope, limit: int) -> bool:
    """Whether the request's Content-Length says its body is over `limit` bytes."""
    declared = dict(scope["headers"]).get(b"content-length")
    return declared is not None and declared.isdigit() and int(declared) > limit


def _is_multipart(scope: Scope) -> bool:
    content_type = dict(scope["headers"]).get(b"content-type", b"").split(b";")[0].strip().lower()
    return content_type == b"multipart/form-data"


def _replay(body: bytes, then: Receive | None) -> Receive:
    """The body, read already, as one message; then what the connection says (a disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if then is None:
            return {"type": "http.disconnect"}
        return await then()

    return receive
