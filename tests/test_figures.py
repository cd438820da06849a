"""Figures quoted in more than one place say the same thing (issue #31).

FIGURES is a registry: each figure has one source of truth (a line of BENCHMARKS.md, of a result
file under tools/bench/results/, or of the code that sets the value) and the places that quote
it. A place is a file and a regex whose named groups are the figure's values; a quote may name
only some of the source's groups. The test fails with the file and line of every quote whose
values differ from the source's, of every quote no longer found (reworded: update the registry)
and of every source that is not found exactly once. Pure text, no imports of the code.

Add a figure here when you quote a number a second time (README, the Makefile, docs/, a help
text); a figure stated once needs no entry.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

ROOT = Path(__file__).resolve().parent.parent
SIGNED = r"[+−-]?[\d.]+"  # a figure as BENCHMARKS.md writes it: +5.0, −1.2, 0.073


@dataclass(frozen=True)
class Place:
    path: str
    pattern: str  # compiled with re.MULTILINE; (?s) inside when a figure spans lines

    def matches(self, root: Path) -> list[tuple[int, dict[str, str]]]:
        """(line number, named groups) of every match in the file; [] if the file is missing."""
        file = root / self.path
        if not file.is_file():
            return []
        text = file.read_text()
        return [
            (text.count("\n", 0, match.start()) + 1, match.groupdict())
            for match in re.finditer(self.pattern, text, re.MULTILINE)
        ]


@dataclass(frozen=True)
class Figure:
    name: str
    source: Place
    quotes: tuple[Place, ...]
    # How a quote writes the source's values (rounded, as a percentage, ...); identity by default.
    quoted_as: Callable[[dict[str, str]], dict[str, str]] = field(default=lambda values: values)


def normalised(value: str) -> str:
    """The same number however it is typeset: a leading plus, a typographic minus, digit groups."""
    value = value.strip().replace("−", "-").replace("\u202f", "").replace("\u2009", "").replace(",", "")
    value = value.replace(" ", "")
    return value[1:] if value.startswith("+") else value


def half_up(number: float, digits: int = 0) -> str:
    """As a writer rounds (42.5 to 43), not as round() does (to 42)."""
    return str(Decimal(repr(number)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def rounded(*names: str, digits: int = 0) -> Callable[[dict[str, str]], dict[str, str]]:
    def convert(values: dict[str, str]) -> dict[str, str]:
        return {**values, **{name: half_up(abs(float(normalised(values[name]))), digits) for name in names}}

    return convert


def as_percent(*names: str) -> Callable[[dict[str, str]], dict[str, str]]:
    def convert(values: dict[str, str]) -> dict[str, str]:
        return {**values, **{name: half_up(float(values[name]) * 100) for name in names}}

    return convert


def scale_bring_up(values: dict[str, str]) -> dict[str, str]:
    """The 100-daemon row as its prose quotes it: seconds to all up, to every view at target,
    between the two, the largest RSS, all rounded."""
    up, target = float(values["up_s"]), float(values["target_s"])
    return {
        **values,
        "up_s": half_up(up),
        "target_s": half_up(target),
        "converge_s": half_up(target - up),
        "rss_max": half_up(float(values["rss_max"])),
    }


def settling_medians(values: dict[str, str]) -> dict[str, str]:
    """The simulated joins' table as docs/daemon.md sums it up: the range of the median seconds
    to every view at target, over the `waves` rows, for peers that settle (300, 60, 30 s) and for
    no displacement; the loaded row's median for 300 and the range for 60 and 30. A cell "same"
    repeats the 300 s column."""

    def median(column: str) -> float:
        cell = values[column].strip()
        cell = values[column.rsplit("_", 1)[0] + "_300"].strip() if cell == "same" else cell
        return statistics.median(float(x) for x in cell.split("/"))

    def span(columns: list[str]) -> tuple[str, str]:
        medians = [median(column) for column in columns]
        return half_up(min(medians)), half_up(max(medians))

    settle = span([f"{row}_{after}" for row in ("w05", "w15") for after in (300, 60, 30)])
    none = span(["w05_0", "w15_0"])
    loaded = span(["loaded_60", "loaded_30"])
    return {
        "settle_low": settle[0],
        "settle_high": settle[1],
        "none_low": none[0],
        "none_high": none[1],
        "loaded_300": half_up(median("loaded_300")),
        "loaded_low": loaded[0],
        "loaded_high": loaded[1],
    }


WORDS = {"one": "1", "two": "2", "three": "3", "four": "4", "five": "5"}


def in_digits(values: dict[str, str]) -> dict[str, str]:
    return {name: WORDS.get(value, value) for name, value in values.items()}


B, README, MAKEFILE, CLI = "BENCHMARKS.md", "README.md", "Makefile", "docs/cli.md"
HISTORY = "docs/benchmarks-history.md"  # figures of earlier commits (issue #31)
DEMO_SECTION = r"## `make demo`: the default algorithm beside Local \(issues #28, #44\)"

FIGURES: tuple[Figure, ...] = (
    Figure(
        "make demo's wall time",
        Place(B, r"Wall time (?P<minutes>\d+) min \(the testnet (?P<testnet_s>\d+) s, Local (?P<local_s>\d+) s\)"),
        (
            Place(README, r"MNIST digits \(~(?P<minutes>\d+) min on 2 cores\)"),
            Place(
                MAKEFILE,
                r"\(the testnet (?P<testnet_s>\d+) s\), then Local simulated\n# on the same nodes "
                r"\((?P<local_s>\d+) s; (?P<minutes>\d+) minutes in all on 2 cores",
            ),
            Place("tools/demo.py", r"Local by default \((?P<local_s>\d+) s in BENCHMARKS\.md's `make demo`\)"),
        ),
    ),
    Figure(
        "make demo's gain over Local",
        Place(B, rf"\*\*(?P<gain>{SIGNED}) points \[(?P<low>{SIGNED}), (?P<high>{SIGNED})\]\*\*"),
        (
            Place(
                README, rf"the default, (?P<gain>{SIGNED}) points over Local \[(?P<low>{SIGNED}), (?P<high>{SIGNED})\]"
            ),
        ),
    ),
    Figure(
        "make demo's setting",
        Place(
            "tools/demo.py",
            r'(?s)"--rounds", type=int, default=(?P<rounds>\d+)\).*?'
            r"samples_per_class=(?P<train>\d+),\s*test_per_class=(?P<test>\d+)\b",
        ),
        (
            Place(
                README,
                r"(?s)holding (?P<train>\d+) real MNIST digits per class.{0,60}?and (?P<test>\d+) to test"
                r".{0,120}?For (?P<rounds>\d+)\s+rounds",
            ),
            Place(
                B,
                rf"(?s){DEMO_SECTION}.{{0,300}}?(?P<train>\d+) training and\s+(?P<test>\d+)\s+test images per class,"
                r" (?P<rounds>\d+) rounds",
            ),
        ),
    ),
    Figure(
        "make test's time",
        Place(
            B,
            r"(?s)CI of\s+(?P<date>\d{4}-\d\d-\d\d) on the 2-core machine:.{0,300}?"
            r"\*\*(?P<minutes>\d+) min (?P<seconds>\d+) s\*\* of test time.{0,60}?"
            r"about (?P<venv>\d+)\s+minutes? to build `\.venv`",
        ),
        (
            Place(
                README,
                r"make test +# the whole test suite \((?P<minutes>\d+) min on 2 cores in CI on (?P<date>[\d-]+), "
                r"plus ~(?P<venv>\d+) min to build \.venv",
            ),
        ),
        # the README rounds to whole minutes
        quoted_as=lambda v: {**v, "minutes": str(round(int(v["minutes"]) + int(v["seconds"]) / 60))},
    ),
    Figure(
        "MAPL+ over Local, three seeds (seeds 0-2, not re-measured)",
        Place(
            HISTORY,
            rf"(?s)^\| 10 \| 1 \| mapl\+ \|[^|\n]*\|[^|\n]*\| (?P<s1>{SIGNED}) \|.*?"
            rf"^\| 10 \| 2 \| mapl\+ \|[^|\n]*\|[^|\n]*\| (?P<s2>{SIGNED}) \|",
        ),
        (Place(HISTORY, rf"over three\s+seeds at 10 per class (?P<s1>{SIGNED}) and (?P<s2>{SIGNED}),"),),
    ),
    Figure(
        "MAPL-Dual over Local, evaluation seeds 3-5, 10 per class",
        Place(
            B,
            r"(?s)"
            + r".*?".join(
                rf"^\| 10 \| {scenario} \| \*\*mapl-dual\*\* \|[^|\n]*\|[^|\n]*\| (?P<{name}>{SIGNED}) \["
                for scenario, name in ((1, "s1"), (2, "s2"))
            ),
        ),
        (
            Place(README, r"MAPL-Dual beats Local by (?P<s1>[\d.]+) and (?P<s2>[\d.]+) points \(seeds 3–5"),
            Place(B, rf"met\.\*\* (?P<s1>{SIGNED}) \(Scenario 1\) and\s+(?P<s2>{SIGNED}) \(Scenario 2\) points at 10"),
        ),
    ),
    Figure(
        "MAPL-Dual over Local at 5 per class (seeds 0-2, not re-measured)",
        Place(
            HISTORY,
            r"(?s)"
            + r".*?".join(
                rf"^\| 5 \| {scenario} \| \*\*mapl-dual\*\* \|[^\n]*\*\*(?P<{name}>{SIGNED})\*\*"
                for scenario, name in ((1, "s1"), (2, "s2"))
            ),
        ),
        (Place(B, rf"5 per class \((?P<s1>{SIGNED}) and (?P<s2>{SIGNED}) points on seeds 0–2"),),
    ),
    Figure(
        "SFMTL against Local on its backbone, three seeds (seeds 0-2, not re-measured)",
        Place(
            HISTORY,
            r"(?s)"
            + r".*?".join(
                rf"^\| {spc} \| {scenario} \| sfmtl \|[^|\n]*\|[^|\n]*\| (?P<{name}>{SIGNED}) \|"
                for spc, scenario, name in ((10, 1, "s1_10"), (10, 2, "s2_10"), (5, 1, "s1_5"), (5, 2, "s2_5"))
            ),
        ),
        (
            Place(
                "docs/learning.md",
                rf"per class \((?P<s1_10>{SIGNED}) and (?P<s2_10>{SIGNED}) points\) and behind it at 5 "
                rf"\((?P<s1_5>{SIGNED}) and (?P<s2_5>{SIGNED})\)",
            ),
            Place(
                HISTORY,
                rf"(?s)Local on the same backbone \((?P<s1_10>{SIGNED}) and (?P<s2_10>{SIGNED}) points\)"
                rf".{{0,200}}?falls behind \((?P<s1_5>{SIGNED}) and (?P<s2_5>{SIGNED})\)",
            ),
        ),
    ),
    Figure(
        "100 daemons with a bounded view (one run)",
        Place(
            B,
            r"^\| 100 \| \d+ / \d+ \| (?P<up_s>[\d.]+) \| (?P<target_s>[\d.]+) \| yes, (?P<diameter>\d+) \|"
            r"[^\n]*\| [\d.]+ / (?P<rss_max>[\d.]+); [\d.]+ \|$",
        ),
        (
            Place(MAKEFILE, r"the 100 daemons' views were all at target (?P<target_s>\d+) s after the start"),
            Place(B, r"the 100 daemons take (?P<up_s>\d+) s to all answer"),
            Place(B, r"(?s)to start, 8 at a time,.{0,60}?views are all at target (?P<converge_s>\d+) s later"),
        ),
        quoted_as=scale_bring_up,
    ),
    Figure(
        "simulated joins: seconds to every view at target by how long peers stay displaceable",
        Place(
            HISTORY,
            r"(?s)"
            + r".*?".join(
                rf"^\| {re.escape(row)} \| " + r" \| ".join(f"(?P<{key}_{after}>[^|]+)" for after in (300, 60, 30, 0))
                for row, key in (("waves 0.5 s", "w05"), ("waves 1.5 s", "w15"), ("waves 1.5 s, loaded", "loaded"))
            ),
        ),
        (
            Place(
                "docs/daemon.md",
                r"(?s)a median (?P<settle_low>\d+)–(?P<settle_high>\d+) s after the last start.{0,80}?against "
                r"(?P<none_low>\d+)–(?P<none_high>\d+) s with no displacement at all; with slower links, "
                r"(?P<loaded_300>\d+) s\s+with 300, (?P<loaded_low>\d+)–(?P<loaded_high>\d+) s with 60 or 30",
            ),
        ),
        quoted_as=settling_medians,
    ),
    Figure(
        "the oldest peer displaced in the simulated joins",
        Place(HISTORY, r"no simulated peer was displaced older than (?P<s>\d+) s"),
        (
            Place("docs/daemon.md", r"up to (?P<s>\d+) s with 100 simulated nodes"),
            Place(HISTORY, r"a peer admitted 4 s to (?P<s>\d+) s before"),
        ),
    ),
    Figure(
        "100 daemons with no displacement",
        Place(B, r"was not at target after (?P<s>\d+) s \(min (?P<least>\d+) peers of (?P<view>\d+)"),
        (Place("docs/security.md", r"min (?P<least>\d+) of (?P<view>\d+) after (?P<s>\d+) s"),),
    ),
    Figure(
        "memory left by 1,000 closed connections",
        Place(
            "docs/security.md",
            r"closed, leave the node \+(?P<node>[\d.]+) MB and that process \+(?P<process>[\d.]+) MB",
        ),
        (
            Place(
                "docs/security.md",
                r"closed, leave that process (?P<process>[\d.]+) MB larger \(the node: \+(?P<node>[\d.]+) MB\)",
            ),
        ),
    ),
    Figure(
        "the bounded view for many nodes, and liveness when crowded",
        Place(
            "testnet/launch/discovery.py",
            r'"active_view": (?P<active>\d+),\s*"max_peers": (?P<max>\d+),\s*'
            r'"ping_interval_s": (?P<ping>\d+)\.0,\s*"peer_timeout_s": (?P<timeout>\d+)\.0,',
        ),
        (
            Place(CLI, r"\(view (?P<active>\d+), at most (?P<max>\d+) peers, liveness every (?P<ping>\d+) s"),
            Place(CLI, r"e\.g\. (?P<active>\d+) and (?P<max>\d+) for\s+many nodes"),
            Place("p2pnode_cli/testnet.py", r"e\.g\. (?P<active>\d+) and (?P<max>\d+) \(docs/daemon\.md\)"),
            Place("p2pnode/discovery/settings.py", r"e\.g\. (?P<active>\d+) and (?P<max>\d+): docs/daemon\.md"),
            Place("docs/config.md", r"e\.g\. (?P<active>\d+) and (?P<max>\d+): docs/daemon\.md"),
            Place("docs/daemon.md", r"e\.g\. `active_view = (?P<active>\d+)`, `max_peers = (?P<max>\d+)`"),
            Place(
                B,
                r"`active_view = (?P<active>\d+)`, `max_peers = (?P<max>\d+)` \(docs/daemon\.md, \"Bounded views\"\), "
                r"liveness every\s+(?P<ping>\d+) s \(timeout (?P<timeout>\d+) s\)",
            ),
            Place(
                "tools/bench/scale.py",
                r'"--active-view", type=int, default=(?P<active>\d+)\)\s*'
                r'parser\.add_argument\("--max-peers", type=int, default=(?P<max>\d+)\)',
            ),
        ),
    ),
    Figure(
        "an ingress process forked again after an abort",
        Place(B, r"back (?P<ms>\d+) ms after an abort"),
        (
            Place("docs/security.md", r"within ~(?P<ms>\d+) ms"),
            Place("docs/security.md", r"each abort costs a fork,\s+~(?P<ms>\d+) ms"),
            Place("docs/daemon.md", r"within about\s+(?P<ms>\d+) ms"),
        ),
    ),
    Figure(
        "the public socket's reachability under repeated aborts, bans off",
        Place(
            B, r"\*\*Reachability\*\* under a stranger repeating the attack with bans off: (?P<low>\d+)–(?P<high>\d+) %"
        ),
        (Place("docs/security.md", r"reachable (?P<low>\d+)–(?P<high>\d+) % of the time"),),
    ),
    Figure(
        "the largest frame on the public socket",
        Place(
            "p2pnode/wire/settings.py",
            r"max_public_frame_bytes: int = option\(\s*Integer\([^)]*\),\s*(?P<kib>\d+) << 10,",
        ),
        (
            Place("docs/daemon.md", r"`\[limits\]\.max_public_frame_bytes` \((?P<kib>\d+) KiB\)"),
            Place("docs/security.md", r"`max_public_frame_bytes` \((?P<kib>\d+) KiB\)"),
            Place("docs/deploy.md", r"frames larger than (?P<kib>\d+) KiB"),
            Place("docs/protocol.md", r"a reference daemon: (?P<kib>\d+) KiB, `\[limits\]\.max_public_frame_bytes`"),
        ),
    ),
    Figure(
        "Oracle's wall time in the learning benchmark, Scenario 1",
        Place(HISTORY, r"^\| 1 \| oracle \| 0 \|[^\n]*\| 0\.0 \| (?P<s>\d+) \|$"),
        (
            Place(HISTORY, r"per P2P run,\s+(?P<s>\d+)–\d+ s for Oracle"),
            Place("tools/demo.py", r"it took\n\s*# (?P<s>\d+) s more in the learning benchmark's Scenario 1"),
        ),
    ),
    Figure(
        "the learning benchmark's duration",
        Place(B, r"The 15 runs took (?P<minutes>\d+) minutes"),
        (Place(MAKEFILE, r"15 runs took (?P<minutes>\d+) minutes"),),
    ),
    Figure(
        "the SCooL benchmark's duration",
        Place(B, r"Its 24 runs took (?P<minutes>\d+) minutes of run time"),
        (Place(MAKEFILE, r"The SCooL benchmark of BENCHMARKS\.md \(24 runs, (?P<minutes>\d+) minutes of run time"),),
    ),
)


def disagreements(figure: Figure, root: Path = ROOT) -> list[str]:
    """One line per problem, each naming the file and line it is at."""
    sources = figure.source.matches(root)
    if len(sources) != 1:
        return [f"{figure.source.path}: the source of {figure.name!r} matches {len(sources)} times, not once"]
    source_line, source_values = sources[0]
    expected = {name: normalised(value) for name, value in figure.quoted_as(source_values).items()}
    problems = []
    for quote in figure.quotes:
        found = quote.matches(root)
        if not found:
            problems.append(f"{quote.path}: no longer quotes {figure.name!r} as the registry expects: {quote.pattern}")
        for line, values in found:
            for name, value in values.items():
                if normalised(value) != expected[name]:
                    problems.append(
                        f"{quote.path}:{line}: {figure.name!r} quotes {name} = {value}, but its source "
                        f"{figure.source.path}:{source_line} gives {expected[name]}"
                    )
    return problems


def test_every_figure_quoted_twice_agrees_with_its_source():
    problems = [problem for figure in FIGURES for problem in disagreements(figure)]
    assert not problems, "\n".join(problems)


def test_every_quote_names_only_values_its_source_has():
    for figure in FIGURES:
        source_names = set(re.compile(figure.source.pattern).groupindex)
        assert source_names, figure.name
        for quote in figure.quotes:
            names = set(re.compile(quote.pattern).groupindex)
            assert names and names <= set(figure.quoted_as(dict.fromkeys(source_names, "1"))), (figure.name, quote)


def test_a_quote_that_disagrees_is_named_with_its_file_and_line(tmp_path: Path):
    (tmp_path / "BENCH.md").write_text("# x\n\nWall time 7 min, gain +5.0 points.\n")
    (tmp_path / "README.md").write_text("intro\n\nthe demo (~7 min)\n\nlater the demo (~3 min)\n")
    figure = Figure(
        "demo",
        Place("BENCH.md", r"Wall time (?P<minutes>\d+) min"),
        (Place("README.md", r"\(~(?P<minutes>\d+) min\)"),),
    )
    assert disagreements(figure, tmp_path) == [
        "README.md:5: 'demo' quotes minutes = 3, but its source BENCH.md:3 gives 7"
    ]
    reworded = Figure("demo", figure.source, (Place("README.md", r"about (?P<minutes>\d+) minutes"),))
    assert disagreements(reworded, tmp_path)[0].startswith("README.md: no longer quotes 'demo'")
    twice = Figure("gain", Place("BENCH.md", r"(?P<n>\d+)"), ())
    assert "matches 3 times, not once" in disagreements(twice, tmp_path)[0]


def test_numbers_compare_however_they_are_typeset():
    assert normalised("+5.0") == normalised("5.0") and normalised("−1.2") == "-1.2"
    assert normalised("7 469") == normalised("7,469") == "7469"
    assert rounded("delta", digits=1)({"delta": "−0.18"}) == {"delta": "0.2"}
    assert as_percent("a")({"a": "0.106"}) == {"a": "11"}


# Numbers in README.md that are no measured figure, each with why (issue #47: every figure the
# README quotes is registered above, so a test fails when it goes stale).
README_NOT_FIGURES = {
    r"#\d+": "an issue number",
    r"Python ≥ 3\.11": "the Python it needs",
    r"127\.0\.0\.1": "the loopback address",
    r"Ed25519": "the key type",
    r"on 2 cores": "the machine a time was measured on",
    r"seeds 3–5": "which seeds, named beside the figure",
    r"on seed 19": "which seed, named beside the figure",
    r"tools\.bench\.scale --nodes 10 30 100": "a command",
}


def unregistered_readme_numbers(root: Path = ROOT) -> list[str]:
    """The numbers README.md states outside code, links and README_NOT_FIGURES that no
    registered quote of README.md covers."""
    text = (root / README).read_text()
    covered = [False] * len(text)

    def cover(pattern: str, flags: int = re.MULTILINE) -> None:
        for match in re.finditer(pattern, text, flags):
            covered[match.start() : match.end()] = [True] * (match.end() - match.start())

    cover(r"^```.*?^```", re.MULTILINE | re.DOTALL)  # code blocks
    cover(r"`[^`\n]+`")  # inline code
    cover(r"\]\([^)]*\)")  # link targets
    for pattern in README_NOT_FIGURES:
        cover(pattern)
    for figure in FIGURES:
        for place in figure.quotes:
            if place.path == README:
                cover(place.pattern)
    return [
        f"README.md:{text.count(chr(10), 0, match.start()) + 1}: {match.group()!r}"
        for match in re.finditer(r"(?<![\w.])[+−-]?\d+(?:[.,]\d+)*", text)
        if not all(covered[match.start() : match.end()])
    ]


def test_every_figure_the_readme_quotes_is_registered():
    """A number in the README is a registered quote of a source (so it cannot go stale unseen),
    or named in README_NOT_FIGURES with why it is no figure."""
    assert unregistered_readme_numbers() == [], "register each in FIGURES, or say in README_NOT_FIGURES why it is none"


def test_an_unregistered_readme_figure_is_named(tmp_path: Path):
    (tmp_path / README).write_text("Wire protocol (#12) on 2 cores: MAPL beats Local by 4.2 points, `--nodes 10`.\n")
    assert unregistered_readme_numbers(tmp_path) == ["README.md:1: '4.2'"]
