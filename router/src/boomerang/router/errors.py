"""OpenAI-style error bodies, so that unmodified OpenAI clients show a useful message.

Every error the router produces goes through `ApiError`: 4xx says what is wrong with the
request (and which parameter), 5xx says which upstream stage failed. Nothing else leaks
(no tracebacks, no engine addresses).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web


class ApiError(Exception):
    """An error with an HTTP status, rendered as `{"error": {...}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or _default_type(status)
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI clients expect."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code if self.code is not None else self.status,
            }
        }

    def response(self) -> web.Response:
        """An aiohttp response carrying this error."""
        return web.json_response(self.body(), status=self.status, headers=self.headers or None)


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 413:
        return "request_too_large"
    if status < 500:
        return "invalid_request_error"
    return "upstream_error" if status in (502, 504) else "server_error"


def bad_request(message: str, param: str | None = None) -> ApiError:
    """A 400 naming the offending parameter."""
    return ApiError(400, message, param=param)
