"""The base of every request body that crosses the network: strict, closed, frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictBody(BaseModel):
    """A request body: unknown fields are refused and nothing is coerced."""

    # Strict: the document says what each field is, so `true` is no number and "1" no int.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
