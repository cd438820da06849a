"""Raw-ZMTP attacks that abort libzmq (issue #27), held against one node of a 4-node testnet for a
minute: does the node stay up, does it keep answering and keep its peers, and how much of the
time is the attacked socket reachable? CURVE on and off, bans of the suspects of aborts
(`[security].abort_ban_s`) on and off, from a stranger (public socket) and, with CURVE, from an
admitted peer's key (peers' socket).

    python -m tools.bench.hostile [--seconds 60] [--learning] [--out FILE] [--quick]

While an attack runs, the target's `status` is asked every 0.2 s (its latency, peer count and
ingress restarts) and the attacked port is probed with a TCP connect every 0.05 s (refused: the
socket's process is starting again; a banned address is refused later, in the handshake).
Each attack runs against a fresh testnet. With `--learning` the daemons learn (MAPL on digits,
an mlp, 10 images per class, as many rounds as the attacks last) and each row adds the target's
rounds: how many it completed during the attack, and the longest wait for its round counter to
move, during the attack and in as long a stretch just before it. `--quick` runs the first row
only (CURVE and bans off, stall-reset at the public socket): a smoke test, not for numbers.
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

from testnet.cluster import Cluster, NodeSpec
from testnet.learning import DISCOVERY, node_settings
from testnet.simulator import SimulationSpec

__all__ = ["main"]

NODES = 4
STATUS_EVERY_S = 0.2
PROBE_EVERY_S = 0.05


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
        dataset="digits",
        nodes=NODES,
        rounds=int(10 * seconds) + 100,  # rounds of ~0.5-1 s: never done while measured
        samples_per_class=10,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.hostile", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--learning", action="store_true", help="the daemons learn; rows add the target's rounds")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--quick", action="store_true", help="the first row only: a smoke test, not for numbers")
    args = parser.parse_args(argv)
    rows = run_all(args.seconds, args.learning, args.quick)
    print(format_table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
