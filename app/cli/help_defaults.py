"""The ``(default: X)`` of each flag's help, generated from the settings."""

from __future__ import annotations

import argparse

from pydantic_settings import BaseSettings

from app.shared.settings import Settings

# What a setting left at None means, for the help text.
NONE_MEANS = {
    "storage_device": "cuda when present, else cpu",
    "token": "no token",
    "kv_events_replay_endpoint": "no replay socket",
    "memory_budget_bytes": "the block count decides",
    "mirror_token_file": "no secret: the stream is unsigned",
}


def help_default(settings_cls: type[BaseSettings], dest: str) -> str:
    """A setting's built-in default as the help shows it: on/off, none (and
    what that means), the number or the text ('' for empty)."""
    defaults = settings_cls.model_construct()  # the defaults, not the environment
    value = getattr(defaults, dest)
    if dest == "num_blocks" and value is None and isinstance(defaults, Settings):
        value = defaults.effective_num_blocks
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return f"none: {NONE_MEANS[dest]}" if dest in NONE_MEANS else "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "none"
    return str(value) if value != "" else "''"


def with_defaults(p: argparse.ArgumentParser, settings_cls: type[BaseSettings]) -> None:
    """Append ``(default: X)`` from the settings to every flag of ``p`` that
    sets one (generated, so the help cannot drift from the settings)."""
    fields = settings_cls.model_fields
    for action in p._actions:
        if action.dest in fields and action.option_strings and action.help:
            shown = help_default(settings_cls, action.dest).replace("%", "%%")
            if isinstance(action, argparse._StoreFalseAction):  # --no-X: say what X is
                shown = f"{action.dest.replace('_', ' ')} {shown}"
            action.help = f"{action.help} (default: {shown})"
