"""OpenAI-style JSON errors: ``{"error": {"message", "type", "param", "code"}}``, never a traceback."""
from __future__ import annotations

from typing import Optional


class ApiError(Exception):
    """A request the server refuses, with the HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: Optional[str] = None,
                 code: Optional[str] = None, headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
