"""Who joins from behind a NAT (issue #46): discovery daemons on the NAT testbed, each node's peers.

    python -m tools.bench.nat [--seconds 30] [--client-mode [--relay] [--flush]] [--out bench-out/nat] [--save nat]

The testbed (testnet/launch/nat.py): a bootstrap node and two more public nodes on the internet
bridge; two nodes behind one port-restricted home router, two behind one symmetric NAT, two
behind a home router behind a carrier-grade NAT, and one public node behind its own firewall.
Every node but the bootstrap names the bootstrap (its key and public address) and runs
discovery only (`algorithm none`, CURVE on, the launcher's fast liveness settings) for
`--seconds`; then each node's peer table is read. Per site: how many nodes were admitted by how
many peers, whether the bootstrap admitted them, and what each says of its reachability
(`status`'s `reachability`: public, private or unknown). Then, the daemons stopped, hole
punching between each pair of sites (`simultaneous_open`: TCP simultaneous open, each host at
the address and port its NAT would show if it kept the port). With `--client-mode` every node
that is not on the internet bridge runs with `[node].client_mode` (and no hole punching is
tried); with `--relay` the bootstrap relays for them (`[relay].enabled`), and the table also says
what it forwarded and its memory (the daemon and its inbound processes: a relay that does not
learn). With `--flush`, after `--seconds` every router's mappings are expired (`conntrack -F`)
and the nodes are watched for up to 60 s until each has heard from every peer it had since the
flush. Needs root,
`ip netns`, `iptables` and `conntrack`; it says what is missing otherwise and exits 2.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections import Counter
from pathlib import Path

from .results import capture, save

# The testbed of issue #46's "done when", less the relay: (name, site, router group).
LAYOUT = (
    ("bootstrap", "public", None),
    ("public1", "public", None),
    ("public2", "public", None),
    ("home1", "port-restricted", "home"),
    ("home2", "port-restricted", "home"),
    ("sym1", "symmetric", "sym"),
    ("sym2", "symmetric", "sym"),
    ("cgn1", "double", "cgn"),
    ("cgn2", "double", "cgn"),
    ("walled", "firewall", None),
)
PORT = 7000
PUNCH_TIMEOUT_S = 6.0


def lab_hosts(lab, natted: bool = True, layout: tuple = LAYOUT) -> list:
    """The hosts of `layout` on `lab`, each behind its site's router (those of a group behind one);
    all on the internet bridge unless `natted` (a control run's)."""
    routers: dict[str, str] = {}
    hosts = []
    for name, site, group in layout:
        site = site if natted else "public"
        if natted and group is not None and group not in routers:
            routers[group] = lab.add_router(site)
        hosts.append(lab.add(name, site, routers.get(group)))
    return hosts


def run(
    out: Path, seconds: float, client_mode: bool = False, relay: bool = False, flush: bool = False
) -> tuple[list[dict], list[dict], dict]:
    """One run on a fresh testbed: each node's site, address and the sites of its peers; then
    hole punching between the first host of each pair of sites (not with `client_mode`); and,
    with `relay`, the relay's counts and memory, with `flush` how long until every node heard
    from its peers again."""
    from testnet.launch.learning import DISCOVERY
    from testnet.launch.nat import NatLab, cluster_on

    with NatLab() as lab:
        hosts = lab_hosts(lab)
        cluster = cluster_on(hosts, out, port=PORT, discovery=DISCOVERY, client_mode=client_mode, relay=relay)
        with cluster:
            for spec in cluster.specs:
                cluster.start(spec)
            time.sleep(seconds)
            statuses = cluster.statuses()
            extra = _flushed(lab, cluster, statuses) if flush else {}
            if relay:
                extra["relay"] = _relay(cluster.statuses()[0])
        site_of = {spec.node_id: host.site for spec, host in zip(cluster.specs, hosts, strict=True)}
        bootstrap = cluster.specs[0].node_id
        bootstrap_peers = set(_peers(statuses[0]))
        nodes = [
            {
                "name": host.name,
                "site": host.site,
                "address": host.address,
                "up": status is not None,
                "peer_sites": sorted(site_of.get(peer, "?") for peer in _peers(status)),
                "admitted_by_bootstrap": spec.node_id in bootstrap_peers if spec.node_id != bootstrap else None,
                "reachability": ((status or {}).get("reachability") or {}).get("state"),
            }
            for spec, host, status in zip(cluster.specs, hosts, statuses, strict=True)
        ]
        return nodes, [] if client_mode else _punches(hosts), extra


FLUSH_WATCH_S = 60.0


def _flushed(lab, cluster, before: list[dict | None]) -> dict:
    """Expire every router's mappings, then watch until every node has heard from each peer it
    had, since the flush: frames cross every NAT (and the relay) again."""
    lab.flush()
    flushed_at = time.monotonic()
    wanted = [set(_peers(status)) for status in before]
    while time.monotonic() - flushed_at < FLUSH_WATCH_S:
        time.sleep(1.0)
        elapsed, now = time.monotonic() - flushed_at, cluster.statuses()
        heard = [_heard_within(status, elapsed) for status in now]
        if all(peers <= since for peers, since in zip(wanted, heard, strict=True)):
            return {"flush_recovered_s": round(time.monotonic() - flushed_at, 1)}
    return {"flush_recovered_s": None}


def _heard_within(status: dict | None, seconds: float) -> set[str]:
    """The peers `status` says it last heard from less than `seconds` ago."""
    return {peer["node_id"] for peer in (status or {}).get("peers", []) if peer["last_seen_s"] < seconds}


def _relay(status: dict | None) -> dict:
    """The relay's places, circuits and counts, and its memory: the daemon and its inbound processes."""
    from testnet.reporting.overlay import ingress_rss_mb

    relay = (status or {}).get("relay") or {}
    return {
        "holders": len(relay.get("holders", [])),
        "circuits": relay.get("circuits"),
        "counts": relay.get("counts", {}),
        "rss_mb": (status or {}).get("rss_mb"),
        "peak_rss_mb": (status or {}).get("peak_rss_mb"),
        "ingress_rss_mb": ingress_rss_mb(status),
    }


def _punches(hosts: list) -> list[dict]:
    """Hole punching between the first hosts of each pair of different sites (two hosts of one
    site share a router here, whose inside reaches itself anyway)."""
    from testnet.launch.nat import simultaneous_open

    first: dict[str, object] = {}
    for host in hosts[1:]:  # not the bootstrap: public1 stands for public
        first.setdefault(host.site, host)
    rows = []
    for a, b in itertools.combinations(first, 2):
        started = time.monotonic()
        ok = simultaneous_open(first[a], first[b], timeout_s=PUNCH_TIMEOUT_S)
        rows.append({"sites": [a, b], "ok": ok, "seconds": round(time.monotonic() - started, 1)})
    return rows


def _peers(status: dict | None) -> list[str]:
    return [peer["node_id"] for peer in (status or {}).get("peers", [])]


def render(result: dict) -> str:
    """One row per site: its nodes, how many the bootstrap admitted, and their peers' count."""
    result = result["data"]
    rows = [
        "| site | nodes | admitted by the bootstrap | peers per node (min–max) | peers' sites | each says it is |",
        "|---|---|---|---|---|---|",
    ]
    sites = dict.fromkeys(node["site"] for node in result["nodes"])
    for site in sites:
        nodes = [node for node in result["nodes"] if node["site"] == site]
        counts = [len(node["peer_sites"]) for node in nodes]
        admitted = [node["admitted_by_bootstrap"] for node in nodes if node["admitted_by_bootstrap"] is not None]
        admitted_text = f"{sum(admitted)} of {len(admitted)}" if admitted else "(is the bootstrap)"
        seen = sorted({peer for node in nodes for peer in node["peer_sites"]}) or ["none"]
        says = ", ".join(f"{state} {count}" for state, count in Counter(node["reachability"] for node in nodes).items())
        row = f"| {site} | {len(nodes)} | {admitted_text} | {min(counts)}–{max(counts)} | {', '.join(seen)} | {says} |"
        rows.append(row)
    mode = "; every node off the internet bridge in client mode" if result.get("client_mode") else ""
    mode += ", the bootstrap relaying for them" if result.get("relay") else ""
    table = "\n".join(rows) + f"\n\nAfter {result['seconds']:g} s of discovery{mode}.\n"
    return table + _render_relay(result) + _render_punches(result.get("punches", []))


def _render_relay(result: dict) -> str:
    lines = []
    relay = result.get("extra", {}).get("relay")
    if relay:
        counts = relay["counts"]
        lines.append(
            f"\nThe relay held {relay['holders']} places and {relay['circuits']} circuits, forwarded "
            f"{counts.get('relayed_frames', 0)} frames ({counts.get('relayed_bytes', 0) / 2**20:.1f} MiB sealed), "
            f"refused {sum(v for k, v in counts.items() if k.startswith('unrelayed_'))}; its memory: the daemon "
            f"{relay['rss_mb']:.0f} MB (peak {relay['peak_rss_mb']:.0f} MB), its inbound processes "
            f"{relay['ingress_rss_mb']:.0f} MB, {relay['rss_mb'] + relay['ingress_rss_mb']:.0f} MB in all.\n"
        )
    if "flush_recovered_s" in result.get("extra", {}):
        recovered = result["extra"]["flush_recovered_s"]
        lines.append(
            "\nAfter `conntrack -F` on every router, "
            + (
                f"every node heard from every peer it had again within {recovered:g} s.\n"
                if recovered is not None
                else f"not every node heard from all its peers again within {FLUSH_WATCH_S:g} s.\n"
            )
        )
    return "".join(lines)


def _render_punches(punches: list[dict]) -> str:
    if not punches:
        return ""
    rows = ["", "| hole punching between | TCP simultaneous open | seconds |", "|---|---|---|"]
    for punch in punches:
        a, b = punch["sites"]
        rows.append(f"| {a} ↔ {b} | {'works' if punch['ok'] else 'fails'} | {punch['seconds']:g} |")
    return "\n".join(rows) + f"\n\nEach pair tried for {PUNCH_TIMEOUT_S:g} s at most.\n"


def main(argv: list[str] | None = None) -> int:
    from testnet.launch.nat import missing

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--client-mode", action="store_true", help="nodes off the internet bridge in client mode")
    parser.add_argument("--relay", action="store_true", help="with --client-mode: the bootstrap relays for them")
    parser.add_argument("--flush", action="store_true", help="then expire every router's mappings and watch")
    parser.add_argument("--out", type=Path, default=Path("bench-out/nat"))
    parser.add_argument("--save", metavar="NAME", help="write the result to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    if (why := missing()) is not None:
        print(f"the NAT testbed {why}", file=sys.stderr)
        return 2
    words = ["python", "-m", "tools.bench.nat", *(sys.argv[1:] if argv is None else argv)]
    settings = {"algorithm.name": "none", **({"node.client_mode": "true, behind a NAT"} if args.client_mode else {})}
    if args.relay:
        settings["relay.enabled"] = "true on the bootstrap node"
    with capture(words, settings=settings, runs=1) as provenance:
        nodes, punches, extra = run(args.out, args.seconds, args.client_mode, args.relay, args.flush)
    data = {
        "seconds": args.seconds,
        "client_mode": args.client_mode,
        "relay": args.relay,
        "nodes": nodes,
        "punches": punches,
        "extra": extra,
    }
    print(render({"data": data}))
    if args.save:
        print(f"saved {save(args.save, 'tools.bench.nat', provenance, data)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
