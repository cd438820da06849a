"""The command reference of docs/cli.md, generated from the `p2pnode` parsers themselves (issue
#47): each command's summary, description, usage line and options, as `p2pnode COMMAND --help`
words them. Edit the parsers' help texts, then regenerate:

    python -m p2pnode_cli.reference          # print the generated block
    python -m p2pnode_cli.reference --write  # replace it in docs/cli.md, between its markers

tests/test_cli_reference.py fails while docs/cli.md holds another block. The output does not
depend on the terminal ($COLUMNS): usage lines are wrapped here, at USAGE_WIDTH, and help texts
are never wrapped.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from . import build_parser

BEGIN = (
    "<!-- Generated from the parsers by `python -m p2pnode_cli.reference --write`: "
    "edit their help texts (p2pnode_cli/), not this block. -->"
)
END = "<!-- End of the generated command reference. -->"
USAGE_WIDTH = 100
DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def leaf_commands(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, summary, parser) of every command that runs something, in the order the parsers were
    added; a group of commands (`bench`) gives its own, named `bench protocol` and so on."""
    found = []
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        summaries = {choice.dest: choice.help for choice in action._choices_actions}
        for name, command in action.choices.items():
            full = f"{path} {name}".strip()
            if command._subparsers:
                found += leaf_commands(command, full)
            else:
                found.append((full, summaries.get(name) or "", command))
    return found


def _shown(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The actions `--help` lists, positionals first, `-h` left out (every command has it)."""
    actions = [
        a for a in parser._actions if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
    ]
    return [a for a in actions if not a.option_strings] + [a for a in actions if a.option_strings]


def _invocation(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    """`--out DIR`, `--json`, `FILE [FILE ...]`: the action as its usage writes it."""
    if not action.option_strings:
        return formatter._format_args(action, action.dest)
    if action.nargs == 0:
        return action.option_strings[0]
    return f"{action.option_strings[0]} {formatter._format_args(action, action.dest.upper())}"


def usage_lines(prog: str, parser: argparse.ArgumentParser) -> list[str]:
    """The usage of `parser` without `usage: ` and `[-h]`, wrapped at USAGE_WIDTH whatever the
    terminal, continuation lines indented under the first argument."""
    formatter = argparse.HelpFormatter(prog, width=USAGE_WIDTH)
    parts = []
    for action in [a for a in _shown(parser) if a.option_strings] + [a for a in _shown(parser) if not a.option_strings]:
        text = _invocation(action, formatter)
        parts.append(text if action.required or not action.option_strings else f"[{text}]")
    lines, indent = [prog], " " * (len(prog) + 1)
    for part in parts:
        if len(lines[-1]) + 1 + len(part) > USAGE_WIDTH and lines[-1].strip():
            lines.append(indent + part)
        else:
            lines[-1] += " " + part
    return lines


def escaped(text: str) -> str:
    """Help text as markdown on one line: `*` and `<` (DIR/*/node.toml, node<i>) literal, each
    docs/PAGE.md a link to that page (docs/cli.md's neighbour), code spans kept as they are."""
    pieces = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(piece if piece.startswith("`") else _markdown(piece) for piece in pieces)


def _markdown(prose: str) -> str:
    prose = re.sub(r"([\\*<])", r"\\\1", prose)
    return re.sub(r"(?<![\w/.-])docs/([\w-]+\.md)\b", r"[docs/\1](\1)", prose)


def _option(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    marks = ["required"] if action.required and action.option_strings else []
    marks += ["repeatable"] if isinstance(action, argparse._AppendAction) else []
    meaning = escaped(formatter._expand_help(action)) if action.help else ""
    shown = f"- `{_invocation(action, formatter)}`" + (f" ({', '.join(marks)})" if marks else "")
    return shown + (f": {meaning}" if meaning else "")


def _synopsis(commands: list[tuple[str, str, argparse.ArgumentParser]]) -> list[str]:
    """One line per command and its summary, the summary wrapped under itself."""
    column = max(len(f"p2pnode {name}") for name, _, _ in commands) + 2
    lines = ["```"]
    for name, summary, _ in commands:
        words, line = " ".join(summary.split()).split(" "), f"p2pnode {name}".ljust(column)
        for word in words:
            if len(line) + len(word) > USAGE_WIDTH and line.strip():
                lines.append(line.rstrip())
                line = " " * column
            line += word + " "
        lines.append(line.rstrip())
    return [*lines, "```"]


def _section(name: str, summary: str, parser: argparse.ArgumentParser) -> list[str]:
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    lines = [f"### `p2pnode {name}`", "", escaped(summary)]
    if parser.description:
        lines += ["", escaped(parser.description)]
    lines += ["", *("    " + line for line in usage_lines(parser.prog, parser)), ""]
    lines += [_option(action, formatter) for action in _shown(parser)] or ["No options."]
    return [*lines, ""]


def cli_reference_markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """The generated block of docs/cli.md, its markers included: the synopsis (one line per
    command), then per command its summary, description, usage and options."""
    commands = leaf_commands(parser or build_parser())
    lines = [BEGIN, "", "## Commands", "", *_synopsis(commands), ""]
    for name, summary, command in commands:
        lines += _section(name, summary, command)
    return "\n".join([*lines, END]) + "\n"


def replaced(document: str, block: str) -> str:
    """`document` with the text from its BEGIN marker to its END marker (both lines) replaced."""
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise ValueError("docs/cli.md has no generated block: put the two marker lines where it goes")
    return document[:start] + block + document[end + len(END) :].removeprefix("\n")


def main(argv: list[str] | None = None) -> int:
    arguments = argparse.ArgumentParser(prog="python -m p2pnode_cli.reference", description=__doc__.split("\n\n")[0])
    arguments.add_argument(
        "--write", nargs="?", const=DOC, type=Path, metavar="FILE", help=f"replace the block in FILE (default {DOC})"
    )
    args = arguments.parse_args(argv)
    block = cli_reference_markdown()
    if args.write is None:
        sys.stdout.write(block)
    else:
        args.write.write_text(replaced(args.write.read_text(), block))
        print(f"{args.write}: command reference regenerated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
