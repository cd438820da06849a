"""How fast 100 simulated nodes reach their bounded views (tests/simnet.py: the daemon's
`Membership`, real signed frames, simulated time), for comparing displacement rules.

    python -m tests.overlay_bench [--nodes 100] [--seeds 0 1 2] [--joins hub chain waves]
                                  [--gap S] [--latency S] [--limit S] [--set KEY=VALUE ...]

Joins: `hub`, all at once through node 0 (as tests/test_overlay.py); `chain`, all at once, each
through the one before; `waves`, as the real launcher starts them (testnet/launch/cluster.py,
`start_all`): node 0 first, then one node every `--gap` seconds, each joining through node 0
and one random earlier node. Every node: `active_view` 8, `max_peers` 10 and the liveness of
tools/bench/scale.py. Prints, per join and seed, the simulated seconds from the last start to
every view at its target (between `active_view` and `max_peers`; null if not within `--limit`),
the smallest view then, the overlay's diameter, and displacements and redirects in all.
`--set settled_after_s=0` turns displacement for returning newcomers off (docs/daemon.md)."""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter

import networkx as nx

from .simnet import SimNet, address, overlay

LIVENESS = {"ping_interval_s": 5.0, "peer_timeout_s": 15.0, "dial_retry_initial_s": 0.5}


def run(join: str, nodes: int, seed: int, gap: float, limit: float, settings: dict, latency: float = 0.002) -> dict:
    net = SimNet(latency=latency, connect_delay=5 * latency)
    draw = random.Random(seed)
    added = []

    def add(i: int, bootstrap: list[str]) -> None:
        node = net.add(i, bootstrap, address=address(i), **settings)
        node.membership.rng = random.Random(seed * 100_003 + i)
        added.append(node)

    for i in range(nodes):
        if join == "hub":
            add(i, [] if i == 0 else [address(0)])
        elif join == "chain":
            add(i, [] if i == 0 else [address(i - 1)])
        else:
            if i:
                net.run(gap)
            boot = [] if i == 0 else [address(0)] + ([address(draw.randrange(1, i))] if i > 1 else [])
            add(i, boot)
    started = net.now
    low, high = settings["active_view"], settings["max_peers"]

    def done() -> bool:
        return all(low <= len(n.membership.peers) <= high for n in added)

    wall = time.perf_counter()
    while not done() and net.now - started < limit:
        net.run(0.25)
    took = net.now - started
    sizes = sorted(len(n.membership.peers) for n in added)
    graph = overlay(added)
    counts = sum((n.membership.counts for n in added), start=Counter())
    return {
        "join": join,
        "seed": seed,
        "at_target_s": round(took, 2) if done() else None,
        "min": sizes[0],
        "short": sum(s < low for s in sizes),
        "connected": nx.is_connected(graph),
        "diameter": nx.diameter(graph) if nx.is_connected(graph) else None,
        "displaced": counts["evicted_displaced"],
        "redirected": counts["redirected"],
        "wall_s": round(time.perf_counter() - wall, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--joins", nargs="+", default=["hub", "chain", "waves"])
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between starts in `waves`")
    parser.add_argument("--limit", type=float, default=120.0, help="simulated seconds after the last start")
    parser.add_argument("--latency", type=float, default=0.002, help="one way, simulated seconds (connect: 5 x)")
    parser.add_argument("--set", nargs="*", default=[], help="[discovery] KEY=VALUE for every node")
    args = parser.parse_args(argv)
    settings = {"active_view": 8, "max_peers": 10, **LIVENESS}
    for item in args.set:
        key, value = item.split("=", 1)
        settings[key] = json.loads(value)
    for join in args.joins:
        for seed in args.seeds:
            print(json.dumps(run(join, args.nodes, seed, args.gap, args.limit, settings, args.latency)), flush=True)


if __name__ == "__main__":
    main()
