"""Errors that become an HTTP answer with SGLang's OpenAI-style error body."""

from __future__ import annotations

from typing import Any

from specdeploy.sglang_protocol import default_error_type, error_body


class ApiError(Exception):
    """A request the server refuses: the status code and a message saying what is wrong and what to do."""

    def __init__(
        self, message: str, status: int = 400, param: str | None = None, err_type: str | None = None
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.err_type = err_type or default_error_type(status)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, self.err_type, self.param)
