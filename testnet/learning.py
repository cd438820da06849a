"""`p2pnode testnet --algorithm A`: N real daemons learn over TCP; the report comes from the
same builder as `p2pnode simulate`'s (testnet/report.py), fed with the round records each daemon
keeps in its `status`.

Each daemon gets node index i of the same partition and seed as the simulator's node i, so the
two can be compared run for run. `comm.*` counts learning frames as the daemons' transports
sent them; discovery and keep-alives are reported apart, under `comm.discovery`.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.device import placement as device_placement
from algorithms.setup import load_scenario
from p2pnode.config import DiscoverySettings
from p2pnode.rounds import RoundRecord
from protocol import LEARNING_TYPES

from .churn import ChurnSpec, Supervisor
from .cluster import Cluster
from .placement import Placement
from .provenance import provenance
from .report import CheckThresholds, Truth, assemble, check, run_header
from .simulator import SimulationSpec

__all__ = ["run_learning_testnet", "testnet_report", "node_settings", "DISCOVERY"]

# Daemons of one machine: quick failure detection, so a killed node stops being waited for.
DISCOVERY = {"ping_interval_s": 0.5, "peer_timeout_s": 3.0, "exchange_interval_s": 0.5, "dial_retry_max_s": 1.0}


def node_settings(
    spec: SimulationSpec, index: int, backbone: str, round_deadline_s: float, target: int | None = None
) -> dict[str, Any]:
    """Node `index`'s config sections; `target` is the peers it seeks (its `active_view`, at
    most `max_peers`; default: the daemon's)."""
    if target is None:
        target = DiscoverySettings().active_view
    data = {
        "dataset": spec.dataset,
        "scenario": spec.scenario,
        "nodes": spec.nodes,
        "node_index": index,
        "clusters": spec.clusters or 0,
        "samples_per_class": spec.samples_per_class,
        "test_per_class": spec.test_per_class,
        "seed": spec.seed,
    }
    if spec.dataset_root:
        data["root"] = str(Path(spec.dataset_root).resolve())
    return {
        "data": data,
        "model": {
            "backbone": backbone,
            "threads": 1,
            "device": spec.device,
            "mixed_precision": spec.mixed_precision,
        },
        "algorithm": {
            "name": spec.algorithm,
            "rounds": spec.rounds,
            "start_peers": min(spec.nodes - 1, target),  # it seeks no more
            "start_timeout_s": 120.0,
            "round_deadline_s": round_deadline_s,
            "settings": dict(spec.overrides),
        },
        "log": {"format": "json"},
    }


def run_learning_testnet(
    spec: SimulationSpec,
    out: Path,
    *,
    round_deadline_s: float = 5.0,
    timeout_s: float | None = None,
    check: CheckThresholds | None = None,
    churn: ChurnSpec | None = None,
    keep_going: bool = False,
    poll_s: float = 0.5,
    discovery: dict[str, Any] | None = None,
    progress=None,
    placement: Placement | None = None,
) -> tuple[int, dict[str, Any]]:
    """Returns (exit code, report): 0 if every node finished (and `check` passed, if given),
    1 if not, 130 if interrupted. `churn` stops and restarts daemons while they learn (not
    those that have finished); they resume from their checkpoints. `discovery` adds
    `[discovery]` settings (e.g. `active_view`, `max_peers`) to every node's. `placement` runs
    the daemons (default: here)."""
    if spec.poisoners:
        raise ValueError("poisoning peers exist in the simulator only")
    # The daemons resolve the device as this launcher does: fail before starting them. Provenance
    # says what ran the nodes (`engine`), as a simulation's does.
    device, mixed_precision = device_placement(spec.device, spec.mixed_precision)
    progress = progress or sys.stderr  # the stream of the moment, not the one at import (tests swap it)
    made = {**provenance(spec.seed, str(device)), "engine": {"kind": placement.engine if placement else "local"}}
    processes = {
        "resumed_from": [state.get("resumed_from") for state in learning],
        "catch_ups": [state.get("catch_ups") for state in learning],
        # Resident memory (MiB) at each daemon's last status: after its last round.
        "rss_mb": [(s or {}).get("rss_mb") for s in statuses],
        "peak_rss_mb": [(s or {}).get("peak_rss_mb") for s in statuses],
    }
    return assemble(
        header,
        records,
        Truth.of(partition),
        rejections=rejections,
        wall_s=wall_s,
        discovery=discovery,
        processes=processes,
    )
