"""Command group for fleetgate.bench (placeholder until implemented)."""

import typer

app = typer.Typer(no_args_is_help=True)
