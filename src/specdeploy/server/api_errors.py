"""Errors that become an HTTP answer with SGLang's OpenAI-style error body."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any


class ApiError(Exception):
    """A request the server refuses: the status code and a message saying what is wrong and what to do."""

    def __init__(
        self, message: str, status: int = 400, param: str | None = None, err_type: str | None = None
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.err_type = err_type or _default_type(status)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, self.err_type, self.param)


def error_body(
    message: str, status: int, err_type: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """SGLang's `ErrorResponse`: {"object": "error", "message", "type", "param", "code"}."""
    return {
        "object": "error",
        "message": message,
        "type": err_type or _default_type(status),
        "param": param,
        "code": status,
    }


def _default_type(status: int) -> str:
    # SGLang's serving code names errors after the HTTP status ("BadRequestError", "NotFoundError", ...)
    name = HTTPStatus(status).phrase.replace(" ", "")
    return name if name.endswith("Error") else name + "Error"
