"""docs/protocol.md stays in step with the code: body tables, reasons, limits, test vectors."""

import re
from pathlib import Path

import pytest

from protocol import (
    BODY_TYPES,
    DEFAULT_LIMITS,
    DISCOVERY_TYPES,
    DOMAIN_TAG,
    HEADER_MAX_BYTES,
    LEARNING_TYPES,
    QUERY_TYPES,
    RELAY_TYPES,
    MessageType,
    Reason,
)

from . import vectors

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

SPEC = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()


def body_table(kind: MessageType) -> str:
    rows = [f"| `{f.name}` | {f.codec.describe().replace('|', chr(92) + '|')} |" for f in BODY_TYPES[kind].FIELDS]
    return "\n".join(["| field | wire type and rule |", "|---|---|", *rows])


def test_every_body_table_matches_the_schema():
    for kind in MessageType:
        assert f"### {kind.value}\n\n{body_table(kind)}\n" in SPEC, (
            f"docs/protocol.md table for {kind.value} is out of date"
        )


def test_every_reason_and_type_is_documented():
    for reason in Reason:
        assert f"| `{reason.value}` |" in SPEC
    assert " ".join(kind.value for kind in MessageType) in SPEC
    families = (
        ("Discovery", DISCOVERY_TYPES),
        ("Queries", QUERY_TYPES),
        ("Relaying", RELAY_TYPES),
        ("Learning", LEARNING_TYPES),
    )
    for family, kinds in families:
        listed = " ".join(kind.value for kind in MessageType if kind in kinds)
        assert f"**{family}**: `{listed}" in SPEC.replace("\n", " "), family


def test_constants_match():
    assert " ".join(f"{b:02X}" for b in DOMAIN_TAG) in SPEC
    assert f"first {HEADER_MAX_BYTES} bytes" in SPEC
    assert DEFAULT_LIMITS.max_frame_bytes == 64 * 2**20 and "| whole frame (also `ZMQ_MAXMSGSIZE`) | 64 MiB |" in SPEC
    for kind, text in (
        (MessageType.HELLO, "4 KiB"),
        (MessageType.PEERS, "320 KiB"),
        (MessageType.PROTOTYPES, "4 MiB"),
        (MessageType.MODEL, "64 MiB"),
    ):
        assert f"{text} |" in SPEC and DEFAULT_LIMITS.max_frame_bytes_for(kind) == int(text.split()[0]) * (
            1024 if "KiB" in text else 2**20
        )


def _hex_blocks() -> list[str]:
    """The test-vector code blocks, annotations (after two or more spaces) removed."""
    blocks = re.findall(r"```\n(.*?)```", SPEC.split("## 12. Test vectors")[1], flags=re.S)
    return [
        "".join(re.split(r"\s{2,}", line.strip())[0].replace(" ", "") for line in block.splitlines())
        for block in blocks
    ]


def test_documented_vectors_are_the_tested_ones():
    assert _hex_blocks() == [vectors.PING_FRAME, vectors.PROTOTYPES_FRAME, vectors.SEALED_PING]
    assert vectors.PUBLIC_KEY in SPEC and vectors.NODE_ID in SPEC


def test_protocol_python_example_runs(capsys):
    """The example decodes and admits its own frame (it prints only a refusal), and the same
    code refuses the frame once a byte of it is changed."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    names: dict = {}
    exec(compile(example, "docs/protocol.md", "exec"), names)
    assert capsys.readouterr().out == "", "the protocol page's example refused its own frame"
    envelope, me = names["envelope"], names["me"]
    assert envelope.sender == me.public_key and envelope.type.name == "PROTOTYPES" and envelope.round == 0
    assert envelope.body.classes == (0, 1) and envelope.body.counts == (25, 25)
    tampered = example.replace(
        "envelope = decoder.decode(frame)", "envelope = decoder.decode(frame[:-1] + bytes([frame[-1] ^ 1]))"
    )
    assert tampered != example
    exec(compile(tampered, "docs/protocol.md", "exec"), {})
    assert capsys.readouterr().out.startswith("refused: "), "a changed byte must be refused"


def test_documented_curve_vectors_are_the_tested_ones():
    from .helpers import VECTORS

    section = SPEC.split("## Transport encryption and session binding")[1]
    for column in zip(*VECTORS, strict=True):  # one row per kind of key, one column per node
        assert "| " + " | ".join(f"`{key}`" for key in column) + " |" in section


def test_readme_and_docs_link_only_files_in_the_repository():
    """Every relative link resolves to a file of this repository; none leads outside it."""
    root = Path(__file__).resolve().parent.parent
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        prose = re.sub(r"```.*?```|`[^`\n]*`", "", page.read_text(), flags=re.S)  # code is not a link
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor in the same page
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(root), f"{page.name} links {target}, outside the repository"
            assert path.exists(), f"{page.name} links {target}, which does not exist"
