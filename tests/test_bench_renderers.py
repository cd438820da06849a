"""The tables of the adapter, memory, scaling, simulator and stragglers benchmarks, drawn from a result file
as tools/bench/render.py draws BENCHMARKS.md's (issue #31). Each result here is written by
save() into a temporary directory with made-up figures: what is checked is the drawing."""

from __future__ import annotations

from tools.bench.render import render_result
from tools.bench.results import capture, save


def _drawn(tmp_path, renderer: str, data: dict, settings: dict | None = None) -> str:
    with capture("python -m tools.bench.x", settings=settings, runs=1) as provenance:
        pass
    save("probe", renderer, provenance, data, directory=tmp_path)
    return render_result("probe", tmp_path)


def _adapter_run(rate: float, ratio: float) -> dict:
    row = {"payload_bytes": 20480, "messages": 900, "blocking_per_s": rate, "zmqtrio_ratio": ratio}
    return {"method": "median of 3 trials", "results": [{**row, "zmq_anyio_ratio": None}]}


def test_adapters_one_value_per_run(tmp_path):
    drawn = _drawn(tmp_path, "tools.bench.adapters", {"runs": [_adapter_run(112400, 1.081), _adapter_run(95600, 0.9)]})
    assert "| 20 KiB | 112, 96 | 1.08, 0.90 | not installed |" in drawn
    assert "settings other than a user's defaults: none" in drawn


def test_memory_per_algorithm_and_per_stage(tmp_path):
    figures = {"rss_mb": [354.2, 351.0, 356.0], "peak_rss_mb": [392.0, 395.4, 390.0], "accuracy": 0.95}
    drawn = _drawn(
        tmp_path,
        "tools.bench.memory",
        {"nodes": 3, "rounds": 25, "algorithms": {"mapl": figures}},
        {"node.backbone": "convnet", "algorithm.round_deadline_s": 10.0},
    )
    assert "| mapl | 3 | 354 / 356 | 392 / 395 | 95.0 % |" in drawn
    assert "`node.backbone = convnet`, `algorithm.round_deadline_s = 10.0`" in drawn
    stages = [{"stage": "daemon modules imported", "rss_mb": 55.6, "peak_rss_mb": 56.0}]
    drawn = _drawn(tmp_path, "tools.bench.memory", {"algorithm": "mapl", "rounds": 25, "stages": stages})
    assert (
        "| stage (mapl, convnet, mnist5k, node 0 of 10) |" in drawn and "| daemon modules imported | 56 | 56 |" in drawn
    )


def test_scale_one_row_per_network_size(tmp_path):
    overlay = {"connected": False, "diameter": None, "degree_min": 6, "degree_mean": 7.9, "degree_max": 9}
    row = {"nodes": 100, "active_view": 8, "max_peers": 10, "all_up_s": 150.04, "target_s": None}
    row |= {"overlay": overlay, "steady": None, "cpu_s_mean": 2.04, "cpu_s_max": 4.1}
    row |= {"rss_mb_mean": 45.9, "rss_mb_max": 47.4, "peak_rss_mb_max": 48.0}
    drawn = _drawn(tmp_path, "tools.bench.scale", {"hold_s": 30.0, "rows": [row]}, {"discovery.active_view": 8})
    assert "| 100 | 8 / 10 | 150.0 | never | NO, None | 6 / 7.9 / 9 | - | - | - | - | 2.0 / 4.1 |" in drawn
    assert "stopped 30 s after every view was at its target" in drawn and "`discovery.active_view = 8`" in drawn


def _simulation(label: str, kind: str, wall_s: float, results: str) -> dict:
    hosts = [{"peak_rss_mb": 440.0, "cpu_s": wall_s * 0.9}] * (2 if kind == "processes" else 1)
    return {
        "label": label,
        "nodes": 10,
        "rounds": 60,
        "engine": {"kind": kind, "hosts": hosts},
        "threads": 1,
        "wall_s": wall_s,
        "accuracy": 0.9547,
        "results": results,
        "load": [1.5, 2.0],
    }


def test_simulate_speedup_and_scaling(tmp_path):
    runs = [
        _simulation("before engines", "inline", 34.1, "a"),
        _simulation("inline, 1 thread", "inline", 45.7, "b"),
        _simulation("processes, 2 × 1 thread", "processes", 25.8, "b"),
    ]
    drawn = _drawn(tmp_path, "tools.bench.simulate", {"what": "speedup", "before": True, "runs": runs})
    assert "| processes, 2 × 1 thread | 10 | 60 | processes | 2 × 1 | 25.8 | 1.80 | 0.43 | 95.47 | 440 / 440 |" in drawn
    assert "processes against before engines: 1.32× as fast, accuracy +0.00 points" in drawn
    assert "processes against inline on 1 thread: 1.77× as fast (median of 1.77), reports identical" in drawn
    drawn = _drawn(tmp_path, "tools.bench.simulate", {"what": "scaling", "runs": [runs[1], runs[0]]})
    assert "| 10 nodes: reports different on every engine |" in drawn


def _straggler_run(per_node: list[float], slow: list[int] | None = None) -> dict:
    curves = [[0.5, accuracy] for accuracy in per_node]
    return {
        "backbones": ["convnet"] * len(per_node),
        "slow": {"nodes": slow, "factor": 5.0} if slow else None,
        "accuracy": {"per_node": per_node, "mean": sum(per_node) / len(per_node)},
        "time_to_accuracy": {"ended_at_per_node": [[1.0, 2.0]] * len(per_node), "accuracy_per_node": curves},
    }


def test_stragglers_counts_a_node_exactly_one_point_away_as_within_it():
    # Accuracies are shares of 400 test images: 4 images, 1 point, is 1.0000000000000009 in floats.
    from tools.bench.stragglers import _async_row

    equal = _straggler_run([0.9775, 0.9525, 0.9])
    slowed = _straggler_run([0.9675, 0.9625, 0.95], slow=[2])
    local = _straggler_run([0.9, 0.9, 0.9])
    row, _ = _async_row(1, equal, equal, slowed, local)
    cells = [cell.strip() for cell in row.split("|")]
    assert cells[6] == "2/3 (3/3)"  # −1.0 and +1.0 points are within a point, +5.0 is not (but not below)
    assert cells[5] == "2/2, 1.00"  # and both fast nodes get to within a point of their sync accuracy
