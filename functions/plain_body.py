"""What every plain request body is (functions/fleet_bodies.py has the fleet's), apart from the
bodies themselves: `functions.web` reads a body by its model with these alone, so a target whose
route has no plain body (healthz, the webhook, ...) does not build the fleet's body classes
(bench/README.md, Cold start)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self


class BodyError(ValueError):
    """A body that breaks its route's rules; the message starts with the field's place."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")


class PlainBody:
    """A request body read without pydantic: `parse` takes the JSON object, or raises BodyError."""

    @classmethod
    def parse(cls, data: Mapping[str, Any], where: str = "") -> Self:
        raise NotImplementedError
