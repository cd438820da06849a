"""Every command BENCHMARKS.md shows still runs (issue #31: each figure reproducible from the
command beside it).

The commands are read from BENCHMARKS.md itself: its code spans and shell blocks that start with
`p2pnode `, `python -m `, `make ` or `PYTHONPATH=...`, and the commands of each Makefile target
it names. Each must be listed here: in RUN, with the quick variant run in its stead (the same
entry point and code path on tiny sizes; one variant may stand for several commands and runs
once), or in NOT_RUN, with why not. A command added to BENCHMARKS.md and listed in neither fails
`test_every_benchmarks_command_is_accounted_for`, and so does an entry BENCHMARKS.md no longer
shows. Before anything runs, each command's module and Makefile target must exist and every
`p2pnode` command must parse, its placeholders (A, S, DIR, [...]) filled in.

The quick variants run in this process (`p2pnode_cli.main`, the tool's `main(argv)`), in an
empty directory that receives what they write (`--save` included); each has its own timeout,
and a hang fails the variant it is the test id of. The heavy ones (`heavy=True`) run only with
P2PNODE_BENCH_COMMANDS=all. Measured 2026-11-26 under `nice -n 10` on the 2-core machine while
other jobs kept its load average at 4–5: this module 96 s (60 s of CPU, so about a minute on
an idle machine); the heavy variants 125 s more (120 s of CPU).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from p2pnode_cli import build_parser, main
from testnet.launch.nat import missing as nat_missing

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = (ROOT / "BENCHMARKS.md").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()
STARTS = ("p2pnode ", "python -m ", "make ", "PYTHONPATH=")


def _command(text: str) -> str:
    """A command as written, on one line, without the `.venv/bin/` or `$(BIN)/` put first."""
    text = " ".join(text.split())
    return re.sub(r"^(\.venv/bin/|\$\(BIN\)/)", "", text)


def shown_commands() -> set[str]:
    """Code spans (a span may wrap over lines) and lines of shell blocks that are commands; not
    the provenance line under a drawn table (what was run there, with its own paths: the text
    beside the table shows the command to run)."""
    text = re.sub(r"^```(?:sh|bash|shell|console)?\n(.*?)^```", "", BENCHMARKS, flags=re.M | re.S)
    text = re.sub(r"^<sub>From `tools/bench/results/.*$", "", text, flags=re.M)
    spans = re.findall(r"(?<!`)`([^`]+)`(?!`)", text)
    blocks = re.findall(r"^```(?:sh|bash|shell|console)?\n(.*?)^```", BENCHMARKS, flags=re.M | re.S)
    lines = [line.removeprefix("$ ") for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return {_command(code) for code in spans + lines if _command(code).startswith(STARTS)}


def makefile_recipe(target: str) -> list[str] | None:
    """The commands of a Makefile target (None: no such target)."""
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)*)", MAKEFILE, flags=re.M)
    if match is None:
        return None
    return [_command(line.strip().lstrip("@")) for line in match[1].splitlines()]


def make_targets(commands: set[str]) -> set[str]:
    return {command.split()[1] for command in commands if command.startswith("make ")}


def every_command() -> set[str]:
    """What BENCHMARKS.md shows, and what the Makefile targets it names run."""
    shown = shown_commands()
    recipes = {line for target in make_targets(shown) for line in makefile_recipe(target) or []}
    return shown | recipes


@dataclass(frozen=True)
class Quick:
    """A quick variant: a command line (DIR: a fresh folder), the seconds it may take, and
    whether it is one of the heavy ones (see ALL)."""

    command: str
    limit_s: int = 60
    heavy: bool = False
    needs: Callable[[], str | None] | None = None  # why it cannot run here (None: it can)


# The heavy variants start daemons or worker processes that each import torch: 10–35 s apiece
# on the 2-core machine, about two minutes together, more than this module's share of the suite.
# They run where P2PNODE_BENCH_COMMANDS=all (before a benchmark is published, say); otherwise they
# are skipped, each with the commands it stands for named.
ALL = os.environ.get("P2PNODE_BENCH_COMMANDS") == "all"


PROTOCOL = Quick("p2pnode bench protocol --quick --sizes 1024 --runs 2 --save protocol", 30)
TRANSPORT = Quick("p2pnode bench transport --trials 1 --seconds 0.01 --sizes 1024", 30)
ADAPTERS = Quick("p2pnode bench adapters --quick --sizes 1024", 30)
# With --exit-on-mesh the testnet stops at the full mesh instead of at --duration (and fails if
# it is not reached): the same run, ended early.
DISCOVERY = Quick("p2pnode testnet --nodes 3 --algorithm none --duration 30 --exit-on-mesh --out DIR")
DISCOVERY_RUNS = Quick("python -m tools.bench.discovery --nodes 3 --duration 30 --runs 1 --exit-on-mesh --out DIR")
SIMULATE = Quick(
    "p2pnode simulate --algorithm mapl --dataset mnist5k --scenario 1 --nodes 2 --rounds 2 --samples-per-class 1 "
    "--test-per-class 1 --set warmup_rounds=1 --seed 1 --engine inline --out DIR"
)
# --check with thresholds at 0: two rounds learn nothing, and every node must still finish them.
LEARNING_TESTNET = Quick(
    "p2pnode testnet --algorithm mapl --dataset mnist5k --scenario 1 --nodes 2 --rounds 2 --samples-per-class 1 "
    "--test-per-class 1 --set warmup_rounds=1 --check --check-accuracy 0 --check-mass 0 --out DIR",
    120,
    heavy=True,
)
DEMO = Quick("python -m tools.demo --nodes 2 --rounds 2 --quick --out DIR", 120, heavy=True)
LEARNING = Quick(
    "python -m tools.bench.learning --rounds 1 --scenarios 1 --seeds 1 --methods local --workers 1 --out DIR"
)
HETEROGENEOUS = Quick(
    "python -m tools.bench.heterogeneous --methods local --scenarios 1 --samples 1 --seeds 3 --rounds 1 "
    "--test-per-class 1 --workers 1 --out DIR"
)
FLEETS = Quick(
    "python -m tools.bench.fleets --nodes 2 --backbones one --datasets digits --methods local mapl-auto oracle "
    "--seeds 3 --rounds 2 --samples 1 --workers 1 --out DIR"
)
FLEETS_FOLDER = Quick(
    "python -m tools.bench.fleets --nodes 2 --backbones one --datasets folder --methods local --seeds 3 "
    "--rounds 1 --workers 1 --out DIR"
)
PRETRAINED = Quick(
    "python -m tools.bench.pretrained --seeds 3 --rounds 1 --nodes 2 --per-class 5 --epochs 1 --pretrain-images 64 "
    "--workers 1 --out DIR",
    heavy=True,
)
STRAGGLERS = Quick(
    "python -m tools.bench.stragglers --rounds 1 --nodes 2 --samples 1 --test 1 --seeds 1 --workers 1 "
    "--schedule async --out DIR",
    heavy=True,
)
# Four testnets of two daemons and the four simulations beside them, two rounds each.
STRAGGLERS_TESTNET = Quick(
    "python -m tools.bench.stragglers_testnet --rounds 2 --nodes 2 --samples 1 --test 1 --workers 1 "
    "--set warmup_rounds=1 --out DIR",
    180,
    heavy=True,
)
# Two daemons, two rounds: the churn may find every daemon finished (then it stops nobody); --check at 0.
CHURN = Quick(
    "python -m tools.bench.churn --nodes 2 --rounds 2 --samples 1 --test 1 --churn every=1,down=1,count=1 "
    "--set warmup_rounds=1 --check-accuracy 0 --check-mass 0 --out DIR",
    120,
    heavy=True,
)
SCOOL = Quick("python -m tools.bench.scool --rounds 1 --nodes 4 --seeds 3 --methods scool-local --workers 1 --out DIR")
POISONING = Quick(
    "python -m tools.bench.poisoning --methods mapl --attacks random --rounds 1 --seeds 1 --workers 2 --out DIR",
    heavy=True,
)
# --check with thresholds at 0, as LEARNING_TESTNET: one round of two daemons and the simulator beside it.
PARITY = Quick(
    "python -m tools.bench.parity --preset scool --seeds 3 --methods scool-dirac --nodes 2 --rounds 1 "
    "--samples-per-class 1 --test-per-class 1 --check-accuracy 0 --check-mass 0 --workers 1 --out DIR",
    120,
    heavy=True,
)
PARITY_LEARNING = Quick(
    "python -m tools.bench.parity --preset learning --seeds 1 --methods mapl-nocgl --nodes 2 --rounds 1 "
    "--samples-per-class 1 --test-per-class 1 --check-accuracy 0 --check-mass 0 --workers 1 --out DIR",
    120,
    heavy=True,
)
PARITY_DUAL = Quick(
    "python -m tools.bench.parity --preset dual --seeds 3 --nodes 2 --rounds 1 --samples-per-class 1 "
    "--test-per-class 1 --check-accuracy 0 --check-mass 0 --workers 1 --set warmup_rounds=0 --out DIR",
    120,
    heavy=True,
)
MEMORY = Quick("python -m tools.bench.memory --algorithms local --nodes 2 --rounds 1 --out DIR", 120, heavy=True)
STAGES = Quick("python -m tools.bench.memory --stages --algorithm local --rounds 1")
STARTUP = Quick("python -m tools.bench.startup --runs 1 --out DIR", 120, heavy=True)
# Round 0 warms up and round 1 is measured: the same nodes, two rounds.
CLOCK_COSTS = Quick("python -m tools.bench.clock_costs --rounds 2", 120)
SCALE = Quick("python -m tools.bench.scale --nodes 3 --duration 30 --hold 0 --out DIR")
OVERLAY = Quick("python -m tests.overlay_bench --nodes 10 --seeds 0 --joins waves --limit 30")
SPEEDUP = Quick(
    "python -m tools.bench.simulate speedup --rounds 1 --skip-before --seed 1 --samples-per-class 1 --test-per-class 1",
    120,
    heavy=True,
)
SCALING = Quick(
    "python -m tools.bench.simulate scaling --nodes 3 --rounds 1 --workers 1 --samples-per-class 1 --test-per-class 1"
)
LARGE = Quick(
    "python -m tools.bench.simulate large --nodes 3 --rounds 1 --engines processes --samples-per-class 1 "
    "--test-per-class 1"
)
# The seconds measured idle and attacked; each tool waits its own fixed seconds around them.
ATTACKS = Quick("python -m tools.bench.attacks --seconds 0.2 --attacks 'garbage, full rate, ≤ 64 KiB'")
HOSTILE = Quick("python -m tools.bench.hostile --seconds 0.5 --quick")
HOSTILE_LEARNING = Quick("python -m tools.bench.hostile --seconds 1 --quick --learning", 120, heavy=True)
HOSTILE_ADMITTED = Quick("python -m tools.bench.hostile --admitted-peer --quick", 120, heavy=True)
# One run of each kind: two colluders with the barrage (row 0) and a small-norm poisoner (row 3).
COLLUDERS = Quick("python -m tools.bench.colluders --seeds 0 --runs 0 3", 180, heavy=True)
CAMPAIGN = Quick("python -m tools.bench.campaign --seconds 3 --sources 8", 180, heavy=True)
NAT = Quick("python -m tools.bench.nat --seconds 2 --out DIR", 120, heavy=True, needs=nat_missing)
NAT_LEARNING = Quick("python -m tools.bench.nat_learning --rounds 2 --out DIR", 300, heavy=True, needs=nat_missing)
NAT_CLIENT = Quick("python -m tools.bench.nat --seconds 2 --client-mode --out DIR", 120, heavy=True, needs=nat_missing)
NAT_RELAY = Quick(
    "python -m tools.bench.nat --seconds 2 --client-mode --relay --flush --out DIR", 180, heavy=True, needs=nat_missing
)
NAT_FLEET = Quick(
    "python -m tools.bench.nat_fleet --rounds 3 --flush-after 2 --sybil-after 1 --sybil-keys 20 --sybil-seconds 3 "
    "--out DIR",
    300,
    heavy=True,
    needs=nat_missing,
)
# On the CPU alone: the CUDA runs need a GPU, and the CPU runs take the same path.
GPU = Quick("python -m tools.bench.gpu --rounds 1 --methods local --devices cpu --out DIR")

MNIST_TESTNETS = (
    "p2pnode testnet --algorithm A --dataset mnist5k --scenario S --nodes 10 --rounds 60 --out DIR --check",
    "p2pnode testnet --algorithm mapl-dual --dataset mnist5k --scenario 1 --nodes 10 --rounds 80 "
    "--samples-per-class 10 --test-per-class 80 --out DIR --check",
)

RUN: dict[str, Quick | tuple[Quick, ...]] = {
    "p2pnode bench protocol": PROTOCOL,
    "p2pnode bench protocol --runs 3 --save protocol": PROTOCOL,
    "p2pnode bench transport": TRANSPORT,
    "p2pnode bench adapters": ADAPTERS,
    "p2pnode bench adapters --runs 2 --save adapters": ADAPTERS,
    "p2pnode testnet --nodes 30 --algorithm none --duration 40 --out DIR": DISCOVERY,
    "python -m tools.bench.discovery --nodes 30 --duration 40 --runs 3 --save discovery-30": DISCOVERY_RUNS,
    "python -m tools.bench.discovery --nodes 100 --duration 300 --runs 1 --exit-on-mesh --out DIR "
    "--save discovery-100": DISCOVERY_RUNS,
    "p2pnode testnet --nodes 100 --algorithm none --duration 300 --exit-on-mesh --out DIR": DISCOVERY,
    "p2pnode simulate": SIMULATE,
    **dict.fromkeys(MNIST_TESTNETS, LEARNING_TESTNET),
    "python -m tools.demo --out demo-out": DEMO,
    "python -m tools.bench.learning": LEARNING,
    "python -m tools.bench.learning --out bench-out/learning --save learning": LEARNING,
    "python -m tools.bench.learning --scenarios 1 --save learning": LEARNING,
    "python -m tools.bench.heterogeneous --out bench-out/heterogeneous "
    "--methods local mapl-dual --save heterogeneous": HETEROGENEOUS,
    "python -m tools.bench.heterogeneous --methods local mapl-dual --samples 10 --save heterogeneous": HETEROGENEOUS,
    "python -m tools.bench.heterogeneous --out bench-out/heterogeneous-auto --methods local oracle "
    "mapl-auto --samples 10 --scenarios 1 --save heterogeneous-auto": HETEROGENEOUS,
    "python -m tools.bench.heterogeneous --out bench-out/heterogeneous-auto-fresh --methods local oracle mapl-auto "
    "--samples 10 --scenarios 1 --seeds 16 17 18 --workers 1 --save heterogeneous-auto-fresh": HETEROGENEOUS,
    "python -m tools.bench.heterogeneous --out bench-out/het-f16 --methods local oracle mapl-auto --samples 10 "
    "--scenarios 1 --seeds 54 55 56 --workers 2 --save heterogeneous-auto-float16": HETEROGENEOUS,
    "python -m tools.bench.heterogeneous --out bench-out/het-lone --methods local oracle mapl-auto --samples 10 "
    "--scenarios 1 --seeds 78 79 80 --workers 2 --save heterogeneous-auto-lone-local": HETEROGENEOUS,
    "python -m tools.bench.heterogeneous --out bench-out/het-keep --methods local oracle mapl-auto --samples 10 "
    "--scenarios 1 --seeds 87 88 89 --workers 2 --save heterogeneous-auto-local-in-mix": HETEROGENEOUS,
    "python -m tools.bench.heterogeneous --out bench-out/het-votes --methods local oracle mapl-auto --samples 10 "
    "--scenarios 1 --seeds 99 100 101 --save heterogeneous-auto-votes": HETEROGENEOUS,
    "python -m tools.bench.heterogeneous --out bench-out/het-bn --methods local oracle mapl-auto --samples 10 "
    "--scenarios 1 --seeds 108 109 110 --save heterogeneous-auto-bn": HETEROGENEOUS,
    "python -m tools.bench.fleets --nodes 3 4 10 --datasets mnist5k digits --seeds 7 8 9 --save fleets": FLEETS,
    "python -m tools.bench.fleets --nodes 3 4 10 --datasets mnist5k digits --seeds 16 17 18 --workers 1 "
    "--save fleets-fresh": FLEETS,
    "python -m tools.bench.fleets --nodes 3 4 10 --datasets mnist5k --seeds 11 12 20 --workers 2 "
    "--save fleets-unseen": FLEETS,
    "python -m tools.bench.fleets --nodes 3 4 10 --datasets mnist5k --seeds 26 27 28 --workers 2 "
    "--save fleets-one-model": FLEETS,
    "python -m tools.bench.fleets --nodes 3 4 10 --datasets mnist5k --seeds 29 30 32 --workers 2 "
    "--save fleets-nothing-held-out": FLEETS,
    "python -m tools.bench.fleets --nodes 3 4 10 --datasets mnist5k digits --seeds 33 34 35 --workers 2 "
    "--save fleets-keep-local": FLEETS,
    "python -m tools.bench.fleets --nodes 3 4 10 --backbones four --datasets mnist5k digits --methods "
    "local mapl-dual mapl-auto --seeds 36 37 38 --workers 2 --save fleets-mixed-ensemble": FLEETS,
    "python -m tools.bench.fleets --out bench-out/fleets-folder --datasets folder --nodes 3 4 10 --seeds 7 8 9 "
    "--save fleets-folder": FLEETS_FOLDER,
    "python -m tools.bench.fleets --datasets folder --nodes 3 4 10 --seeds 42 43 44 --workers 2 --out "
    "bench-out/fleets-folder-42 --save fleets-folder-fresh": FLEETS_FOLDER,
    "python -m tools.bench.fleets --out bench-out/fleets-f16 --nodes 3 4 10 --datasets mnist5k digits --seeds 57 58 "
    "59 --workers 2 --save fleets-float16": FLEETS,
    "python -m tools.bench.fleets --out bench-out/fleets-folder-f16 --datasets folder --nodes 3 4 10 --seeds 60 61 "
    "62 --workers 2 --save fleets-folder-float16": FLEETS_FOLDER,
    "python -m tools.bench.fleets --out bench-out/fleets-lone --nodes 3 4 10 --datasets mnist5k digits --seeds 72 73 "
    "74 --workers 2 --save fleets-lone-local": FLEETS,
    "python -m tools.bench.fleets --out bench-out/fleets-folder-lone --datasets folder --nodes 3 4 10 --seeds 75 76 "
    "77 --workers 2 --save fleets-folder-lone-local": FLEETS_FOLDER,
    "python -m tools.bench.fleets --out bench-out/fleets-keep --nodes 3 4 10 --datasets mnist5k digits --seeds 81 82 "
    "83 --workers 2 --save fleets-local-in-mix": FLEETS,
    "python -m tools.bench.fleets --out bench-out/fleets-folder-keep --datasets folder --nodes 3 4 10 --seeds 84 85 "
    "86 --workers 2 --save fleets-folder-local-in-mix": FLEETS_FOLDER,
    "python -m tools.bench.fleets --out bench-out/fleets-oracle --nodes 3 4 10 --datasets mnist5k digits --methods "
    "local oracle --seeds 81 82 83 --workers 2 --save fleets-oracle": FLEETS,
    "python -m tools.bench.fleets --out bench-out/fleets-folder-oracle --datasets folder --nodes 3 4 10 --methods "
    "local oracle --seeds 84 85 86 --workers 2 --save fleets-folder-oracle": FLEETS_FOLDER,
    "python -m tools.bench.fleets --out bench-out/fleets-votes --nodes 3 4 10 --datasets mnist5k digits --methods "
    "local mapl+ mapl-dual mapl-auto oracle --seeds 90 91 92 --workers 2 --save fleets-votes": FLEETS,
    "python -m tools.bench.fleets --out bench-out/fleets-folder-votes --datasets folder --nodes 3 4 10 --methods "
    "local mapl+ mapl-dual mapl-auto oracle --seeds 93 94 95 --workers 2 --save fleets-folder-votes": FLEETS_FOLDER,
    "python -m tools.bench.fleets --out bench-out/fleets-bn --nodes 3 4 10 --datasets mnist5k digits --methods "
    "local mapl+ mapl-dual mapl-auto oracle --seeds 102 103 104 --workers 2 --save fleets-bn": FLEETS,
    "python -m tools.bench.fleets --out bench-out/fleets-folder-bn --datasets folder --nodes 3 4 10 --methods "
    "local mapl+ mapl-dual mapl-auto oracle --seeds 105 106 107 --workers 2 --save fleets-folder-bn": FLEETS_FOLDER,
    "python -m tools.bench.scool --out bench-out/scool --save scool": SCOOL,
    "python -m tools.bench.scool --out DIR --seeds 13 14 15 --workers 2 --save scool-fresh": SCOOL,
    "python -m tools.bench.pretrained --out DIR --seeds 3 4 --workers 1 --save pretrained": PRETRAINED,
    "python -m tools.bench.pretrained --out DIR --seeds 3 4 --workers 1 --save pretrained-fit-check": PRETRAINED,
    "python -m tools.bench.stragglers --out DIR --seeds 1 2 3 --workers 2 --schedule async --save stragglers-async": (
        STRAGGLERS
    ),
    "python -m tools.bench.churn --save churn-async": CHURN,
    "python -m tools.bench.stragglers --out DIR --seeds 13 14 15 --workers 2 --schedule async "
    "--save stragglers-async-fresh": STRAGGLERS,
    "python -m tools.bench.stragglers_testnet --save stragglers-testnet": STRAGGLERS_TESTNET,
    "python -m tools.bench.poisoning --out bench-out/poisoning --seeds 1 2 --save poisoning": POISONING,
    "python -m tools.bench.parity --preset scool --seeds 3 --out DIR --save parity-scool": PARITY,
    "python -m tools.bench.parity --preset learning --seeds 1 2 --out DIR --save parity-learning": PARITY_LEARNING,
    "python -m tools.bench.parity --preset dual --seeds 3 --out DIR --save parity-dual": PARITY_DUAL,
    "p2pnode testnet --algorithm A --dataset mnist5k --scenario S --nodes 10 --rounds 80 --seed SEED "
    "--samples-per-class 10 --test-per-class 80 --out DIR --check": PARITY_DUAL,
    "p2pnode testnet --algorithm A --dataset mnist5k --scenario S --nodes 10 --rounds 60 --seed SEED "
    "--samples-per-class 25 --test-per-class 15 --out DIR --check": PARITY_LEARNING,
    "p2pnode testnet --algorithm A --dataset mnist5k --scenario S --nodes 10 --rounds 30 --seed SEED "
    "--samples-per-class 10 --test-per-class 15 --out DIR --check": PARITY,
    "python -m tools.bench.memory --out bench-out/memory": MEMORY,
    "python -m tools.bench.memory --stages": STAGES,
    "python -m tools.bench.scale --out bench-out/scale --nodes 10 30 100": SCALE,
    "python -m tools.bench.memory --out bench-out/memory --save memory": MEMORY,
    "python -m tools.bench.memory --stages --save memory-stages": STAGES,
    "python -m tools.bench.startup --runs 3 --save startup": STARTUP,
    "python -m tools.bench.clock_costs": CLOCK_COSTS,
    "python -m tools.bench.clock_costs --save clock-costs": CLOCK_COSTS,
    "python -m tools.bench.scale --out bench-out/scale --nodes 10 30 100 --save scale": SCALE,
    "python -m tests.overlay_bench": OVERLAY,
    "python -m tools.bench.simulate speedup | scaling | large": (SPEEDUP, SCALING, LARGE),
    "python -m tools.bench.simulate speedup --seed 1 --save simulate-speedup": SPEEDUP,
    "python -m tools.bench.simulate scaling --nodes 10 30 100 --rounds 5 --workers 1 2 --save simulate-scaling": (
        SCALING
    ),
    "python -m tools.bench.attacks --seconds 5": ATTACKS,
    "python -m tools.bench.hostile --seconds S": HOSTILE,
    "python -m tools.bench.hostile --seconds 30 --save hostile": HOSTILE,
    "python -m tools.bench.hostile --admitted-peer --save hostile-admitted": HOSTILE_ADMITTED,
    "python -m tools.bench.hostile --seconds 30 --learning --save hostile-learning": HOSTILE_LEARNING,
    "python -m tools.bench.colluders --seeds 0 11 12 --save colluders": COLLUDERS,
    "python -m tools.bench.colluders --seeds 0 11 12 --runs 8 --save colluders-crash-looper": COLLUDERS,
    "python -m tools.bench.campaign --seconds 60 --save campaign": CAMPAIGN,
    "python -m tools.bench.gpu": GPU,
    "python -m tools.bench.nat": NAT,
    "python -m tools.bench.nat --seconds 30 --save nat": NAT,
    "python -m tools.bench.nat --seconds 30 --client-mode --save nat-client": NAT_CLIENT,
    "python -m tools.bench.nat --seconds 30 --client-mode --relay --flush --save nat-relay": NAT_RELAY,
    "python -m tools.bench.nat_learning --rounds 40 --seed 10 --save nat-learning": NAT_LEARNING,
    "python -m tools.bench.nat_fleet --rounds 40 --seed 40 --save nat-fleet": NAT_FLEET,
    "python -m tools.bench.nat_fleet --rounds 40 --seed 45 --out bench-out/nat-fleet-45 --save nat-fleet-45": NAT_FLEET,
    "python -m tools.bench.nat_fleet --rounds 40 --seed 46 --out bench-out/nat-fleet-46 --save nat-fleet-46": NAT_FLEET,
    "python -m tools.bench.nat_fleet --rounds 40 --seed 51 --out bench-out/nat-fleet-51 --save nat-fleet-51": NAT_FLEET,
    "python -m tools.bench.nat_fleet --rounds 40 --seed 52 --out bench-out/nat-fleet-52 --save nat-fleet-52": NAT_FLEET,
    "python -m tools.bench.nat_fleet --rounds 40 --seed 53 --out bench-out/nat-fleet-53 --save nat-fleet-53": NAT_FLEET,
    "python -m tools.bench.nat_fleet --rounds 40 --seed 41 --out bench-out/nat-fleet-41 --save nat-fleet-41": NAT_FLEET,
    "python -m tools.bench.nat_learning --rounds 40 --seed 10 --relay --save nat-learning-relay": NAT_LEARNING,
    "python -m tools.bench.nat_learning --rounds 40 --seed 10 --relay --flush-after 60 "
    "--save nat-learning-relay-flush": NAT_LEARNING,
}

_MAKE = "a Makefile target (it builds .venv first): its commands are listed here and run quick"
_CUDA = "needs a CUDA GPU, which the machines the tests run on lack"
_RAY = "needs Ray, an optional extra (pip install -e '.[ray]') not installed where the tests run"

NOT_RUN = {
    "make demo": _MAKE,
    "make bench-learning": _MAKE,
    "make bench-scool": _MAKE,
    "make bench-heterogeneous": _MAKE,
    "make bench-memory": _MAKE,
    "make bench-scale": _MAKE,
    "p2pnode start": "the daemon named in prose: tools.bench.memory's testnets (run quick here) start it, and "
    "tests/test_readme.py runs README's `p2pnode start` block",
    "p2pnode testnet --engine ray": _RAY,
    "make bench-report": _MAKE,
    "python -m tools.bench.render": "tests/test_bench_results.py renders every table from its file and compares",
    "make test": "the suite this test is part of (CI's `make test`)",
    "make test-quick": "the quick modules of this suite, which `make test` runs too",
    "python -m pytest --quick -q": "the quick modules of this suite, which `make test` runs too",
    "python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder": "the suite this test is part of",
    "make lint": "CI's `make lint` (.ci/run), before the suite",
    "ruff format --check .": "CI's `make lint` (.ci/run), before the suite",
    "ruff check .": "CI's `make lint` (.ci/run), before the suite",
    "p2pnode testnet --algorithm mapl --dataset digits --nodes 4 --rounds 8 --samples-per-class 10 --backbones mlp "
    "--set warmup_rounds=3 --poisoners 3 --attack A --attack-factor 1e4 [--barrage] --check --out DIR": "parsed "
    "as written here; tests/adversarial/test_hostile_learning.py runs it (run_learning_testnet, the same spec, "
    "--check, with and without the barrage) and asserts more of its report, and tests/test_cli.py checks that the "
    "CLI hands those flags to it",
    "python -m pytest tests/test_device.py": "part of the suite (`make test`), where its `cuda` tests skip with "
    "their reason",
    "p2pnode testnet --algorithm mapl --dataset digits --nodes 4 --rounds 8 --samples-per-class 10 --backbones mlp "
    "--set warmup_rounds=3 --device cuda --out DIR --check": f"{_CUDA}; without `--device cuda` it is the README's "
    "command, which tests/test_readme.py runs",
}


def test_every_benchmarks_command_is_accounted_for():
    shown = every_command()
    assert not set(RUN) & set(NOT_RUN), "in both RUN and NOT_RUN"
    assert shown - set(RUN) - set(NOT_RUN) == set(), "a BENCHMARKS.md command nobody runs: add it to RUN or NOT_RUN"
    assert (set(RUN) | set(NOT_RUN)) - shown == set(), "listed here but gone from BENCHMARKS.md"


def test_every_make_target_and_module_exists():
    for target in make_targets(shown_commands()):
        assert makefile_recipe(target), f"`make {target}`: no such target in the Makefile"
    for command in every_command():
        words = _words(command)
        if words[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(words[2]) is not None, f"`{command}`: no module {words[2]}"


# A placeholder, by the option it follows, and what stands for it when the command is parsed.
PLACEHOLDERS = {("--algorithm", "A"): "mapl", ("--attack", "A"): "rescale", ("--scenario", "S"): "1"}
PLACEHOLDERS |= {("--seed", "S"): "0", ("--seed", "SEED"): "3", ("--seconds", "S"): "5"}


def _words(command: str) -> list[str]:
    """The command's words: an environment (PYTHONPATH=...) before it left out, [optional]
    parts in, placeholders filled in."""
    words = shlex.split(command.replace("[", "").replace("]", ""))
    while "=" in words[0]:
        words = words[1:]
    filled = [PLACEHOLDERS.get((before, word), word) for before, word in zip(["", *words], words, strict=False)]
    return [str(Path("/nonexistent/out")) if word == "DIR" else word for word in filled]


# Commands that name a subcommand, and maybe an option of it, in prose: not whole command lines.
PROSE = {"p2pnode simulate", "p2pnode start", "p2pnode testnet --engine ray"}


def _options(parser, words: list[str]) -> set[str]:
    """The options of the (sub)command `words` names (`bench protocol`: protocol's)."""
    for word in words:
        choices = parser._subparsers._group_actions[0].choices if parser._subparsers else {}
        parser = choices.get(word, parser)
    return {option for action in parser._actions for option in action.option_strings}


def test_every_p2pnode_command_parses(capsys):
    """What BENCHMARKS.md shows is accepted as written (a renamed option fails here, whatever the
    quick variant runs); one named in prose only needs its subcommand and options to exist."""
    parser = build_parser()
    subcommands = parser._subparsers._group_actions[0].choices
    assert not PROSE - every_command(), "named in prose here but gone from BENCHMARKS.md"
    for command in sorted(c for c in every_command() if c.startswith("p2pnode ")):
        words = _words(command)
        assert words[1] in subcommands, f"`{command}`: no subcommand {words[1]!r}"
        unknown = {word for word in words if word.startswith("--")} - _options(parser, words[1:3])
        assert not unknown, f"`{command}`: {unknown} not accepted by `p2pnode {words[1]}`"
        if command not in PROSE:
            try:
                parser.parse_args(words[1:])
            except SystemExit:
                pytest.fail(f"`{command}` does not parse: {capsys.readouterr().err}")


def _variants() -> list:
    quick = {q for entry in RUN.values() for q in (entry if isinstance(entry, tuple) else (entry,))}
    return [pytest.param(q, id=q.command, marks=pytest.mark.timeout(q.limit_s)) for q in sorted(quick, key=str)]


def _stands_for(quick: Quick) -> list[str]:
    return [
        command for command, entry in RUN.items() if quick == entry or (isinstance(entry, tuple) and quick in entry)
    ]


@pytest.fixture
def short_tmp():
    """A fresh directory with a short path: a daemon's control socket under DIR/node00/data/
    must fit in 107 bytes, and pytest's tmp_path is named after the (long) test id."""
    with tempfile.TemporaryDirectory(prefix="bench-") as directory:
        yield Path(directory)


@pytest.mark.parametrize("quick", _variants())
def test_quick_variant_runs(quick, short_tmp, monkeypatch, capsys):
    """In an empty directory (a tool's default bench-out/ lands there), with this checkout first
    on the path of what it starts (daemons, tools.attack, a --stages child)."""
    import tools.bench.command
    from tools.bench.results import save

    if quick.heavy and not ALL:
        pytest.skip(f"heavy (P2PNODE_BENCH_COMMANDS=all runs it), for {_stands_for(quick)}")
    if quick.needs is not None and (why := quick.needs()) is not None:
        pytest.skip(f"{why}, for {_stands_for(quick)}")
    monkeypatch.chdir(short_tmp)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(tools.bench.command, "save", functools.partial(save, directory=short_tmp))
    words = shlex.split(quick.command.replace("DIR", str(short_tmp / "out")))
    if words[0] == "p2pnode":
        code = main(words[1:])
    else:
        assert words[:2] == ["python", "-m"]
        code = importlib.import_module(words[2]).main(words[3:])
    printed = capsys.readouterr()
    assert code in (0, None), f"`{quick.command}` (for {_stands_for(quick)}) exited {code}: {printed.err[-3000:]}"
