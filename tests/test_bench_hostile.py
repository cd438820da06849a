"""The hostile-peer benchmarks' tables drawn from result files (issue #31): tools/bench/poisoning.py,
attacks.py and hostile.py each render what they saved, provenance line included."""

from tools.bench import attacks, hostile, poisoning
from tools.bench.render import render_result
from tools.bench.results import capture, save


def _drawn(tmp_path, name: str, renderer, data: dict, **provenance) -> str:
    with capture(f"python -m {renderer.__name__}", **provenance) as made:
        pass
    save(name, renderer.__name__, made, data, directory=tmp_path)
    return render_result(name, tmp_path)


def _run(attack: str, weights: list[float], accuracy: list[float], rejections: dict | None = None) -> dict:
    return {
        "algorithm": "mapl",
        "seed": 1,
        "attack": {"kind": attack, "factor": 10.0},
        "rejections": rejections or {},
        "wall_s": 60.0,
        "poisoning": {
            "honest_accuracy": {"mean": accuracy[-1], "per_round": accuracy},
            "poisoner_weight": {"max": weights[-1], "mean": weights[-1] / 2, "max_per_round": weights},
        },
    }


def test_poisoning_renders_the_rounds_until_shut_out_and_the_twins_weight(tmp_path):
    rounds, warmup = 24, poisoning.SETTINGS["mapl"][2]
    twin = _run("none", [0.25] * rounds, [0.90] * rounds)
    # Above the bound until round 22, the first two graph rounds after the warm-up of 20.
    poisoned = _run("scale", [0.3] * 22 + [0.0] * 2, [0.90] * (rounds - 1) + [0.88], {"out_of_scale": 5})
    data = {"poisoner": 1, "settings": poisoning._settings(rounds), "runs": [twin, poisoned]}
    drawn = _drawn(tmp_path, "poisoning", poisoning, data, seeds=[1], threads=1, runs=2)
    assert (
        f"| mapl | scale ×10 | 1 | {22 - warmup} | 0.000 / 0.000 | 88.0 | 90.0 | -2.0 | -0.2 | 5 out_of_scale |"
        in drawn
    )
    assert "mapl 24 rounds, 25 training samples per class, warm-up 20; node 1 poisons" in drawn
    assert "scool-attention" not in drawn.split("<sub>")[0]  # no run of it: not described
    assert "got at most this weight in an honest row over the run: mapl, seed 1: 0.25." in drawn
    assert "seeds 1; torch threads 1; runs 2.</sub>" in drawn


def _flood(name: str, curve: bool) -> dict:
    return {
        "attack": name,
        "curve": curve,
        "sent": 10000,
        "blocked": 5,
        "counted": 2739,
        "rejections": {"unknown_peer": 2700},
        "evicted": {"evicted_timeout": 0},
        "connections": {"disconnected": 1, "shed_buffered": 0},
        "cpu_idle": 0.044,
        "cpu_attack": 0.167,
        "rtt_idle_ms": 4.31,
        "rtt_attack_ms": 4.46,
        "rtt_attack_max_ms": 5.75,
        "rss_before_mb": 46.2,
        "rss_peak_mb": 46.4,
        "rss_after_mb": 45.1,
    }


def test_attacks_renders_each_flood_with_the_settings_it_lifted(tmp_path):
    data = {"seconds": 5.0, "rows": [_flood("garbage, full rate, ≤ 64 KiB", True)]}
    drawn = _drawn(tmp_path, "attacks", attacks, data, settings=attacks.SETTINGS, runs=1)
    row = "| garbage, full rate, ≤ 64 KiB | 10000 | 5 | 2739 | 1 (0 shed, 0 handshake) | 0.044 → 0.167 "
    assert row + "| 4.31 → 4.46 (max 5.75) | 46 → 46 → 45 | 0 |" in drawn
    assert "Each attack 5 s against a fresh pair of daemons, after 5 s idle" in drawn
    assert "`discovery.ping_interval_s = 0.2`" in drawn and "`security.max_connections_per_address = 64`" in drawn


def _abort_row(curve: bool, bans: bool) -> dict:
    return {
        "curve": curve,
        "bans": bans,
        "attack": "--kind stall-reset",
        "socket": "peers",
        "node_alive": True,
        "attacker": {"sent": 100},
        "restarts": {"public": 0, "peers": 3 if bans else 44},
        "status_s": {"median": 0.002, "max": 0.015, "asked": 300},
        "peers": {"before": 3, "min": 3, "after": 3},
        "reachable_share": 1.0 if bans else 0.92,
        "evicted": {},
    }


def test_hostile_renders_the_abort_rows_curve_and_bans_from_each_row(tmp_path):
    data = {
        "kind": "aborts",
        "seconds": 60.0,
        "learning": False,
        "rows": [_abort_row(True, False), _abort_row(True, True)],
    }
    drawn = _drawn(tmp_path, "hostile-aborts", hostile, data, settings=hostile.SETTINGS, runs=2)
    assert (
        "| on | off | --kind stall-reset | peers (admitted key) | 0 | 44 (0) | 0.002 / 0.015 | 3 → 3 → 3 | 92 % | 0 |"
        in drawn
    )
    assert "| on | on | --kind stall-reset | peers (admitted key) | 0 | 3 (0) |" in drawn
    assert "Each attack 60 s against a fresh testnet." in drawn


def _admitted(attack: str, barrage: bool, passed: bool) -> dict:
    return {
        "attack": attack,
        "barrage": barrage,
        "check": {"passed": passed, "failures": [] if passed else ["honest within-cluster mass 0.827 below 0.9"]},
        "honest_accuracy": 0.907,
        "honest_mass": 0.827 if not passed else 1.0,
        "within_cluster_mass": 1.0,
        "poisoner_weight": 0.544 if attack == "none" else 0.0,
        "honest_l1": {"mean": 0.014, "max": 0.028},
        "last_round": [7, 7, 7],
        "catch_ups": [0, 0, 0],
        "exit_codes": [0, 0, 0, 0],
        "ingress_restarts": [0, 0, 0, None],
        "peak_rss_mb": {"honest": [623.4, 679.0, 650.0], "poisoner": 854.2},
        "sent": {"model": 11},
        "refused_by_honest": {"out_of_scale": 25, "unexpected_type": 1311},
        "wall_s": 27.6,
    }


def test_hostile_renders_the_admitted_peer_runs_failures_in_words(tmp_path):
    rows = [_admitted("none", False, True), _admitted("rescale", True, False)]
    data = {"kind": "admitted-peer", "rows": rows}
    drawn = _drawn(tmp_path, "hostile-admitted", hostile, data, settings=hostile.ADMITTED_SETTINGS, seeds=[1], runs=2)
    assert "| twin (`none`) | passed (mass 1.000) | 0.907 | 0.544 (its mate’s) | — | 7, 7, 7 / 0 | 0 / 0 |" in drawn
    failed = "| `rescale` + barrage | **failed**: honest within-cluster mass 0.827 below 0.9 (mass 0.827) | 0.907 "
    assert failed + "| 0.000 | 0.014 (0.028) |" in drawn
    assert "| 623–679 (the poisoner 854) | 25 `out_of_scale`, 1,311 `unexpected_type` | 28 |" in drawn
    assert "`security.curve = True`" in drawn and "seeds 1;" in drawn
