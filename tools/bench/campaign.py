"""Abort campaigns against one node of a 4-node CURVE testnet (issue #43): who gets banned, and
is the node reachable for an honest newcomer meanwhile?

    python -m tools.bench.campaign [--seconds 60] [--sources 2000] [--campaigns ...] [--learning] [--save NAME]

- `many-sources`: one attacker with `--sources` loopback addresses (250 to a /24: 127.1.0.0/21
  for 2,000) runs the stall-reset attack at the target's public socket (tools/attack.py);
- `crash-looper`: an admitted peer's key, from an address of its own, strikes the target's
  peers' socket again the moment its process is back (`--pause 0`);
- `idle`: 1,000 CURVE handshakes from 20 addresses of one /24, then silence, each one the target
  shuts or refuses opened anew (tools/attack.py `--kind idle`); the row adds the public ingress
  process's memory before, at its most and IDLE_SETTLE_S after the attack.

Beside each, from other prefixes: an honest *newcomer* completes a CURVE handshake with a fresh
key every NEWCOMER_EVERY_S (127.2.0.1; reachable = handshakes that succeed / tried) and a
*bystander* that only reconnects (127.3.0.1, one key, a new connection every BYSTANDER_EVERY_S)
counts how often it is refused. The target's status gives its ingress restarts (the aborts),
its bans and throttles, and its peers. With `--learning` the daemons learn (MAPL on digits, as
tools/bench/hostile.py) and each row adds the target's rounds during the attack and the longest
wait for one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from protocol.curve import curve_public_from_ed25519
from testnet.launch.cluster import Cluster
from testnet.launch.learning import DISCOVERY
from tools import zmtp

from .hostile import LEARNING_SETTINGS, NODES, SETTINGS, _completed, _learning, _longest_wait
from .results import capture, publish

__all__ = ["main"]

NEWCOMER, BYSTANDER = "127.2.0.1", "127.3.0.1"  # honest hosts, each in a prefix of its own
NEWCOMER_EVERY_S, BYSTANDER_EVERY_S, STATUS_EVERY_S = 0.1, 1.0, 0.5
IDLE_CONNECTIONS, IDLE_SOURCES, IDLE_SETTLE_S = 1000, 20, 5.0
# The target's counters a row reports (status: traffic.connections).
COUNTERS = (
    "reset",
    "abort_traced",
    "abort_untraced",
    "abort_key_untold",
    "abort_banned",
    "abort_prefix_throttled",
    "zap_denied_aborts",
    "zap_denied_prefix_throttled",
    "zap_denied_prefix_cap",
    "zap_denied_total_cap",
    "shut_silent",
)


class _Probe(threading.Thread):
    """Handshakes from `source` every `every_s` until stopped: how many were tried and succeeded."""

    def __init__(self, endpoint: str, server_key: bytes, source: str, every_s: float, fresh_key: bool) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.server_key, self.source, self.every_s = endpoint, server_key, source, every_s
        self.secret = None if fresh_key else os.urandom(32)  # an X25519 secret: any 32 bytes
        self.tried = self.succeeded = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.tried += 1
            try:
                zmtp.connect(
                    self.endpoint, server_key=self.server_key, secret_key=self.secret, timeout=2.0, source=self.source
                ).close()
                self.succeeded += 1
            except OSError:
                pass


def _counters(status: dict) -> dict[str, int]:
    connections = status["traffic"]["connections"]
    return {name: connections.get(name, 0) for name in COUNTERS}


def _public_mb(status: dict | None) -> float | None:
    """The resident memory of the public socket's ingress process (MB), None while it restarts."""
    return ((status or {}).get("ingress", {}).get("public") or {}).get("rss_mb")


def _campaign(cluster: Cluster, socket_name: str, args: list[str], seconds: float) -> dict:
    target = cluster.specs[0]
    status = cluster.status(target, timeout=5)
    endpoint = status["listen"] if socket_name == "public" else status["peers_listen"]
    server_key = curve_public_from_ed25519(target.public_key)
    command = [sys.executable, "-m", "tools.attack", "--target", endpoint, "--seconds", str(seconds), *args]
    probes = {
        "newcomer": _Probe(status["listen"], server_key, NEWCOMER, NEWCOMER_EVERY_S, fresh_key=True),
        "bystander": _Probe(status["listen"], server_key, BYSTANDER, BYSTANDER_EVERY_S, fresh_key=False),
    }
    before, peer_counts, rounds, memory = status, [], [], [_public_mb(status)]
    attack = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for probe in probes.values():
        probe.start()
    started = time.monotonic()
    while attack.poll() is None:
        answer = cluster.status(target, timeout=5)
        peer_counts.append(answer["peer_count"] if answer else 0)
        rounds.append((time.monotonic(), _completed(answer)))
        memory.append(_public_mb(answer))
        time.sleep(STATUS_EVERY_S)
    ended = time.monotonic()
    for probe in probes.values():
        probe.stop.set()
        probe.join()
    out, _ = attack.communicate()
    time.sleep(IDLE_SETTLE_S)  # the attacker's connections closed: what the process keeps
    after = cluster.status(target, timeout=5)
    counted = {name: after_n - _counters(before)[name] for name, after_n in _counters(after).items()}
    row = {
        "socket": socket_name,
        "attack": " ".join(args),
        "attacker": json.loads(out.strip().splitlines()[-1]),
        "node_alive": cluster.alive(target),
        "aborts": after["ingress"][socket_name]["restarts"] - before["ingress"][socket_name]["restarts"],
        "counters": counted,
        "newcomer_reachable": round(probes["newcomer"].succeeded / max(1, probes["newcomer"].tried), 4),
        "newcomer_tried": probes["newcomer"].tried,
        "bystander_refused": probes["bystander"].tried - probes["bystander"].succeeded,
        "bystander_tried": probes["bystander"].tried,
        "peers": {"before": before["peer_count"], "min": min(peer_counts), "after": after["peer_count"]},
        "public_ingress_mb": {
            "before": memory[0],
            "most": max((m for m in memory if m is not None), default=None),
            "after": _public_mb(after),
        },
    }
    if _completed(before) is not None:
        done = [r for _, r in rounds if r is not None]
        row["rounds"] = {"during": done[-1] - done[0], "longest_wait_s": _longest_wait(rounds, started, ended)}
    return row


def run_one(name: str, seconds: float, sources: int, learning: bool) -> dict:
    """One campaign (`name`) against node 0 of a fresh 4-node CURVE testnet."""
    sections = _learning(seconds) if learning else (lambda i: {})
    extra = lambda i: {**sections(i), "security": {"curve": True}}  # noqa: E731
    with (
        tempfile.TemporaryDirectory() as root,
        Cluster.prepare(Path(root), NODES, discovery=DISCOVERY if learning else None, extra=extra) as cluster,
    ):
        cluster.start_all()
        target, admitted = cluster.specs[0], cluster.specs[1]
        deadline = time.monotonic() + 60
        while (cluster.status(target) or {}).get("peer_count", 0) < NODES - 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        while learning and (_completed(cluster.status(target)) or 0) < 5 and time.monotonic() < deadline + 120:
            time.sleep(0.2)  # past the warm-up
        key = ["--target-key", target.public_key.hex()]
        if name == "many-sources":
            args = ["--kind", "stall-reset", "--sources", str(sources), *key]
            return {"campaign": name, "sources": sources, **_campaign(cluster, "public", args, seconds)}
        if name == "idle":
            connections = ["--connections", str(IDLE_CONNECTIONS), "--sources", str(IDLE_SOURCES)]
            row = _campaign(cluster, "public", ["--kind", "idle", *connections, *key], seconds)
            return {"campaign": name, "sources": IDLE_SOURCES, **row}
        as_key = ["--as-key", str(admitted.directory / "key.pem")]
        args = ["--kind", "stall-reset", "--frames", "1005", "--pause", "0", "--sources", "1", *as_key, *key]
        return {"campaign": name, "sources": 1, **_campaign(cluster, "peers", args, seconds)}


def format_table(rows: list[dict]) -> str:
    idle = [r for r in rows if r["campaign"] == "idle"]
    aborts = [r for r in rows if r["campaign"] != "idle"]
    return "\n\n".join(table(group) for group, table in ((aborts, _aborts_table), (idle, _idle_table)) if group)


def _idle_table(rows: list[dict]) -> str:
    lines = [
        "| campaign | attacker's addresses | handshakes completed / refused | most held at once | shut silent "
        "| newcomer reachable (handshakes) | bystander's handshakes failed | peers before → min → after "
        "| public ingress process MB: before → most → after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, c, m = r["attacker"], r["counters"], r["public_ingress_mb"]
        lines.append(
            f"| idle handshakes (public socket) | {r['sources']} | {a['opened']:,} / {a['refused']:,} "
            f"| {a['most_held']} | {c['shut_silent']:,} "
            f"| {100 * r['newcomer_reachable']:.1f} % ({r['newcomer_tried']}) "
            f"| {r['bystander_refused']} of {r['bystander_tried']} "
            f"| {r['peers']['before']} → {r['peers']['min']} → {r['peers']['after']} "
            f"| {m['before']:.1f} → {m['most']:.1f} → {m['after']:.1f} |"
        )
    return "\n".join(lines)


def _aborts_table(rows: list[dict]) -> str:
    learning = any("rounds" in r for r in rows)
    lines = [
        "| campaign | attacker's addresses | aborts | traced / untraced | banned | prefixes throttled "
        "| refused: banned / throttled | newcomer reachable (handshakes) | bystander's handshakes failed "
        "| peers before → min → after |" + (" rounds done, longest wait (s) |" if learning else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if learning else ""),
    ]
    for r in rows:
        c = r["counters"]
        line = (
            f"| {r['campaign']} ({r['socket']} socket) | {r['sources']:,} | {r['aborts']} "
            f"| {c['abort_traced']} / {c['abort_untraced']} | {c['abort_banned']} | {c['abort_prefix_throttled']} "
            f"| {c['zap_denied_aborts']:,} / {c['zap_denied_prefix_throttled']:,} "
            f"| {100 * r['newcomer_reachable']:.1f} % ({r['newcomer_tried']}) "
            f"| {r['bystander_refused']} of {r['bystander_tried']} "
            f"| {r['peers']['before']} → {r['peers']['min']} → {r['peers']['after']} |"
        )
        if learning:
            line += f" {r['rounds']['during']}, {r['rounds']['longest_wait_s']:.1f} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.campaign", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--sources", type=int, default=2000, help="the many-sources attacker's addresses")
    campaigns = ("many-sources", "crash-looper", "idle")
    parser.add_argument("--campaigns", nargs="+", choices=campaigns, default=list(campaigns))
    parser.add_argument("--learning", action="store_true", help="the daemons learn; rows add the target's rounds")
    parser.add_argument("--save", metavar="NAME", help="write the rows to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    words = ["python", "-m", "tools.bench.campaign", *(sys.argv[1:] if argv is None else argv)]
    settings = {**(LEARNING_SETTINGS if args.learning else SETTINGS), "security.curve": True}
    with capture(words, settings=settings, seeds=[0] if args.learning else [], threads=1) as provenance:
        rows = []
        for name in args.campaigns:
            rows.append(run_one(name, args.seconds, args.sources, args.learning))
            print(json.dumps(rows[-1]), flush=True)
    data = {"kind": "campaign", "seconds": args.seconds, "learning": args.learning, "rows": rows}
    return publish(rows, format_table(rows), provenance, args.save, "tools.bench.campaign", data)


def render(result: dict) -> str:
    return format_table(result["data"]["rows"])


if __name__ == "__main__":
    sys.exit(main())
