"""Every flag of ``ca-externalgrpc`` and of the demo explains itself and states its default."""

from __future__ import annotations

import argparse

import pytest

from devstack.__main__ import build_parser as demo_parser
from server.cli import build_parser


def _parsers() -> dict[str, argparse.ArgumentParser]:
    found = {"python -m devstack": demo_parser()}
    pending = [("ca-externalgrpc", build_parser())]
    while pending:  # commands and their sub-commands (config from-in-tree)
        name, parser = pending.pop()
        found[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending += [(f"{name} {sub_name}", sub) for sub_name, sub in action.choices.items()]
    return found


PARSERS = _parsers()


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_flag_has_help_and_its_default_shows(name: str) -> None:
    parser = PARSERS[name]
    text = " ".join(parser.format_help().split())  # undo the line wrapping
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        assert action.help, f"{name} {action.option_strings[0]} has no help text"
        if action.default not in (None, False, argparse.SUPPRESS):
            assert f"(default: {action.default})" in text, f"{name} {action.option_strings[0]}: default not shown"


def test_the_production_cli_has_no_demo_command() -> None:
    assert "ca-externalgrpc demo" not in PARSERS
    assert {
        "ca-externalgrpc serve",
        "ca-externalgrpc validate",
        "ca-externalgrpc config from-in-tree",
        "ca-externalgrpc status",
    } <= set(PARSERS)
