"""What every facts table shares: its source, the day it was checked, how to refresh it; and the error a missing
fact raises. A module of its own so each table's module can build on it without importing the package's others."""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, ConfigDict, Field


class FactsError(ValueError):
    """A value the facts tables do not hold; the message names the table and how to add it."""


class FactsTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    checked: date = Field(description="The day the table was last checked against its source")
    source: str = Field(min_length=20, description="Where the facts come from")
    how: str = Field(min_length=10, description="How to refresh the table")
