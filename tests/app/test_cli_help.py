"""``serve --help`` (and ``observe --help``) show the true defaults: every
flag that sets a setting shows ``(default: X)`` and X is that setting's
value in ``Settings()`` (``ObserverSettings()``)."""

from __future__ import annotations

import argparse
import re
from typing import Any

import pytest

from app.cli import main, parser
from app.shared.settings import ObserverSettings, Settings

ENTRY = re.compile(r"^  (-\S.*)$")


def help_text(capsys: pytest.CaptureFixture[str], command: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def entries(text: str) -> dict[str, str]:
    """flag -> its help, whitespace collapsed (argparse wraps lines)."""
    out: dict[str, str] = {}
    current: list[str] | None = None
    flags: list[str] = []
    for line in [*text.splitlines(), ""]:
        m = ENTRY.match(line)
        if (m or not line.startswith("    ") or not line.strip()) and current is not None:
            for f in flags:
                out[f] = " ".join(" ".join(current).split())
            current = None
        if m:
            head = m.group(1)
            flags = re.findall(r"(--?[\w-]+)", head.split("  ")[0])
            current = [head]
        elif current is not None:
            current.append(line)
    return out


def parse_default(shown: str) -> Any:
    if shown.startswith("none"):
        return None
    word = shown.split()[-1]
    if word in ("on", "off"):
        return word == "on"
    if shown == "''":
        return ""
    for kind in (int, float):
        try:
            return kind(shown)
        except ValueError:
            pass
    return shown


def subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    p: argparse.ArgumentParser = sub.choices[name]
    return p


@pytest.mark.parametrize(
    ("command", "settings"), [("serve", Settings), ("observe", ObserverSettings)]
)
def test_every_flag_shows_its_true_default(
    capsys: pytest.CaptureFixture[str], command: str, settings: type[Any]
) -> None:
    text = help_text(capsys, command)
    found = entries(text)
    truth = settings()
    checked = 0
    for action in subparser(command)._actions:
        if action.dest not in settings.model_fields or not action.option_strings:
            continue
        if action.help is None:  # the --no-X twin of a flag that has the help
            continue
        flag = action.option_strings[0]
        assert flag in found, f"{flag} missing from {command} --help"
        m = re.search(r"\(default: (.+?)\)$", found[flag])
        assert m, f"{flag}: no default in {found[flag]!r}"
        want = getattr(truth, action.dest)
        if action.dest == "num_blocks" and want is None:
            want = truth.effective_num_blocks
        got = parse_default(m.group(1))
        if isinstance(want, list):  # a repeated flag: its items, comma separated
            got = [] if got is None else [parse_default(x) for x in m.group(1).split(",")]
        assert got == want, (flag, m.group(1), want)
        # none hand-written: one default, no bare "(10)" or "(on)" left in the text
        assert found[flag].count("(default:") == 1, found[flag]
        assert not re.search(r"\((\d[\d.]*|on|off|none|'')\)", found[flag]), found[flag]
        checked += 1
    assert checked >= (25 if command == "serve" else 8)


def test_the_defaults_the_issue_named(capsys: pytest.CaptureFixture[str]) -> None:
    found = entries(help_text(capsys, "serve"))
    assert found["--tick-hz"].endswith("(default: 20)")
    assert found["--demo-rate"].endswith("(default: 8)")
    assert found["--num-blocks"].endswith("(default: 8192)")
    assert found["--log-level"].endswith("(default: info)")
    assert found["--caching"].endswith("(default: on)")
