"""What attacks cost a daemon (issue #14): two real daemons as processes, a flood from a third
(tools/attack.py), and the target's CPU, RSS and honest round-trip time, before, during and
after, all measured in one run.

    python -m tools.bench.attacks [--seconds 5] [--out FILE] [--save attacks]

Each attack runs against a fresh pair of daemons. CPU is the target's user + system time (the
daemon's and its ingress processes', which take the attack's bytes) over the attack's duration,
as a fraction of one core, next to the same measured while idle; RSS is theirs too.
With two cores or more the attacker runs on a core of its own and the daemons on the others, as
if it flooded from another machine: otherwise the honest RTT would also measure the attacker's
own CPU (a full-rate flood keeps a core busy) taken from the daemons. `--save NAME` writes the
rows as result NAME (tools/bench/results.py) for BENCHMARKS.md to draw the table from.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from p2pnode.memory import resident_bytes
from testnet.launch.cluster import Cluster, NodeSpec

from .results import capture, save

__all__ = ["ATTACKS", "run_attack", "main"]

# name -> tools.attack arguments (the target is added; over CURVE, as the testnet runs, unless
# the name says plaintext: the unfinished multipart is spoken in plain ZMTP).
ATTACKS = {
    "garbage, full rate, ≤ 64 KiB": ["--kind", "garbage"],
    "garbage, full rate, ≤ 10 MiB": ["--kind", "garbage", "--connections", "4", "--sizes", "200", "65536", "10485760"],
    "signed strangers, 10k/s, 50 connections": ["--kind", "strangers", "--connections", "50", "--rate", "10000"],
    "signed strangers, 10k/s, 50 connections (plaintext)": [
        "--kind",
        "strangers",
        "--connections",
        "50",
        "--rate",
        "10000",
    ],
    "multipart never finished, 200 MB (plaintext)": ["--kind", "unfinished", "--bytes", str(200 << 20)],
}
PLAINTEXT = "(plaintext)"
# Every daemon's settings that differ from a user's defaults (testnet/launch/cluster.py's caps for a
# testnet on one host; pings fast enough for an RTT every sample); CURVE, on in a testnet and off
# by default, is in each row.
FAST_PINGS = {"ping_interval_s": 0.2, "peer_timeout_s": 2.0}
SETTINGS = {
    **{f"discovery.{key}": value for key, value in FAST_PINGS.items()},
    "security.max_connections_per_address": 64,
}
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _family(pid: int) -> list[int]:
    """A daemon and its descendants: its fork server and the ingress processes that forks, where
    libzmq reads and holds what arrives (p2pnode/wire/inbound/); a daemon's cost is theirs too."""
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):  # any thread may have started one (trio: a worker)
        try:
            children += (task / "children").read_text().split()
        except OSError:
            pass
    return [pid, *(member for child in children for member in _family(int(child)))]


def _cpu_s(pid: int) -> float:
    total = 0.0
    for member in _family(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # an ingress process that just ended
        total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime + stime
    return total


def _rss_mb(pid: int) -> float:
    return sum(resident_bytes(member) for member in _family(pid)) / 1e6


class _Watch:
    """Samples the target's RTT to its honest peer, and its RSS, while something runs."""

    def __init__(self, cluster: Cluster, target: NodeSpec) -> None:
        self.cluster, self.target = cluster, target
        self.rtts: list[float] = []
        self.rss: list[float] = []

    def sample(self) -> None:
        status = self.cluster.status(self.target, timeout=5.0)
        if status and status["peers"] and status["peers"][0]["rtt_ms"] is not None:
            self.rtts.append(status["peers"][0]["rtt_ms"])
        self.rss.append(_rss_mb(self.target.process.pid))

    def during(self, process: subprocess.Popen | None, seconds: float) -> float:
        """Sample until `process` ends (or for `seconds`); returns the target's CPU seconds used."""
        pid = self.target.process.pid
        started_cpu, until = _cpu_s(pid), time.monotonic() + seconds
        while (process.poll() is None) if process else time.monotonic() < until:
            self.sample()
            time.sleep(0.25)
        return _cpu_s(pid) - started_cpu


def run_attack(name: str, args: list[str], seconds: float) -> dict:
    # The launcher's connection caps fit a testnet on one host; 50 attacking connections too.
    plaintext = {"security": {"curve": False, "max_connections_per_address": 64}} if PLAINTEXT in name else None
    with (
        tempfile.TemporaryDirectory() as root,
        Cluster.prepare(Path(root), 2, discovery=FAST_PINGS, extra=plaintext) as cluster,
    ):
        cluster.start_all()
        daemons_cpus, attacker_cpus = _split_cpus()
        for spec in cluster.specs:
            os.sched_setaffinity(spec.process.pid, daemons_cpus)
        target = cluster.specs[0]  # node 1, its only peer, is the honest one
        deadline = time.monotonic() + 30
        while not (cluster.status(target) or {}).get("peers") and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # a few pings for an RTT
        idle = _Watch(cluster, target)
        idle_cpu = idle.during(None, seconds)
        rss_before = _rss_mb(target.process.pid)
        before = cluster.status(target)["traffic"]
        command = [sys.executable, "-m", "tools.attack", "--target", target.address, "--seconds", str(seconds)]
        command += ["--network", target.settings["node"]["network"]]
        if not plaintext:
            command += ["--target-key", target.public_key.hex()]
        started = time.monotonic()
        attack = subprocess.Popen(
            [*command, *args],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, attacker_cpus),
        )
        under = _Watch(cluster, target)
        attack_cpu = under.during(attack, seconds)
        took = time.monotonic() - started
        result = json.loads(attack.communicate()[0].strip().splitlines()[-1])
        time.sleep(3.0)  # the node drains its queue and gives memory back
        after = cluster.status(target)
        counted = _taken_in(after["traffic"]) - _taken_in(before)
        return {
            "attack": name,
            "curve": target.settings["security"]["curve"],
            "sent": result["sent"],
            "blocked": result.get("blocked", 0),  # sends that waited a second: the target held back
            "counted": counted,
            "rejections": after["traffic"]["rejections"],
            "evicted": {k: v for k, v in after["membership"].items() if k.startswith("evicted")},
            "connections": {
                k: v - before.get("connections", {}).get(k, 0)
                for k, v in after["traffic"].get("connections", {}).items()
            },
            "cpu_idle": idle_cpu / seconds,
            "cpu_attack": attack_cpu / took,
            "rtt_idle_ms": statistics.median(idle.rtts) if idle.rtts else None,
            "rtt_attack_ms": statistics.median(under.rtts) if under.rtts else None,
            "rtt_attack_max_ms": max(under.rtts, default=None),
            "rss_before_mb": rss_before,
            "rss_peak_mb": max(under.rss, default=rss_before),
            "rss_after_mb": _rss_mb(target.process.pid),
        }


def _split_cpus() -> tuple[set[int], set[int]]:
    """(the daemons' CPUs, the attacker's): the last CPU for the attacker where there are two or more."""
    cpus = sorted(os.sched_getaffinity(0))
    return (set(cpus[:-1]), {cpus[-1]}) if len(cpus) > 1 else (set(cpus), set(cpus))


def _taken_in(traffic: dict) -> int:
    refused = sum(traffic["rejections"].values())
    return refused + sum(entry["messages_in"] for entry in traffic["by_type"].values())


def format_table(rows: list[dict]) -> str:
    lines = [
        "| attack | frames sent | sends held back (1 s each) | counted by the target "
        "| connections cut (ZeroMQ: size, shed, handshake) "
        "| CPU idle → attack (cores) | honest RTT idle → attack (median, ms) | RSS before → peak → after (MB) "
        "| honest peers evicted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rtt = f"{r['rtt_idle_ms']:.2f} → {r['rtt_attack_ms']:.2f} (max {r['rtt_attack_max_ms']:.2f})"
        rss = f"{r['rss_before_mb']:.0f} → {r['rss_peak_mb']:.0f} → {r['rss_after_mb']:.0f}"
        c = r["connections"]
        cut = f"{c.get('disconnected', 0)} ({c.get('shed_buffered', 0)} shed, {c.get('handshake_failed', 0)} handshake)"
        lines.append(
            f"| {r['attack']} | {r['sent']} | {r['blocked']} | {r['counted']} | {cut} "
            f"| {r['cpu_idle']:.3f} → {r['cpu_attack']:.3f} "
            f"| {rtt} | {rss} | {sum(r['evicted'].values())} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.attacks", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--attacks", nargs="+", choices=list(ATTACKS), default=list(ATTACKS))
    parser.add_argument("--save", metavar="NAME", help="write the rows to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    rows = []
    words = ["python", "-m", "tools.bench.attacks", *(sys.argv[1:] if argv is None else argv)]
    with capture(words, settings=SETTINGS, runs=len(args.attacks)) as provenance:
        for name in args.attacks:
            rows.append(run_attack(name, ATTACKS[name], args.seconds))
            print(json.dumps(rows[-1]), flush=True)
    print(format_table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.attacks', provenance, {'seconds': args.seconds, 'rows': rows})}")
    return 0


def render(result: dict) -> str:
    """The table, then what each attack was given."""
    data = result["data"]
    return (
        f"{format_table(data['rows'])}\n\nEach attack {data['seconds']:g} s against a fresh pair of daemons, "
        f"after {data['seconds']:g} s idle; CURVE on in every row but those marked plaintext."
    )


if __name__ == "__main__":
    sys.exit(main())
