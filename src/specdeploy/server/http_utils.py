"""Small HTTP helpers shared by the routes: JSON bodies and the service on the app state."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from specdeploy.server.api_errors import ApiError
from specdeploy.server.service import EngineService


def service_of(request: Request) -> EngineService:
    return request.app.state.service


async def read_json(request: Request) -> Any:
    body = await request.body()
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"The request body is not valid JSON ({exc}); send a JSON object.") from None


async def read_model(request: Request, model: type[BaseModel]) -> Any:
    """Parse the body into `model`; every type or shape problem becomes one 400 naming the fields."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ApiError(f"The request body must be a JSON object, got {type(body).__name__}.")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        raise ApiError(f"Invalid request: {problems}") from None
