"""Command group for fleetgate.simengine (placeholder until implemented)."""

import typer

app = typer.Typer(no_args_is_help=True)
