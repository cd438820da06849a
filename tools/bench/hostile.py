"""Raw-ZMTP attacks that abort libzmq (issue #27), held against one node of a 4-node testnet for a
minute: does the node stay up, does it keep answering and keep its peers, and how much of the
time is the attacked socket reachable? CURVE on and off, bans of the suspects of aborts
(`[security].abort_ban_s`) on and off, from a stranger (public socket) and, with CURVE, from an
admitted peer's key (peers' socket).

    python -m tools.bench.hostile [--seconds 60] [--learning] [--out FILE] [--quick] [--save NAME]
    python -m tools.bench.hostile --admitted-peer [--out FILE] [--save NAME]

While an attack runs, the target's `status` is asked every 0.2 s (its latency, peer count and
ingress restarts) and the attacked port is probed with a TCP connect every 0.05 s (refused: the
socket's process is starting again; a banned address is refused later, in the handshake).
Each attack runs against a fresh testnet. With `--learning` the daemons learn (MAPL on digits,
an mlp, 10 images per class, as many rounds as the attacks last) and each row adds the target's
rounds: how many it completed during the attack, and the longest wait for its round counter to
move, during the attack and in as long a stretch just before it. `--quick` runs the first row
only (CURVE and bans off, stall-reset at the public socket): a smoke test, not for numbers.

`--admitted-peer` measures one admitted learning peer instead (issue #27, "Done when" 2): the
4-daemon MAPL testnet of tests/adversarial/test_hostile_learning.py, node 3 a Byzantine daemon
(testnet/launch/byzantine.py) whose payloads are rescaled ×10⁴, alone and with each round's barrage,
beside its control twin (node 3 honest), each run judged by `--check`. `--save NAME` writes the
rows as result NAME (tools/bench/results.py) for BENCHMARKS.md to draw the table from.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

from algorithms.data.setup import ScenarioSpec
from testnet.launch.cluster import Cluster, NodeSpec
from testnet.launch.learning import DISCOVERY, node_settings, run_learning_testnet
from testnet.reporting.report import CheckThresholds
from testnet.simulation.simulator import SimulationSpec

from .results import capture, save

__all__ = ["main"]

NODES = 4
STATUS_EVERY_S = 0.2
PROBE_EVERY_S = 0.05
# Every daemon's settings that differ from a user's defaults: testnet/launch/cluster.py's cap for a
# testnet on one host. CURVE (on by default and in a testnet) and bans (`abort_ban_s` 0 where
# off) are in each row.
SETTINGS = {"security.max_connections_per_address": 64}
# With learning, also the launcher's quick discovery and its round settings (testnet/launch/learning.py).
LEARNING_SETTINGS = {
    **SETTINGS,
    **{f"discovery.{key}": value for key, value in DISCOVERY.items()},
    "algorithm.round_deadline_s": 5.0,
    "algorithm.start_peers": NODES - 1,
    "algorithm.start_timeout_s": 120.0,
    "model.threads": 1,
}


def _reachable(endpoint: str) -> bool:
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=0.5).close()
        return True
    except OSError:
        return False


def _completed(status: dict | None) -> int | None:
    learning = (status or {}).get("learning")
    return learning["completed"] if learning else None


def _longest_wait(samples: list[tuple[float, int | None]], start: float, end: float) -> float:
    """The longest time within [start, end] that the round counter did not move."""
    moves = [start]
    for (_, before), (at, now) in pairwise(samples):
        if now is not None and before is not None and now > before:
            moves.append(at)
    moves.append(end)
    return round(max(b - a for a, b in pairwise(moves)), 2)


def _rounds(cluster: Cluster, target: NodeSpec, seconds: float) -> list[tuple[float, int | None]]:
    """The target's completed rounds, every STATUS_EVERY_S for `seconds`."""
    samples, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append((time.monotonic(), _completed(cluster.status(target, timeout=5))))
        time.sleep(STATUS_EVERY_S)
    return samples


def _attack(cluster: Cluster, target: NodeSpec, socket_name: str, args: list[str], seconds: float) -> dict:
    status = cluster.status(target, timeout=5)
    endpoint = status["listen"] if socket_name == "public" else status["peers_listen"]
    command = [sys.executable, "-m", "tools.attack", "--target", endpoint, "--seconds", str(seconds), *args]
    before = status["ingress"]
    latencies, peer_counts, probes, rounds = [], [], [], []
    attack = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = next_status = time.monotonic()
    while attack.poll() is None:
        probes.append(_reachable(endpoint))
        if time.monotonic() >= next_status:
            started = time.perf_counter()
            answer = cluster.status(target, timeout=5)
            latencies.append(time.perf_counter() - started if answer else float("inf"))
            peer_counts.append(answer["peer_count"] if answer else 0)
            rounds.append((time.monotonic(), _completed(answer)))
            next_status += STATUS_EVERY_S
        time.sleep(PROBE_EVERY_S)
    ended = time.monotonic()
    out, _ = attack.communicate()
    result = json.loads(out.strip().splitlines()[-1])
    time.sleep(1.0)
    after = cluster.status(target, timeout=5)
    learned = {}
    if _completed(status) is not None:
        done = [r for _, r in rounds if r is not None]
        learned = {
            "rounds": {
                "during": done[-1] - done[0] if done else 0,
                "longest_wait_s": _longest_wait(rounds, started, ended),
            }
        }
    return {
        **learned,
        "attack": " ".join(args[:2]),
        "socket": socket_name,
        "node_alive": cluster.alive(target),
        "attacker": result,
        "restarts": {name: after["ingress"][name]["restarts"] - before[name]["restarts"] for name in before},
        "status_s": {"median": statistics.median(latencies), "max": max(latencies), "asked": len(latencies)},
        "peers": {"before": status["peer_count"], "min": min(peer_counts), "after": after["peer_count"]},
        "reachable_share": round(sum(probes) / max(1, len(probes)), 3),
        "evicted": {k: v for k, v in after["membership"].items() if k.startswith("evicted")},
    }


def _learning(seconds: float) -> Callable[[int], dict]:
    """Node i's sections of a MAPL testnet on digits with rounds enough for `seconds` and more."""
    spec = SimulationSpec(
        algorithm="mapl",
        data=ScenarioSpec(dataset="digits", nodes=NODES, samples_per_class=10),
        rounds=int(10 * seconds) + 100,  # rounds of ~0.5-1 s: never done while measured
        backbones=("mlp",),
        overrides={"warmup_rounds": "3"},
    )
    return lambda i: node_settings(spec, i, "mlp", round_deadline_s=5.0)


def run_one(curve: bool, bans: bool, socket_name: str, args: list[str], seconds: float, learning: bool) -> dict:
    """One attack against node 0 of a fresh testnet (bans of one attack would carry over)."""
    security = {"curve": curve, **({} if bans else {"abort_ban_s": 0})}
    sections = _learning(seconds) if learning else (lambda i: {})
    extra = lambda i: {**sections(i), "security": security}  # noqa: E731
    with (
        tempfile.TemporaryDirectory() as root,
        Cluster.prepare(Path(root), NODES, discovery=DISCOVERY if learning else None, extra=extra) as cluster,
    ):
        cluster.start_all()
        target = cluster.specs[0]
        deadline = time.monotonic() + 60
        while (cluster.status(target) or {}).get("peer_count", 0) < NODES - 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.5)  # past `abort_suspect_s` after the sockets came up
        quiet = {}
        if learning:
            while (_completed(cluster.status(target)) or 0) < 5 and time.monotonic() < deadline + 120:
                time.sleep(0.2)  # past the warm-up
            samples = _rounds(cluster, target, seconds)
            quiet = {
                "rounds_before": {
                    "during": samples[-1][1] - samples[0][1],
                    "longest_wait_s": _longest_wait(samples, samples[0][0], samples[-1][0]),
                }
            }
        key = ["--target-key", target.public_key.hex()] if curve else []
        peers_key = (
            ["--as-key", str(cluster.specs[1].directory / "key.pem")] if curve and socket_name == "peers" else []
        )
        row = _attack(cluster, target, socket_name, [*args, *key, *peers_key], seconds)
        return {"curve": curve, "bans": bans, **row, **quiet}


# (socket, tools.attack arguments): a stranger at the public socket, and at the peers' socket
# (with CURVE: an admitted peer's key; `--pause 2.5`: each try after the moment when every peer
# reconnects, where keys are not suspected; `--frames 1005`: past that socket's queue of 1000).
ATTACKS = [
    ("public", ["--kind", "stall-reset"]),
    ("public", ["--kind", "malformed"]),
    ("peers", ["--kind", "stall-reset", "--frames", "1005", "--pause", "2.5"]),
]


def run_all(seconds: float, learning: bool, quick: bool = False) -> list[dict]:
    rows = []
    for curve in (False, True):
        for bans in (False, True):
            for socket_name, args in ATTACKS:
                if args[1] == "malformed" and bans:
                    continue  # malformed ZMTP aborts nothing: no ban to compare
                rows.append(run_one(curve, bans, socket_name, args, seconds, learning))
                print(json.dumps(rows[-1]), flush=True)
                if quick:
                    return rows
    return rows


def format_table(rows: list[dict]) -> str:
    learning = any("rounds" in r for r in rows)
    lines = [
        "| CURVE | bans | attack | socket (attacker) | node exits | aborts of that socket's process (other socket) "
        "| status median / max (s) | peers before → min → after | socket reachable | honest peers evicted |"
        + (" rounds done, attacked (quiet) | longest wait for a round, s, attacked (quiet) |" if learning else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if learning else ""),
    ]
    for r in rows:
        other = "peers" if r["socket"] == "public" else "public"
        who = "stranger" if r["socket"] == "public" or not r["curve"] else "admitted key"
        on_off = ("on" if r["curve"] else "off", "on" if r["bans"] else "off")
        line = (
            f"| {on_off[0]} | {on_off[1]} | {r['attack']} | {r['socket']} ({who}) | {0 if r['node_alive'] else 1} "
            f"| {r['restarts'][r['socket']]} ({r['restarts'][other]}) "
            f"| {r['status_s']['median']:.3f} / {r['status_s']['max']:.3f} "
            f"| {r['peers']['before']} → {r['peers']['min']} → {r['peers']['after']} "
            f"| {100 * r['reachable_share']:.0f} % | {sum(r['evicted'].values())} |"
        )
        if learning:
            attacked, quiet = r["rounds"], r["rounds_before"]
            line += (
                f" {attacked['during']} ({quiet['during']}) "
                f"| {attacked['longest_wait_s']:.1f} ({quiet['longest_wait_s']:.1f}) |"
            )
        lines.append(line)
    return "\n".join(lines)


# One admitted learning peer (--admitted-peer): the spec of tests/adversarial/test_hostile_learning.py.
ADMITTED_POISONER = 3  # cluster 1 is nodes 2 and 3: node 2's only cluster-mate poisons
ADMITTED_SEED = 1  # not 0, which tuned MAPL's hyper-parameters (tools/bench/learning.py)
ADMITTED_SETTINGS = {**LEARNING_SETTINGS, "security.curve": True}  # the testnet's, in every run
ADMITTED_RUNS = (("none", False), ("rescale", False), ("rescale", True))  # (attack, barrage): the twin first


def digits_spec(
    poisoners: tuple[int, ...],
    attack: str,
    attack_factor: float = 1e4,
    *,
    nodes: int = NODES,
    seed: int = 0,
    **overrides: str,
) -> SimulationSpec:
    """The issue's hostile testnet (#27, #43): MAPL on digits, `nodes` daemons, 8 rounds, 10
    images per class, an mlp, warm-up 3 (and `overrides`), `poisoners` running `attack`."""
    return SimulationSpec(
        algorithm="mapl",
        data=ScenarioSpec(dataset="digits", nodes=nodes, seed=seed, samples_per_class=10),
        rounds=8,
        backbones=("mlp",),
        overrides={"warmup_rounds": "3", **overrides},
        poisoners=poisoners,
        attack=attack,
        attack_factor=attack_factor,
    )


def _admitted_spec(attack: str) -> SimulationSpec:
    return digits_spec((ADMITTED_POISONER,), attack, seed=ADMITTED_SEED)


def admitted_peer_runs(quick: bool = False) -> list[dict]:
    """The twin, the rescale alone and the rescale with the barrage (`quick`: the first only),
    each a fresh testnet judged as `p2pnode testnet --check` does (default thresholds)."""
    rows = []
    for attack, barrage in ADMITTED_RUNS[:1] if quick else ADMITTED_RUNS:
        with tempfile.TemporaryDirectory() as root:
            check = CheckThresholds(accuracy=0.6, within_cluster_mass=0.9)
            code, report = run_learning_testnet(_admitted_spec(attack), Path(root), check=check, barrage=barrage)
        rows.append(_admitted_row(attack, barrage, code, report))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _admitted_row(attack: str, barrage: bool, code: int, report: dict) -> dict:
    poisoning, processes = report["poisoning"], report["processes"]
    honest = poisoning["honest"]
    return {
        "attack": attack,
        "barrage": barrage,
        "check": {"passed": code == 0, "failures": report["check"]["failures"]},
        "honest_accuracy": poisoning["honest_accuracy"]["mean"],
        "honest_mass": poisoning["honest_within_cluster_mass"]["final"],
        "within_cluster_mass": report["graph"]["within_cluster_mass"],
        "poisoner_weight": poisoning["poisoner_weight"]["max"],
        "honest_l1": {key: poisoning["honest_l1_to_truth"][key] for key in ("mean", "max")},
        "last_round": [report["last_round_per_node"][i] for i in honest],
        "catch_ups": [processes["catch_ups"][i] for i in honest],
        "exit_codes": processes["exit_codes"],
        "ingress_restarts": processes["ingress_restarts"],
        "peak_rss_mb": {"honest": [processes["peak_rss_mb"][i] for i in honest], "poisoner": _poisoner_rss(report)},
        "sent": poisoning.get("sent", {}),
        "refused_by_honest": poisoning.get("refused_by_honest", {}),
        "wall_s": report["wall_s"],
    }


def _poisoner_rss(report: dict) -> float | None:
    return report["processes"]["peak_rss_mb"][report["poisoning"]["nodes"][0]]


def check_verdict(row: dict) -> str:
    """`--check`'s outcome of a row, its failures spelled out."""
    return "passed" if row["check"]["passed"] else "**failed**: " + "; ".join(row["check"]["failures"])


def refusals(by_reason: dict[str, int]) -> str:
    """Payloads refused, by reason, as a table cell."""
    return ", ".join(f"{n:,} `{reason}`" for reason, n in by_reason.items()) or "—"


def format_admitted(rows: list[dict]) -> str:
    lines = [
        "| run | `--check` | honest accuracy | poisoner's weight in honest rows | honest L1, mean (max) "
        "| honest rows' last round / catch-ups | exits / ingress restarts | peak RSS per daemon, MB "
        "| refused by the honest nodes | wall, s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        twin = r["attack"] == "none"
        run = "twin (`none`)" if twin else f"`{r['attack']}`" + (" + barrage" if r["barrage"] else " alone")
        mass = r["within_cluster_mass"] if twin else r["honest_mass"]
        verdict = check_verdict(r)
        l1 = "—" if twin else f"{r['honest_l1']['mean']:.3f} ({r['honest_l1']['max']:.3f})"
        exits = sum(1 for code in r["exit_codes"] if code != 0)
        honest_rss, poisoner_rss = r["peak_rss_mb"]["honest"], r["peak_rss_mb"]["poisoner"]
        refused = refusals(r["refused_by_honest"])
        lines.append(
            f"| {run} | {verdict} (mass {mass:.3f}) | {r['honest_accuracy']:.3f} "
            f"| {r['poisoner_weight']:.3f}{' (its mate’s)' if twin else ''} | {l1} "
            f"| {', '.join(map(str, r['last_round']))} / {sum(r['catch_ups'])} "
            f"| {exits} / {sum(n or 0 for n in r['ingress_restarts'])} "
            f"| {min(honest_rss):.0f}–{max(honest_rss):.0f} (the poisoner {poisoner_rss:.0f}) | {refused} "
            f"| {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.hostile", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--learning", action="store_true", help="the daemons learn; rows add the target's rounds")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--quick", action="store_true", help="the first row only: a smoke test, not for numbers")
    parser.add_argument(
        "--admitted-peer", action="store_true", help="instead: one admitted learning peer poisons, with a barrage"
    )
    parser.add_argument("--save", metavar="NAME", help="write the rows to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    words = ["python", "-m", "tools.bench.hostile", *(sys.argv[1:] if argv is None else argv)]
    if args.admitted_peer:
        with capture(words, settings=ADMITTED_SETTINGS, seeds=[ADMITTED_SEED], threads=1) as provenance:
            data = {"kind": "admitted-peer", "rows": admitted_peer_runs(args.quick)}
        table = format_admitted(data["rows"])
    else:
        settings, seeds = (LEARNING_SETTINGS, [0]) if args.learning else (SETTINGS, [])
        with capture(words, settings=settings, seeds=seeds, threads=1 if args.learning else None) as provenance:
            rows = run_all(args.seconds, args.learning, args.quick)
        data = {"kind": "aborts", "seconds": args.seconds, "learning": args.learning, "rows": rows}
        table = format_table(rows)
    provenance["runs"] = len(data["rows"])  # one fresh testnet each
    print(table)
    if args.out:
        args.out.write_text(json.dumps(data["rows"], indent=1))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.hostile', provenance, data)}")
    return 0


def render(result: dict) -> str:
    data = result["data"]
    if data["kind"] == "admitted-peer":
        return format_admitted(data["rows"])
    learning = ", the daemons learning (MAPL on digits)" if data["learning"] else ""
    return f"{format_table(data['rows'])}\n\nEach attack {data['seconds']:g} s against a fresh testnet{learning}."


if __name__ == "__main__":
    sys.exit(main())
