"""Issue #46's "done when", in one run of the NAT testbed: a bootstrap node that relays and does
not learn, two public nodes, two behind one port-restricted home router, two behind one symmetric
NAT and two behind a home router behind a carrier-grade NAT; the eight learn MAPL-Dual on mnist5k
Scenario 1, beside the same eight all public (the control).

    python -m tools.bench.nat_fleet [--rounds 40] [--seed 10] [--flush-after 60] [--sybil-after 20]
        [--sybil-keys 1000] [--sybil-seconds 60] [--out bench-out/nat-fleet] [--save NAME]

The nodes behind NATs run in client mode; the relay (`[relay].enabled`, every other setting its
default) is every learner's bootstrap entry, as a fleet's first node would be. While they learn,
from beside the launcher: the relay's memory (the daemon and its inbound processes) every second;
`--sybil-after` s in, a stranger on a /24 of its own runs tools/sybil.py at the relay for
`--sybil-seconds`, each of `--sybil-keys` keys completing admission and asking for a place (the
relay's holders are read each second meanwhile); `--flush-after` s in, every router forgets its
connections (`conntrack -F`). When every learner has finished, before the daemons stop: each
node's status (how it reaches each peer) and `p2pnode doctor`. The control runs the same eight
with the relay as their bootstrap, all on the internet bridge, with neither flush nor stranger.

Each of the issue's conditions is judged in `checks` (`render` draws them): every node admitted;
no payload missing outside the flush's rounds; every pair with a public side direct; accuracy
within 1 point of the control and within-cluster mass >= 0.95; delivery resumed within 30 s of the
flush and `--check` passed; the relay's memory <= 150 MB; its senders' RELAY bytes <= 1.1x the
payload bytes inside; the stranger held no more than its subnet's places and no honest client
lost one; `doctor` naming each node's reachability as its site is. It exits 1 if a run did not finish
(the table says which conditions are met). Needs root, `ip netns`, `iptables` and `conntrack`;
it says what is missing otherwise and exits 2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from .nat import LAYOUT as NAT_LAYOUT
from .nat import PORT, lab_hosts
from .nat_learning import learned
from .results import capture, save

__all__ = ["main", "render"]

# Issue #46's testbed: tools.bench.nat's less the firewall host.
LAYOUT = tuple(entry for entry in NAT_LAYOUT if entry[1] != "firewall")  # the bootstrap relays
WATCH_EVERY_S = 1.0
# The bounds.
ACCURACY_WITHIN = 0.01
MIN_MASS = 0.95
RESUME_WITHIN_S = 30.0
MAX_RELAY_MB = 150.0
MAX_RELAYED_RATIO = 1.1
ROOT = Path(__file__).resolve().parents[2]


class Watcher:
    """What the NAT run's daemons did, seen from beside the launcher while they learn (the
    learning testnet's `alongside`): see the module's docstring."""

    def __init__(self, lab, relay, stranger, flush_after: float, sybil: tuple[float, int, float]) -> None:
        self.lab, self.relay, self.stranger = lab, relay, stranger
        self.flush_after = flush_after
        self.sybil_after, self.sybil_keys, self.sybil_seconds = sybil  # from when, how many keys, for how long
        self.memory_mb: list[float] = []  # the relay's, daemon and inbound processes, each second
        self.seen: dict[tuple[int, int], float] = {}  # (learner, round) -> when it first showed done
        self.flushed_at: float | None = None
        self.honest_holders: list[int] = []  # honest clients holding a place, each second of the campaign
        self.stranger_holders: list[int] = []
        self.sybil: subprocess.Popen | None = None
        self.finals: list[dict | None] = []
        self.doctor: list[dict] = []
        self.ids: list[str] = []  # the relay's, then the learners'
        self.sybil_counts: dict = {}

    @contextmanager
    def watching(self, cluster):
        stop = threading.Event()
        thread = threading.Thread(target=self._loop, args=(cluster, stop), daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self._finish(cluster)

    def _loop(self, cluster, stop: threading.Event) -> None:
        from testnet.reporting.overlay import ingress_rss_mb

        started = time.monotonic()
        learners = {spec.node_id for spec in cluster.specs}
        while not stop.wait(WATCH_EVERY_S):
            elapsed = time.monotonic() - started
            relay = self.relay.statuses()[0] or {}
            if relay.get("rss_mb") is not None:
                self.memory_mb.append(relay["rss_mb"] + (ingress_rss_mb(relay) or 0.0))
            for index, status in enumerate(cluster.statuses()):
                completed = ((status or {}).get("learning") or {}).get("completed") or 0
                for done in range(1, completed + 1):
                    self.seen.setdefault((index, done), elapsed)
            if self.flushed_at is None and elapsed >= self.flush_after:
                self.lab.flush()
                self.flushed_at = elapsed
            if self.sybil is None and elapsed >= self.sybil_after:
                self.sybil = self._start_sybil()
            if self.sybil is not None and self.sybil.poll() is None:
                holders = set((relay.get("relay") or {}).get("holders", []))
                self.honest_holders.append(len(holders & learners))
                self.stranger_holders.append(len(holders - learners))

    def _start_sybil(self) -> subprocess.Popen:
        spec = self.relay.specs[0]
        host, port = spec.address.removeprefix("tcp://").rsplit(":", 1)
        command = [
            *self.stranger.prefix,
            # the stranger's own machine, in the world: here it shares the fleet's two cores, so it
            # takes what they leave (at normal priority its loop over 1,000 sockets competed with
            # the daemons it attacks, and a round's payloads came late the second it started)
            *("nice", "-n", "19"),
            sys.executable,
            "-m",
            "tools.sybil",
            *("--target", f"tcp://{host}:{port}", "--target-key", spec.public_key.hex()),
            *("--keys", str(self.sybil_keys), "--seconds", f"{self.sybil_seconds:g}", "--network", "testnet"),
        ]
        return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def _finish(self, cluster) -> None:
        """Every node's last status and `doctor`, the daemons still up; the stranger's counts."""
        specs = [self.relay.specs[0], *cluster.specs]
        self.ids = [spec.node_id for spec in specs]
        self.finals = [self.relay.statuses()[0], *cluster.statuses()]
        for spec in specs:
            config = str(spec.config_path)
            said = subprocess.run(
                [sys.executable, "-m", "p2pnode_cli", "doctor", "--config", config],
                capture_output=True,
                text=True,
                timeout=30,
                cwd=ROOT,
            )
            self.doctor.append({"exit_code": said.returncode, "lines": said.stdout.splitlines()})
        if self.sybil is not None:
            out, _ = self.sybil.communicate(timeout=self.sybil_seconds + 60)
            self.sybil_counts = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}


def run(out: Path, rounds: int, seed: int, natted: bool, flush_after: float, sybil: tuple[float, int, float]) -> dict:
    """One run on a fresh testbed: the relay started first, then the eight learners with it as
    their bootstrap; NATed (client mode behind the NATs, watched) or all public."""
    from algorithms.data.setup import ScenarioSpec
    from testnet.launch.learning import DISCOVERY, run_learning_testnet
    from testnet.launch.nat import STRANGER_PREFIX, NatLab, NatPlacement, cluster_on
    from testnet.simulation.spec import SimulationSpec

    spec = SimulationSpec(
        algorithm="mapl-dual",
        data=ScenarioSpec(
            dataset="mnist5k", scenario="1", nodes=len(LAYOUT) - 1, seed=seed, samples_per_class=10, test_per_class=80
        ),
        rounds=rounds,
    )
    shutil.rmtree(out, ignore_errors=True)  # a daemon finding a checkpoint there would resume from it
    with NatLab() as lab:
        hosts = lab_hosts(lab, natted, LAYOUT)
        stranger = lab.add("stranger", "public", prefix=STRANGER_PREFIX) if natted else None
        relay = cluster_on(hosts[:1], out / "relay", port=PORT, discovery=DISCOVERY, relay=True)
        with relay:
            relay.start(relay.specs[0])
            watcher = Watcher(lab, relay, stranger, flush_after, sybil) if natted else None
            code, report = run_learning_testnet(
                spec,
                out / "learners",
                placement=NatPlacement(hosts[1:], PORT, client_mode=natted, relay=natted, relaying=None),
                settings={"discovery": {"bootstrap": [relay.bootstrap]}},
                alongside=watcher.watching if watcher else None,
            )
    result = {
        "run": "behind NATs, client mode, the relay" if natted else "all public (control)",
        "sites": [host.site for host in hosts],
        **learned(code, report),
    }
    if watcher is not None:
        result["watched"] = _watched(watcher, report, [host.site for host in hosts])
    return result


def _watched(watcher: Watcher, report: dict, sites: list[str]) -> dict:
    """The NAT run's figures, as the watcher saw them and the daemons counted them."""
    learners = watcher.finals[1:]
    histories = [((status or {}).get("learning") or {}).get("history", []) for status in learners]
    missing = {(i, entry["round"]): len(entry["missing"]) for i, history in enumerate(histories) for entry in history}
    names = dict(zip(watcher.ids, (host for host, _, _ in LAYOUT), strict=True))
    late = {  # whose payloads each learner missed, round by round: a sender's, or a link's
        f"{LAYOUT[i + 1][0]} round {entry['round']}": sorted(names.get(peer, peer) for peer in entry["missing"])
        for i, history in enumerate(histories)
        for entry in history
        if entry["missing"]
    }
    resumed_s, flush_rounds = _resumed(watcher, missing, len(learners))
    traffics = [(status or {}).get("traffic") or {} for status in watcher.finals]  # the relay first
    counts = [each or {} for each in report["processes"]["relay"]]
    total = {
        key: sum(c.get(key, 0) for c in counts)
        for key in ("relay_out_learning_bytes", "relay_out_learning_payload_bytes", "relay_out_learning_frame_bytes")
    }
    site_of = dict(zip(watcher.ids, sites, strict=True))
    return {
        "relay_memory_mb": {"peak": max(watcher.memory_mb, default=None), "last": (watcher.memory_mb or [None])[-1]},
        "relay_counts": ((watcher.finals[0] or {}).get("relay") or {}).get("counts", {}),
        # frames each node (the relay first) could not hand to a connection (queue full or not
        # connected), by type, and what each refused: where a late payload may have gone
        "send_dropped": [traffic.get("send_dropped", {}) for traffic in traffics],
        "rejections": [traffic.get("rejections", {}) for traffic in traffics],
        # ... and what an inbound process could not send over a connection a client dialled
        # (sends.py: gone, queue full, over the bytes held), the relay's RELAYED to clients among them
        "routed_unsent": [
            {k: v for k, v in traffic.get("connections", {}).items() if k.startswith("routed_send")}
            for traffic in traffics
        ],
        "relayed": total,
        "flushed_at_s": watcher.flushed_at,
        "resumed_s": resumed_s,
        "missing_in_flush_rounds": sum(n for key, n in missing.items() if key in flush_rounds),
        "missing_from": late,
        "missing_elsewhere": {
            f"node {i + 1} round {r}": n for (i, r), n in missing.items() if n and (i, r) not in flush_rounds
        },
        "peers": [sorted(site_of.get(p["node_id"], "?") for p in (s or {}).get("peers", [])) for s in watcher.finals],
        "relay_peers": sorted(p["node_id"] for p in (watcher.finals[0] or {}).get("peers", [])),
        "ids": watcher.ids,
        "routes": [{p["node_id"]: p.get("route") for p in (s or {}).get("peers", [])} for s in watcher.finals],
        "doctor": watcher.doctor,
        "sybil": watcher.sybil_counts,
        "honest_holders_min": min(watcher.honest_holders, default=None),
        "stranger_holders_max": max(watcher.stranger_holders, default=None),
    }


def _resumed(watcher: Watcher, missing: dict, learners: int) -> tuple[float | None, set[tuple[int, int]]]:
    """How long after the flush every learner had finished a round begun after it with no payload
    missing, and the rounds each ran from the flush until then (where payloads may go missing)."""
    if watcher.flushed_at is None:
        return None, set()
    seen, flushed, latest, rounds = watcher.seen, watcher.flushed_at, 0.0, set()
    for i in range(learners):
        done = sorted(r for (node, r) in seen if node == i)
        after = [r for r in done if seen[(i, r)] >= flushed]
        clean = next((r for r in after if seen.get((i, r - 1), 0.0) >= flushed and not missing.get((i, r))), None)
        if clean is None:
            return None, {(i, r) for r in after}
        rounds |= {(i, r) for r in after if r < clean}
        latest = max(latest, seen[(i, clean)])
    return round(latest - flushed, 1), rounds


def judge(nat: dict, control: dict) -> list[dict]:
    """Each of the issue's conditions: what it asks, what the NAT run measured, met or not."""
    return [*_reach_checks(nat), *_learning_checks(nat, control), *_relay_checks(nat)]


def _reach_checks(nat: dict) -> list[dict]:
    """Who is admitted, who talks directly, and what doctor says of each node."""
    watched, sites = nat["watched"], nat["sites"]
    ids, routes = watched["ids"], watched["routes"]
    site_of = dict(zip(ids, sites, strict=True))
    admitted = set(ids[1:]) <= set(watched["relay_peers"]) and all(
        set(ids[1:]) - {me} <= set(peers) for me, peers in zip(ids[1:], routes[1:], strict=True)
    )
    relayed_public = [
        f"{site_of[me]}→{site_of.get(peer, '?')}"
        for me, peers in zip(ids, routes, strict=True)
        for peer, route in peers.items()
        if (route or "").startswith("relay:") and "public" in (site_of[me], site_of.get(peer))
    ]
    doctor = [_doctor_state(said["lines"]) for said in watched["doctor"]]
    said = "; ".join(
        f"{site} ({len(says)}): {', '.join(sorted(set(says), key=str))}"
        for site, says in _by_site(sites, doctor).items()
    )
    return [
        _check(
            "every node admitted", f"the relay and every learner have every learner as a peer: {admitted}", admitted
        ),
        _check(
            "every pair with a public side talks directly",
            f"through the relay: {relayed_public or 'none'}",
            not relayed_public,
        ),
        _check(
            "doctor names every node's reachability correctly",
            f"{said} (expected: public where public, client behind a NAT; exit codes {_exit_codes(watched['doctor'])})",
            doctor == ["public" if site == "public" else "client" for site in sites],
        ),
    ]


def _learning_checks(nat: dict, control: dict) -> list[dict]:
    """Payloads, accuracy against the control, and delivery after the flush."""
    watched, gap = nat["watched"], nat["accuracy"] - control["accuracy"]
    check = nat["check"]
    return [
        _check(
            "every edge of the learned graph delivers its payloads",
            f"{nat['missing_payloads']} payloads missing, {watched['missing_in_flush_rounds']} in the flush's rounds, "
            f"elsewhere: {watched['missing_elsewhere'] or 'none'}",
            not watched["missing_elsewhere"],
        ),
        _check(
            "accuracy within 1 point of the all-public control, within-cluster mass >= 0.95",
            f"{100 * nat['accuracy']:.1f} % vs {100 * control['accuracy']:.1f} % ({100 * gap:+.1f}), "
            f"mass {nat['within_cluster_mass']:.3f}",
            abs(gap) <= ACCURACY_WITHIN and nat["within_cluster_mass"] >= MIN_MASS,
        ),
        _check(
            "after conntrack -F on every router, delivery resumes within 30 s and --check passes",
            f"flushed {watched['flushed_at_s'] or 0:.0f} s in, delivery resumed {watched['resumed_s']} s after; "
            "--check " + ("passed" if check["passed"] else "failed: " + "; ".join(check["failures"])),
            watched["resumed_s"] is not None and watched["resumed_s"] <= RESUME_WITHIN_S and check["passed"],
        ),
    ]


def _relay_checks(nat: dict) -> list[dict]:
    """The relay's memory, what its hop costs, and the stranger's share."""
    from p2pnode.relay.settings import RelaySettings

    watched = nat["watched"]
    relayed, peak = watched["relayed"], watched["relay_memory_mb"]["peak"]
    payload = relayed["relay_out_learning_payload_bytes"]
    ratio = relayed["relay_out_learning_bytes"] / payload if payload else None
    sybil, per_subnet = watched["sybil"], RelaySettings().max_reservations_per_subnet
    clients = sum(site != "public" for site in nat["sites"])
    return [
        _check(
            "the relay's RSS <= 150 MB",
            f"at most {peak:.0f} MB (the daemon and its inbound processes)",
            peak is not None and peak <= MAX_RELAY_MB,
        ),
        _check(
            "relayed bytes <= 1.1x the payload bytes",
            f"its senders' RELAY bytes {ratio:.3f}x the tensors inside" if ratio else "nothing relayed",
            ratio is not None and ratio <= MAX_RELAYED_RATIO,
        ),
        _check(
            "a stranger that tries 1,000 reservations gets its bounded share and no more",
            f"{sybil.get('tried', 0)} keys, {sybil.get('answered', 0)} admitted, "
            f"{sybil.get('granted', 0)} places granted (at most {watched['stranger_holders_max']} held at once; "
            f"its subnet's bound {per_subnet}); honest clients holding a place throughout: at least "
            f"{watched['honest_holders_min']} of {clients}",
            (watched["stranger_holders_max"] or 0) <= per_subnet and watched["honest_holders_min"] == clients,
        ),
    ]


def _by_site(sites: list[str], values: list) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for site, value in zip(sites, values, strict=True):
        grouped.setdefault(site, []).append(value)
    return grouped


def _exit_codes(said: list[dict]) -> str:
    return ", ".join(sorted({str(each["exit_code"]) for each in said}))


def _check(what: str, measured: str, passed: bool) -> dict:
    return {"what": what, "measured": measured, "passed": bool(passed)}


def _doctor_state(lines: list[str]) -> str | None:
    """The state on `doctor`'s reachability line ("reachability: public (...)")."""
    said = next((line for line in lines if line.startswith("reachability: ")), "")
    return said.removeprefix("reachability: ").split(" ", 1)[0] or None


def render(result: dict) -> str:
    data = result["data"]
    rows = [
        "| run | accuracy, % (mean over learners) | within-cluster mass | payloads missing "
        "| rounds completed (min) | wall, s |",
        "|---|---|---|---|---|---|",
    ]
    for run in data["runs"]:
        rows.append(
            f"| {run['run']} | {100 * run['accuracy']:.1f} | {run['within_cluster_mass']:.3f} "
            f"| {run['missing_payloads']} | {min(run['rounds_completed_per_node'])} | {run['wall_s']:.0f} |"
        )
    rows += ["", "| the issue asks | measured | met |", "|---|---|---|"]
    # judged anew from the runs' figures: a result file saved before a wording changed reads the same
    checks = judge(*data["runs"])
    rows += [f"| {c['what']} | {c['measured']} | {'yes' if c['passed'] else '**no**'} |" for c in checks]
    return "\n".join(rows) + (
        f"\n\nmnist5k Scenario 1, 8 MAPL-Dual daemons and the relay, {data['rounds']} rounds, seed {data['seed']}; "
        f"conntrack -F at {data['flush_after']:g} s, the stranger's {data['sybil_keys']} keys from "
        f"{data['sybil_after']:g} s for {data.get('sybil_seconds', 60):g} s.\n"
    )


def main(argv: list[str] | None = None) -> int:
    from testnet.launch.nat import missing

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--flush-after", type=float, default=60.0, metavar="S")
    parser.add_argument("--sybil-after", type=float, default=20.0, metavar="S")
    parser.add_argument("--sybil-keys", type=int, default=1000)
    parser.add_argument("--sybil-seconds", type=float, default=60.0, metavar="S")
    parser.add_argument("--out", type=Path, default=Path("bench-out/nat-fleet"))
    parser.add_argument("--save", metavar="NAME", help="write the result to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    if (why := missing()) is not None:
        print(f"the NAT testbed {why}", file=sys.stderr)
        return 2
    words = ["python", "-m", "tools.bench.nat_fleet", *(sys.argv[1:] if argv is None else argv)]
    settings = {
        "node.client_mode": "true, behind a NAT (NAT run)",
        "relay.enabled": "true on the bootstrap node, which does not learn",
        "conntrack -F": f"on every router {args.flush_after:g} s into the NAT run",
    }
    sybil = (args.sybil_after, args.sybil_keys, args.sybil_seconds)
    with capture(words, settings=settings, seeds=[args.seed], threads=1, runs=2) as provenance:
        runs = [
            run(args.out / name, args.rounds, args.seed, natted, args.flush_after, sybil)
            for name, natted in (("nat", True), ("control", False))
        ]
    (args.out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")  # judged below, kept if that fails
    data = {
        "rounds": args.rounds,
        "seed": args.seed,
        "flush_after": args.flush_after,
        "sybil_after": args.sybil_after,
        "sybil_keys": args.sybil_keys,
        "sybil_seconds": args.sybil_seconds,
        "runs": runs,  # render judges them (`judge`): the checks are derived, not stored
    }
    print(render({"data": data}))
    if args.save:
        print(f"saved {save(args.save, 'tools.bench.nat_fleet', provenance, data)}", file=sys.stderr)
    return 0 if all(run["exit_code"] == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
