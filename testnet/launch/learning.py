"""`p2pnode testnet --algorithm A`: N real daemons learn over TCP; the report comes from the
same builder as `p2pnode simulate`'s (testnet/reporting/report.py), fed with the round records each daemon
keeps in its `status`.

Each daemon gets node index i of the same partition and seed as the simulator's node i, so the
two can be compared run for run: with `--data`, its shard of the same files (`[data].dataset =
"path"`); with `--data-per-node`, the i-th entry as its own data, numbered i (its model's seed).
`comm.*` counts learning frames as the daemons' transports sent them; discovery and keep-alives
are reported apart, under `comm.discovery`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.data.own_data import OwnDataSpec
from algorithms.data.setup import ScenarioSpec, load_scenario
from algorithms.models.device import placement as device_placement
from p2pnode.discovery.settings import DiscoverySettings
from p2pnode.learning.rounds import RoundRecord, Schedule
from protocol import LEARNING_TYPES

from ..reporting.overlay import ingress_restarts, ingress_rss_mb
from ..reporting.provenance import provenance
from ..reporting.report import CheckThresholds, Truth, assemble, judge, run_header
from ..simulation.spec import SimulationSpec
from .churn import ChurnSpec, RestartPolicy, Supervisor
from .cluster import Cluster
from .placement import Placement

__all__ = [
    "run_learning_testnet",
    "testnet_report",
    "node_settings",
    "data_table",
    "own_data_settings",
    "default_timeout_s",
    "DISCOVERY",
]

# Daemons of one machine: quick failure detection, so a killed node stops being waited for.
DISCOVERY = {"ping_interval_s": 0.5, "peer_timeout_s": 3.0, "exchange_interval_s": 0.5, "dial_retry_max_s": 1.0}

# Daemons per core that step without waiting for CPU, about (a MAPL local step is ~0.2 s of one
# core; the round deadline absorbs the rest). Past that the rounds slow down in proportion:
# 20 MAPL daemons on 2 cores took 9 s a round, not 5, and 150 s to load, and ran out of the
# fixed 180 s + rounds × (deadline + 5 s) before their last rounds (issue #16).
DAEMONS_PER_CORE = 5
START_S_PER_DAEMON_PER_CORE = 5.0  # loading torch, the data and the model, sharing the cores


def default_timeout_s(
    nodes: int, rounds: int, round_deadline_s: float, cores: int | None = None, slowest: float = 1.0
) -> float:
    """`--timeout`'s default: 180 s + rounds × (deadline + 5 s × the largest `[node].slowdown`),
    stretched for more daemons than this machine's cores can step at once (`cores`: os.cpu_count())."""
    cores = cores or os.cpu_count() or 1
    crowding = max(1.0, nodes / (DAEMONS_PER_CORE * cores))
    per_round = round_deadline_s + 5 * slowest
    return 180 + START_S_PER_DAEMON_PER_CORE * nodes / cores + rounds * per_round * crowding


def node_settings(
    spec: SimulationSpec, index: int, backbone: str, round_deadline_s: float, target: int | None = None
) -> dict[str, Any]:
    """Node `index`'s config sections; `target` is the peers it seeks (its `active_view`, at
    most `max_peers`; default: the daemon's)."""
    if target is None:
        target = DiscoverySettings().active_view
    slowdown = spec.slowdowns()[index]
    return {
        "data": data_table(spec.data, index),
        "model": {
            "backbone": backbone,
            "threads": 1,
            "device": spec.device,
            "mixed_precision": spec.mixed_precision,
            **_backbone_files(spec),
        },
        "algorithm": {
            "name": spec.algorithm,
            "rounds": spec.rounds,
            "start_peers": min(spec.nodes - 1, target),  # it seeks no more
            "start_timeout_s": 120.0,
            "round_deadline_s": round_deadline_s,
            "settings": dict(spec.overrides),
            # the run's schedule (`[algorithm].schedule` and what goes with it), where not the default
            **{
                name: value
                for name, value in asdict(daemon_schedule(spec, round_deadline_s)).items()
                if value != getattr(Schedule(), name)
            },
        },
        "log": {"format": "json"},
        # `--pace` and `--slow`: this daemon emulates a slower device (p2pnode/learning/driver.py, `paced`)
        **({"node": {"slowdown": slowdown}} if slowdown > 1 else {}),
    }


def data_table(scenario: ScenarioSpec, index: int) -> dict[str, Any]:
    """Daemon `index`'s `[data]`: the run's data as `DataSettings.scenario_spec` reads it back
    (p2pnode/learning/settings.py), or with `per_node` the index-th node's own data, numbered
    `index` (its model's seed), so the daemon is dealt what simulated node `index` is."""
    if scenario.per_node:
        return {**own_data_settings(scenario.per_node[index]), "node_index": index}
    data = {
        "dataset": scenario.dataset,
        "scenario": scenario.scenario,
        "nodes": scenario.nodes,
        "node_index": index,
        "clusters": scenario.clusters or 0,
        "samples_per_class": scenario.samples_per_class,
        "test_per_class": scenario.test_per_class,
        "seed": scenario.seed,
    }
    if scenario.own is not None:
        data.update(own_data_settings(scenario.own))
    elif scenario.root:
        data["root"] = str(Path(scenario.root).resolve())
    return data


def _backbone_files(spec: SimulationSpec) -> dict[str, str]:
    """`[model].code` and `weights` of every daemon, absolute: its config lives elsewhere."""
    files = {"code": spec.backbone_files.code, "weights": spec.backbone_files.weights}
    return {name: str(Path(path).resolve()) for name, path in files.items() if path is not None}


def daemon_schedule(spec: SimulationSpec, round_deadline_s: float) -> Schedule:
    """The schedule a testnet daemon runs: the spec's, with its async gather stretched by `--pace`
    as the daemon's computations are (a paced testnet runs in slow motion: a gather left at its
    length would catch what a pace-th of it catches at full speed), within the round deadline."""
    schedule = spec.schedule
    if spec.pace == 1 or not schedule.asynchronous:
        return schedule
    return replace(schedule, async_gather_s=min(round_deadline_s, schedule.async_gather_s * spec.pace))


def own_data_settings(own: OwnDataSpec) -> dict[str, Any]:
    """The `[data]` settings that describe `own` to a daemon (docs/config.md), absolute paths."""
    data = {
        "path": str(own.path.resolve()),
        "class_names": list(own.class_names),
        "max_memory_mb": own.max_memory_mb,
        "seed": own.seed,
    }
    if not own.is_npz:  # a .npz's images keep their shape
        data.update(image_size=own.image_size, channels=own.channels)
    if own.test_fraction is not None:
        data["test_fraction"] = own.test_fraction
    if own.skip_damaged:  # as the rehearsed config says (it failed on a damaged image otherwise)
        data["skip_damaged"] = True
    return data


def run_learning_testnet(
    spec: SimulationSpec,
    out: Path,
    *,
    round_deadline_s: float = 5.0,
    timeout_s: float | None = None,
    check: CheckThresholds | None = None,
    churn: ChurnSpec | None = None,
    keep_going: bool = False,
    restart: RestartPolicy | None = None,
    poll_s: float = 0.5,
    settings: dict[str, dict] | None = None,
    progress=None,
    placement: Placement | None = None,
    barrage: bool = False,
    alongside: Callable[[Cluster], AbstractContextManager] | None = None,
) -> tuple[int, dict[str, Any]]:
    """Returns (exit code, report): 0 if every node finished (and `check` passed, if given),
    1 if not, 130 if interrupted. `churn` stops and restarts daemons while they learn (not
    those that have finished), `restart` restarts those that die (testnet/launch/churn.py): they
    resume from their checkpoints. `settings` adds config settings to every node's, by section
    (e.g. `{"discovery": {"active_view": 8}}`). `placement` runs the daemons (default: here).
    `spec.poisoners` run as Byzantine daemons (testnet/launch/byzantine.py) with `spec.attack`, and
    with `barrage` also each round's malformed and out-of-round frames. `alongside(cluster)`: a
    context held while the daemons run (an attack on them, say)."""
    # The daemons resolve the device as this launcher does; provenance names the engine, as a simulation's.
    device, mixed_precision = device_placement(spec.device, spec.mixed_precision)
    progress = progress or sys.stderr  # the stream of the moment, not the one at import (tests swap it)
    made = {**provenance(spec.seed, str(device)), "engine": {"kind": placement.engine if placement else "local"}}
    out.mkdir(parents=True, exist_ok=True)
    backbones = spec.node_backbones()
    _, partition = load_scenario(spec.data)
    cluster = _prepared(spec, out, backbones, round_deadline_s, settings or {}, placement, barrage)
    if timeout_s is None:
        timeout_s = default_timeout_s(spec.nodes, spec.rounds, round_deadline_s, slowest=max(spec.slowdowns()))
    cluster.place()  # before t = 0: a Ray cluster starts its launchers here
    started = time.monotonic()
    supervisor = Supervisor(
        cluster, churn, seed=spec.seed, keep_going=keep_going, started=started, restart=restart, progress=progress
    )
    deadline = started + timeout_s
    with cluster:
        cluster.start_all()
        with alongside(cluster) if alongside else nullcontext():
            finals, interrupted, timed_out = _watch(cluster, supervisor, spec.rounds, deadline, poll_s, progress)
        exit_codes = cluster.stop()
    ids = [node.node_id for node in cluster.specs]
    header = run_header("testnet", spec, partition, ids, backbones, spec.config_dict(), (device, mixed_precision), made)
    if header["attack"] is not None:
        header["attack"]["barrage"] = barrage
    report = testnet_report(header, partition, finals, time.monotonic() - started)
    report["processes"].update(_processes(cluster, exit_codes, supervisor), timeout_s=round(timeout_s, 1))
    report["processes"]["timed_out"] = timed_out
    if interrupted:
        code = 130
    else:
        report["check"] = _judge(report, check)
        code = 0 if report["check"]["passed"] else 1
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return code, report


def _prepared(
    spec: SimulationSpec,
    out: Path,
    backbones: list[str],
    round_deadline_s: float,
    settings: dict[str, dict],
    placement: Placement | None,
    barrage: bool,
) -> Cluster:
    """The daemons' keys and configs, the poisoners' as Byzantine daemons. Daemon i has the
    simulator's key for node i, so the two runs are of the same nodes (their ids, and the order
    each sums its neighbours' payloads in); a fleet's (`--fleet`) gets new ones, its own staying
    where they are."""
    defaults, chosen = DiscoverySettings(), settings.get("discovery", {})
    target = min(chosen.get("active_view", defaults.active_view), chosen.get("max_peers", defaults.max_peers))
    cluster = Cluster.prepare(
        out,
        spec.nodes,
        discovery=DISCOVERY,
        extra=lambda i: _merged(node_settings(spec, i, backbones[i], round_deadline_s, target), settings),
        placement=placement,
        identities=None if spec.key_files else spec.identity,
    )
    for i in spec.poisoners:
        cluster.specs[i].program = byzantine_program(spec, i, barrage)
    return cluster


def byzantine_program(spec: SimulationSpec, index: int, barrage: bool) -> tuple[str, ...]:
    """What node `index` runs as one of `spec.poisoners`: its seed is the simulator's for it."""
    attack = ("--attack", spec.attack, "--factor", repr(spec.attack_factor), "--seed", str(spec.seed * 1000 + index))
    return ("testnet.launch.byzantine", *attack, *(("--barrage",) if barrage else ()))


def _processes(cluster: Cluster, exit_codes: dict[int, int | None], supervisor: Supervisor) -> dict[str, Any]:
    """What only real daemons have, per node and per run (testnet/reporting/report.py, PROCESS_KEYS)."""
    return {
        "exit_codes": [exit_codes.get(s.index) for s in cluster.specs],
        "logs": [str(s.log_path) for s in cluster.specs],
        "engine": cluster.placement.engine,
        "addresses": [s.address for s in cluster.specs],
        **supervisor.report(),
    }


def _merged(document: dict[str, dict], settings: dict[str, dict]) -> dict[str, dict]:
    """`document` with `settings` added, section by section."""
    return {**document, **{name: {**document.get(name, {}), **table} for name, table in settings.items()}}


def _judge(report: dict[str, Any], thresholds: CheckThresholds | None) -> dict[str, Any]:
    """Without --check only that every node finished every round is judged. A run the launcher
    stopped at its timeout fails, saying so: the nodes did not stop early, we stopped them."""
    verdict = judge(report, thresholds)
    if report["processes"]["timed_out"]:
        timeout_s = report["processes"]["timeout_s"]
        verdict["failures"].append(
            f"the run reached its timeout ({timeout_s:.0f} s) before every node finished: give it more with --timeout S"
        )
        verdict["passed"] = False
    return verdict


def _watch(
    cluster: Cluster, supervisor: Supervisor, rounds: int, deadline: float, poll_s: float, progress
) -> tuple[list[dict | None], bool, bool]:
    """Poll every daemon's status until all have finished (those that exited on their own
    aside), one has exited on its own without --keep-going, or time is up; returns the last
    status each gave, whether the user interrupted, and whether time ran out."""
    finals: list[dict | None] = [None] * len(cluster.specs)
    started = supervisor.started  # the first spawn, as the churn events' times
    said_failed: set[int] = set()
    under_way: set[int] = set()  # the daemons seen past their first round, or gone down: once is enough
    try:
        last_line, last_print = "", 0.0
        while time.monotonic() < deadline:
            statuses = cluster.statuses()
            finals = [s if s is not None else f for s, f in zip(statuses, finals, strict=True)]
            elapsed = time.monotonic() - started
            line = _progress_line(statuses, rounds)
            if line != last_line or elapsed - last_print >= 10:
                print(f"[{elapsed:6.1f} s] {line}", file=progress, flush=True)
                last_line, last_print = line, elapsed
            # The supervisor sees every status, the last ones too (a daemon that came back may
            # load, resume and finish between two polls: its resume is noted all the same).
            learning = {i for i, status in enumerate(statuses) if not _done(status, rounds)}
            carry_on = supervisor.poll(statuses, eligible=learning)
            for index, status in enumerate(statuses):
                if (failure := _failed(status)) is not None and index not in said_failed:
                    said_failed.add(index)
                    print(f"node {index}: learning {failure} (its node.log has the traceback)", file=progress)
            finished = [
                _done(s, rounds) or _failed(s) is not None or supervisor.lost(node)
                for s, node in zip(statuses, cluster.specs, strict=True)
            ]
            if (all(finished) and not supervisor.busy()) or not carry_on:
                return finals, False, False
            # Churn starts once every daemon is under way: it has finished a round (so a stopped
            # one has a checkpoint to resume from), or has gone down since it started. One that
            # learned and crashed between two polls (a restart under way) must not hold the stops
            # back until it is up again, by when the others may have raced through their rounds.
            under_way.update(i for i, status in enumerate(statuses) if _learned(status))
            under_way.update(event["node"] for event in supervisor.downtimes())
            if len(under_way) == len(statuses):
                supervisor.arm()
            time.sleep(poll_s)
    except KeyboardInterrupt:
        print("interrupted: stopping every node", file=progress)
        return finals, True, False
    return finals, False, True


def _ready(status: dict | None) -> bool:
    learning = status and status.get("learning")
    return bool(learning) and bool(learning["algorithm"])


def _learned(status: dict | None) -> bool:
    return _ready(status) and status["learning"]["completed"] >= 1


def _done(status: dict | None, rounds: int) -> bool:
    learning = status and status.get("learning")
    # Its rounds run, and its learning over: async, a node may go on past them (overtime) while
    # a neighbour it weighs still runs (p2pnode/learning/engine.py, RoundEngine.done).
    return bool(learning) and learning["completed"] >= rounds and learning["phase"] == "done"


def _failed(status: dict | None) -> str | None:
    """Why a daemon's learning stopped for good (it raised: the daemon runs on without it, and
    waiting for its rounds would only wait out the run's timeout), or None."""
    phase = ((status or {}).get("learning") or {}).get("phase") or ""
    return phase if phase.startswith("failed") else None


def _progress_line(statuses: list[dict | None], rounds: int) -> str:
    learning = [s["learning"] for s in statuses if _ready(s)]
    silent = statuses.count(None)
    if not learning or (len(learning) < len(statuses) and not silent):
        return f"{len(learning)}/{len(statuses)} daemons ready to learn (loading data and models)"
    completed = [entry["completed"] for entry in learning]
    accuracies = [entry["accuracy"] for entry in learning if entry["accuracy"] is not None]
    accuracy = f"mean accuracy {100 * np.mean(accuracies):5.1f} %" if len(accuracies) == len(learning) else ""
    line = f"rounds done: min {min(completed)}/{rounds}, max {max(completed)}  {accuracy}"
    return f"{line}  ({len(statuses) - len(learning)} not learning: down or loading)" if silent else line


def testnet_report(header: dict[str, Any], partition, statuses: list[dict | None], wall_s: float) -> dict[str, Any]:
    """The report from the daemons' last statuses: their round records, plus the traffic and
    refusals their counters saw (learning and discovery apart)."""
    learning = [((s or {}).get("learning") or {}) for s in statuses]
    records = [RoundRecord.from_dict(entry) for state in learning for entry in state.get("history", [])]
    rejections: Counter[str] = Counter()
    messages: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for status in statuses:
        if status is None:
            continue
        rejections.update(status["traffic"]["rejections"])
        for kind, row in status["traffic"]["by_type"].items():
            if kind not in LEARNING_TYPES and row["messages_out"]:
                messages[kind] += row["messages_out"]
                sizes[kind] += row["bytes_out"]
    discovery = {
        "messages": sum(messages.values()),
        "bytes": sum(sizes.values()),
        "by_type": {kind: {"messages": messages[kind], "bytes": sizes[kind]} for kind in sorted(messages)},
    }
    processes = {
        "resumed_from": [state.get("resumed_from") for state in learning],
        "catch_ups": [state.get("catch_ups") for state in learning],
        # Resident memory (MiB) at each daemon's last status: after its last round.
        "rss_mb": [(s or {}).get("rss_mb") for s in statuses],
        "peak_rss_mb": [(s or {}).get("peak_rss_mb") for s in statuses],
        # Its inbound sockets' processes (p2pnode/wire/inbound/), now, and how often they restarted.
        "ingress_rss_mb": [ingress_rss_mb(s) for s in statuses],
        "ingress_restarts": [ingress_restarts(s) for s in statuses],
        # What each daemon says of being reachable at its address (discovery/reachability.py).
        "reachability": [((s or {}).get("reachability") or {}).get("state") for s in statuses],
        # Its relaying counts: places, circuits, frames forwarded and sent through relays (p2pnode/relay/).
        "relay": [((s or {}).get("relay") or {}).get("counts") for s in statuses],
    }
    report = assemble(
        header,
        records,
        Truth.of(partition),
        rejections=rejections,
        wall_s=wall_s,
        discovery=discovery,
        processes=processes,
    )
    if report["poisoning"] is not None:
        report["poisoning"].update(_attacks(statuses, report["poisoning"]["honest"]))
    return report


def _attacks(statuses: list[dict | None], honest: list[int]) -> dict[str, Any]:
    """What the Byzantine daemons sent (testnet/launch/byzantine.py, by kind) and what the honest
    nodes refused, by reason."""
    sent: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    for i, status in enumerate(statuses):
        if status is None:
            continue
        if i in honest:
            refused.update(status["traffic"]["rejections"])
        else:
            sent.update({k: v for k, v in (status.get("byzantine") or {}).items() if isinstance(v, int)})
    return {"sent": dict(sorted(sent.items())), "refused_by_honest": dict(sorted(refused.items()))}
