"""Commands contributed by the designs and the engine, attached to the main app."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
