"""docs/cli.md's command reference is the one the parsers generate (issue #47): a command, an
option or a help text changed in p2pnode_cli/ without regenerating the page fails here."""

from pathlib import Path

import pytest

from p2pnode_cli import build_parser
from p2pnode_cli.reference import BEGIN, END, USAGE_WIDTH, cli_reference_markdown, leaf_commands, replaced, usage_lines

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
REGENERATE = (
    "docs/cli.md differs from the parsers: regenerate it with `.venv/bin/python -m p2pnode_cli.reference --write`"
)


def test_docs_cli_md_is_the_generated_reference():
    assert cli_reference_markdown() in DOC.read_text(), REGENERATE


def test_every_command_and_option_is_in_the_reference():
    reference = cli_reference_markdown()
    commands = leaf_commands(build_parser())
    assert {name.split()[0] for name, _, _ in commands} == set(build_parser()._subparsers._group_actions[0].choices)
    for name, _, parser in commands:
        assert f"### `p2pnode {name}`" in reference
        for action in parser._actions:
            assert all(option in reference for option in action.option_strings if option not in ("-h", "--help"))


def test_the_reference_does_not_depend_on_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    narrow = cli_reference_markdown()
    monkeypatch.setenv("COLUMNS", "300")
    assert cli_reference_markdown() == narrow
    for name, _, parser in leaf_commands(build_parser()):
        first, *more = usage_lines(f"p2pnode {name}", parser)
        assert first.startswith(f"p2pnode {name}") and all(
            line.startswith(" " * len(f"p2pnode {name} ")) for line in more
        )
        # wrapped at USAGE_WIDTH, whatever the terminal: only one long option (its choices) passes it
        assert all(len(line) <= USAGE_WIDTH or "] [" not in line for line in [first, *more]), name


def test_a_hand_edit_of_the_block_fails_and_write_restores_it():
    generated = cli_reference_markdown()
    page = f"# Intro\n\nprose\n\n{generated}\nouter prose\n"
    edited = page.replace("--config TOML", "--config FILE", 1)
    assert generated not in edited
    assert replaced(edited, generated) == page  # what --write does, the prose around it kept
    with pytest.raises(ValueError, match="no generated block"):
        replaced(edited.replace(END, ""), generated)
    assert generated.startswith(BEGIN) and generated.rstrip().endswith(END)
