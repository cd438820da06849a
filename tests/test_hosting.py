"""The simulator's engines (testnet/simulation/hosting.py): the same report in this process, in worker
processes and on Ray, for the same seed; a failing node or worker named, the pool torn down."""

import dataclasses
import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

from algorithms.data.setup import ScenarioSpec
from algorithms.registry import default_config
from testnet.simulation.host import blocks
from testnet.simulation.hosting import Engine
from testnet.simulation.shard import SimulationError
from testnet.simulation.simulator import SimulationSpec, run_baselines, run_simulation
from testnet.simulation.spec import Slow
from testnet.simulation.workers import ProcessHosts, start_method

ROOT = Path(__file__).resolve().parent.parent
# Learning from round 1 on (graph, pruning), so two rounds run every step of each algorithm;
# mapl with a poisoner, so refused and poisoned payloads cross hosts too.
SAME_REPORT = {"mapl": (3,), "scool-attention": (), "dfedavgm": ()}


def small(algorithm: str, nodes: int = 4, **changes) -> SimulationSpec:
    known = {f.name for f in dataclasses.fields(default_config(algorithm))}
    overrides = {"training.batch_size": "16", **{k: "1" for k in ("warmup_rounds", "prune_round") if k in known}}
    spec = SimulationSpec(
        algorithm=algorithm,
        data=ScenarioSpec(dataset="digits", nodes=nodes, samples_per_class=5, test_per_class=3),
        rounds=2,
        overrides=overrides,
        poisoners=SAME_REPORT.get(algorithm, ()),
        attack="random",
    )
    return dataclasses.replace(spec, **changes)


def results(report: dict) -> str:
    """The report but what depends on timing and on where it ran, as comparable text (NaN too)."""
    kept = {k: v for k, v in report.items() if k not in ("wall_s", "timing", "provenance")}
    return json.dumps(kept, sort_keys=True)


def test_nodes_are_dealt_in_contiguous_blocks_that_differ_by_one_at_most():
    assert blocks(10, 2) == [(0, 1, 2, 3, 4), (5, 6, 7, 8, 9)]
    assert blocks(7, 3) == [(0, 1, 2), (3, 4), (5, 6)]
    assert blocks(2, 8) == [(0,), (1,)]
    assert [i for block in blocks(203, 16) for i in block] == list(range(203))


@pytest.mark.parametrize("algorithm", SAME_REPORT)
def test_worker_processes_give_the_inline_report_bit_for_bit(algorithm):
    spec = small(algorithm)
    progress: dict[str, list] = {"inline": [], "processes": []}
    inline = run_simulation(spec, progress=progress["inline"].append)
    spread = run_simulation(
        spec, progress=progress["processes"].append, engine=Engine("processes", workers=2, threads=1)
    )
    assert results(spread) == results(inline)
    untimed = {kind: [dataclasses.replace(r, elapsed_s=0.0) for r in rounds] for kind, rounds in progress.items()}
    assert untimed["processes"] == untimed["inline"] and len(untimed["inline"]) == spec.rounds
    assert spread["accuracy"]["per_node"] == inline["accuracy"]["per_node"]  # spelled out: what matters most
    assert spread["graph"]["W"] == inline["graph"]["W"] and spread["comm"] == inline["comm"]
    assert spread["comm"]["messages"] > 0
    if algorithm == "mapl":
        assert spread["poisoning"] == inline["poisoning"]
    engine = spread["provenance"]["engine"]
    assert {k: engine[k] for k in ("kind", "workers", "threads")} == {"kind": "processes", "workers": 2, "threads": 1}
    assert [host["nodes"] for host in engine["hosts"]] == [2, 2] and all(h["peak_rss_mb"] > 0 for h in engine["hosts"])
    assert inline["provenance"]["engine"]["kind"] == "inline"
    assert not multiprocessing.active_children()


def test_worker_processes_keep_the_simulated_clock_of_slow_nodes_bit_for_bit():
    """Nodes out of step (one at a third of the speed) are called host by host as their events
    come: the schedule, and so every figure, is the inline one."""
    spec = small("mapl", slow=Slow(0.25, 3), rounds=3, latency_s=0.05)
    inline = run_simulation(spec)
    spread = run_simulation(spec, engine=Engine("processes", workers=2, threads=1))
    assert results(spread) == results(inline)
    assert inline["time_to_accuracy"]["ended_at_per_node"] != [[1.0, 2.0, 3.0]] * 4


def test_baselines_run_on_the_engine_of_the_run():
    spec = small("mapl")
    inline = run_baselines(spec, ["local"])
    spread = run_baselines(spec, ["local"], engine=Engine("processes", workers=2, threads=1))
    assert results(spread["local"]) == results(inline["local"])
    assert spread["local"]["provenance"]["engine"]["kind"] == "processes"


def test_a_node_that_raises_stops_the_run_naming_it(tmp_path, capsys):
    from p2pnode_cli import main

    # A scale of 1e300 overflows float32: the poisoner's payload is not finite and cannot be signed.
    args = ["simulate", "--algorithm", "mapl", "--dataset", "digits", "--nodes", "4", "--rounds", "2"]
    args += ["--samples-per-class", "5", "--backbones", "mlp", "--set", "warmup_rounds=1", "--out", str(tmp_path)]
    args += ["--poisoners", "1", "--attack", "scale", "--attack-factor", "1e300", "--engine", "processes"]
    assert main([*args, "--workers", "2"]) == 1
    error = capsys.readouterr().err
    assert "p2pnode: error: node 1 (" in error and "failed in publish" in error and "contains NaN or Inf" in error
    assert "worker 0 (nodes 0–1)" in error and "Traceback" not in error
    assert not multiprocessing.active_children()


def test_workers_are_forked_only_where_a_child_can_inherit_this_process_safely():
    assert start_method(1) == ("fork" if sys.platform == "linux" else "spawn")
    assert start_method(2) == "spawn"  # a torch thread pool of its own: a fresh interpreter
    spawned = run_simulation(small("local", nodes=2, rounds=1), engine=Engine("processes", workers=1, threads=2))
    assert len(spawned["accuracy"]["per_node"]) == 2 and spawned["provenance"]["engine"]["threads"] == 2
    assert not multiprocessing.active_children()


def test_a_worker_that_cannot_build_its_nodes_is_named():
    with pytest.raises(SimulationError, match=r"worker \d \(nodes \d–\d\) failed in start: DeviceError: .*cuda:9999"):
        ProcessHosts(small("local", nodes=4, device="cuda:9999"), blocks(4, 2), threads=1, timeout_s=120)
    assert not multiprocessing.active_children()


def test_a_worker_that_dies_stops_the_run_naming_it():
    spec = small("local", nodes=4)
    with ProcessHosts(spec, blocks(4, 2), threads=1, timeout_s=120) as hosts:
        victim = hosts._workers[1][0]
        victim.kill()
        victim.join(10)
        with pytest.raises(SimulationError, match=r"worker 1 \(nodes 2–3\) .*killed by signal 9"):
            hosts.call("step", [(0,), (0,)])
    assert not multiprocessing.active_children()


def test_a_posted_command_is_not_waited_for_and_its_failure_raises_from_the_next_call():
    with ProcessHosts(small("local", nodes=4), blocks(4, 2), threads=1, timeout_s=120) as hosts:
        hosts.post("begin", [([0, 1],), None])  # node 0 and 1's local steps, in worker 0 alone
        assert hosts.call("sizes", [None, ()]) == [None, {2: (25, 15), 3: (25, 15)}]  # worker 1 only
        assert hosts.call("sizes", [(), None]) == [{0: (25, 15), 1: (25, 15)}, None]  # after worker 0's steps
        hosts.post("begin", [([3],), None])  # node 3 is worker 1's
        with pytest.raises(SimulationError, match=r"worker 0 \(nodes 0–1\) failed in begin: KeyError: 3"):
            hosts.call("sizes", [(), ()])
    assert not multiprocessing.active_children()


def test_a_worker_that_does_not_answer_in_time_stops_the_run():
    with pytest.raises(SimulationError, match=r"no answer to start within 0.001 s from worker 0 \(nodes 0–1\)"):
        ProcessHosts(small("local", nodes=4), blocks(4, 2), threads=1, timeout_s=0.001)
    assert not multiprocessing.active_children()


def test_engine_choices_are_checked():
    with pytest.raises(ValueError, match="inline engine runs one host"):
        Engine("inline", workers=2)
    with pytest.raises(ValueError, match="needs the ray engine"):
        Engine("processes", ray_address="auto")
    with pytest.raises(ValueError, match="unknown engine"):
        Engine("threads")


def test_the_ray_engine_without_ray_is_a_usage_error_naming_the_extra(tmp_path):
    # `import ray` fails as it does where Ray is not installed.
    args = ["simulate", "--algorithm", "local", "--dataset", "digits", "--engine", "ray", "--out", str(tmp_path)]
    code = f"import sys; sys.modules['ray'] = None; from p2pnode_cli import main; sys.exit(main({args!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip() == "p2pnode: error: --engine ray needs Ray, an optional extra: pip install 'p2pnode[ray]'"
    )


# --- Ray, local, two CPUs (skipped where the optional extra is not installed) ----------------------


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray", reason="the ray engine is an optional extra: pip install 'p2pnode[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield ray
    ray.shutdown()


def test_ray_actors_give_the_inline_report_bit_for_bit(local_ray):
    for algorithm in SAME_REPORT:
        spec = small(algorithm)
        on_ray = run_simulation(spec, engine=Engine("ray", workers=2, threads=1))
        assert results(on_ray) == results(run_simulation(spec)), algorithm
        assert on_ray["provenance"]["engine"]["kind"] == "ray"


def test_a_ray_host_that_cannot_build_its_nodes_is_named(local_ray):
    with pytest.raises(SimulationError, match=r"Ray host \d \(nodes \d–\d\) .*cuda:9999"):
        run_simulation(small("local", nodes=4, device="cuda:9999"), engine=Engine("ray", workers=2))
