"""The CLI builds only the parser of the command it runs; it must equal the full parser's."""

from __future__ import annotations

import argparse

import pytest

from hwprofile.cli import _commands, build_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", [c[0] for c in _commands()])
def test_one_command_parser_equals_the_full_one(name: str) -> None:
    full, one = _subparsers(build_parser()), _subparsers(build_parser(name))
    assert list(one) == [name]
    assert one[name].format_help() == full[name].format_help()
    argv = [name, "--format", "argv"] if name == "render" else [name]
    assert vars(build_parser(name).parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_full_parser_lists_every_command() -> None:
    assert list(_subparsers(build_parser())) == [c[0] for c in _commands()]
