"""The tables of testnet-against-simulator (tools/bench/parity.py) and of `make demo`
(tools/demo.py) as BENCHMARKS.md draws them from a result file."""

from tools.bench.render import render_result
from tools.bench.results import capture, save


def _side(accuracy: float, wall_s: float, missing: int) -> dict:
    return {
        "accuracy": accuracy,
        "accuracy_std": 0.02,
        "own_class_accuracy": accuracy,
        "within_cluster_mass": 1.0,
        "l1_to_truth": 0.1,
        "messages": 3614,
        "bytes": 21.7 * 2**20,
        "envelope_overhead": 1.04,
        "wall_s": wall_s,
        "missing_payloads": missing,
        "round_s": 0.6,
    }


def test_parity_draws_each_run_its_difference_and_the_verdicts(tmp_path):
    runs = [
        {"algorithm": "mapl", "scenario": "1", "seed": 1, "exit_code": 0, "failures": []}
        | {"simulator": _side(0.955, 31, 0), "testnet": _side(0.949, 68, 9)},
        {"algorithm": "mapl", "scenario": "2", "seed": 2, "exit_code": 1, "failures": ["mass"]}
        | {"simulator": _side(0.931, 69, 0), "testnet": _side(0.945, 65, 7)},
    ]
    data = {"rounds": 60, "samples_per_class": 25, "tuning_seeds": [0], "command": "p2pnode testnet --out DIR --check"}
    with capture("python -m tools.bench.parity", seeds=[1, 2], threads=1, runs=4) as provenance:
        pass
    save("parity-probe", "tools.bench.parity", provenance, data | {"runs": runs}, directory=tmp_path)
    drawn = render_result("parity-probe", tmp_path)
    assert "| 1 | mapl | 1 | simulator | 95.5 ± 2.0 | 95.5 | 1.000 | 0.100 | 3614 | 21.7 | 31 | 0 |" in drawn
    assert "| 1 | mapl | 1 | testnet | 94.9 ± 2.0 |" in drawn
    assert "| 1 | mapl | 1 | **Δ** | -0.6 | -0.6 | +0.000 | +0.000 | +0 | +0.0 | +37 | +9 |" in drawn
    assert "| 2 | mapl | 2 | **Δ** | +1.4 |" in drawn
    assert "over the 2 runs: mean +0.40 points, mean |Δ| 1.00, largest |Δ| 1.40" in drawn
    assert (
        "`--check`: failed for mapl 2 seed 2. Testnets: envelope overhead (bytes on the wire ÷ tensor bytes) " in drawn
    )
    assert "1.040–1.040, mean round 0.60–0.60 s." in drawn
    assert "hyper-parameters tuned on seed 0, left out" in drawn and "seeds 1, 2" in drawn


def _method(name: str, where: str, per_node: list[float], wall_s: float) -> dict:
    mean = sum(per_node) / len(per_node)
    pooled = {"correct": round(mean * 320), "n": 320, "accuracy": mean, "low": mean - 0.02, "high": mean + 0.02}
    return {"name": name, "where": where, "wall_s": wall_s, "mean": mean, "std": 0.03, "per_node": per_node} | {
        "pooled": pooled
    }


def test_demo_draws_the_gain_over_local_the_wall_times_and_the_traffic(tmp_path):
    methods = [_method("mapl-dual", "daemons", [0.95, 0.93], 322.4), _method("local", "simulated", [0.90, 0.94], 92)]
    data = {
        "nodes": 2,
        "rounds": 80,
        "methods": methods,
        "differences": {"local": {"mean": 0.02, "low": -0.01, "high": 0.05}},
        "within_cluster_mass": 1.0,
        "l1_to_truth": 0.088,
        "messages": 8720,
        "bytes": 426 * 2**20,
        "wall_s": 420.0,
        "check": {"passed": True, "failures": []},
    }
    with capture("python -m tools.demo --out DIR --save demo", threads=1, runs=2) as provenance:
        pass
    save("demo-probe", "tools.demo", provenance, data, directory=tmp_path)
    drawn = render_result("demo-probe", tmp_path)
    assert "| mapl-dual (daemons) | 94.0 ± 3.0 % | 94.0 % [92.0, 96.0] of 320 | — | 322 |" in drawn
    assert (
        "| local (simulated) | 92.0 ± 3.0 % | 92.0 % [90.0, 94.0] of 320 | **+2.0 points [-1.0, +5.0]** | 92 |" in drawn
    )
    assert "8,720 messages, 426 MiB; 1 of 2 nodes gained (-1.0 to +5.0 points)" in drawn
    assert "Wall time 7 min (the testnet 322 s, Local 92 s)." in drawn
