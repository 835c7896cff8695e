"""CLI command modules; each exposes `register(app)`."""

from __future__ import annotations

import importlib

import typer

# Order is the order of `--help`.
_MODULES = ["run", "demo", "broker", "topics", "synth", "dlq", "tail", "lag", "prompts", "acls"]


def register_all(app: typer.Typer) -> None:
    for name in _MODULES:
        try:
            module = importlib.import_module(f"rollout_stream.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"rollout_stream.commands.{name}":
                continue  # not written yet
            raise
        module.register(app)
