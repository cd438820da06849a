"""`p2pnode testnet --engine ray`: real daemons placed by Ray launchers, on a local Ray instance
(two CPUs), and the same report as the local launcher's. Skipped, with the reason, where Ray
(the `[ray]` extra) is not installed; the two tests that need no Ray run everywhere.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testnet.discovery import run_discovery_testnet

from .test_learning_daemon import same_keys
from .test_processes import wait_for

ROOT = Path(__file__).resolve().parent.parent

try:
    import ray
except ImportError:
    ray = None

P2PNODE_TESTNET = [sys.executable, "-m", "p2pnode", "testnet"]
needs_ray = pytest.mark.skipif(ray is None, reason="needs Ray: pip install '.[ray]'")


def test_importing_the_daemon_and_the_testnet_loads_no_ray():
    code = (
        "import sys, p2pnode.cli, testnet.cluster, testnet.discovery, testnet.learning, testnet.choose_placement; "
        "print('ray' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_engine_ray_without_ray_is_a_usage_error_naming_the_extra(tmp_path):
    """Ray made unimportable (as where it is not installed): exit 2 before anything starts."""
    out = tmp_path / "net"
    code = (
        "import sys; sys.modules['ray'] = None; from p2pnode.cli import main; "
        f"sys.exit(main(['testnet', '--nodes', '2', '--duration', '5', '--out', {str(out)!r}, '--engine', 'ray']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert "p2pnode: error: --engine ray needs Ray: pip install 'p2pnode[ray]'" in result.stderr
    assert not out.exists()
    result = subprocess.run(
        [*P2PNODE_TESTNET, "--nodes", "2", "--duration", "5", "--out", str(out), "--ray-address", "127.0.0.1:6379"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 2 and "--ray-address goes with --engine ray" in result.stderr


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (about 5 s to start on an idle machine), shipping
    this checkout's code to its workers as `p2pnode testnet --engine ray` does."""
    from testnet.raynodes import code

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=code())
    yield ray.nodes()[0]["NodeManagerAddress"]
    ray.shutdown()


def _placement():
    from testnet.raynodes import RayPlacement

    return RayPlacement.connect(None, progress=io.StringIO())  # joins the module's Ray


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for whoever inherited it to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@needs_ray
def test_a_discovery_testnet_on_ray_reaches_full_mesh_with_the_local_reports_shape(tmp_path, local_ray):
    with _placement() as placement:
        code, report = run_discovery_testnet(
            tmp_path / "ray", 4, 60, exit_on_mesh=True, progress=io.StringIO(), placement=placement
        )
        launcher_dirs = [Path(ray.get(launcher.ready.remote())) for _, launcher, _ in placement.launchers]
    assert code == 0, report["discovery"]
    assert report["engine"] == "ray" and report["discovery"]["peer_counts"] == [3] * 4
    assert report["node_exit_codes"] == [0] * 4  # SIGTERM through the launcher: a clean stop
    for node in report["nodes_detail"]:
        assert node["address"].startswith(f"tcp://{local_ray}:")  # the Ray node's address, not 127.0.0.1
        log = Path(node["log"]).read_text()  # brought back from the Ray node
        assert "SIGTERM received: shutting down" in log and "Traceback" not in log
    assert not any(path.exists() for path in launcher_dirs)  # keys and data directories removed

    code, local = run_discovery_testnet(tmp_path / "local", 4, 60, exit_on_mesh=True, progress=io.StringIO())
    assert code == 0 and local["engine"] == "local"
    for key in ("", "discovery", "comm"):  # the schema; what was counted, by kind, is data
        assert set(report.get(key, report)) == set(local.get(key, local)), key
    assert set(report["nodes_detail"][0]) == set(local["nodes_detail"][0])


@needs_ray
def test_a_learning_testnet_on_ray_finishes_with_check(tmp_path, local_ray):
    from testnet.learning import run_learning_testnet
    from testnet.report import CheckThresholds
    from testnet.simulator import SimulationSpec, run_simulation

    spec = SimulationSpec(
        algorithm="mapl",
        dataset="digits",
        nodes=3,
        rounds=3,
        samples_per_class=10,
        backbones=("mlp",),
        overrides={"warmup_rounds": "1"},
    )
    with _placement() as placement:
        code, report = run_learning_testnet(
            spec,
            tmp_path / "net",
            round_deadline_s=10,
            check=CheckThresholds(accuracy=0.5, within_cluster_mass=0.0),
            progress=io.StringIO(),
            placement=placement,
        )
    assert code == 0, report["check"]
    assert report["rounds_completed_per_node"] == [3, 3, 3] and report["processes"]["exit_codes"] == [0, 0, 0]
    assert report["processes"]["engine"] == "ray"
    assert all(address.startswith(f"tcp://{local_ray}:") for address in report["processes"]["addresses"])
    assert same_keys(report, run_simulation(spec)) == []  # one report builder, whatever ran the daemons


@needs_ray
def test_churn_restarts_a_daemon_on_its_ray_node(tmp_path, local_ray):
    from testnet.churn import ChurnSpec

    with _placement() as placement:
        code, report = run_discovery_testnet(
            tmp_path / "net",
            3,
            60,
            exit_on_mesh=True,
            churn=ChurnSpec(every_s=2.0, down_s=1.0, count=1),
            progress=io.StringIO(),
            placement=placement,
        )
    assert code == 0, report["churn"]
    (event,) = report["churn"]["events"]
    assert event["exit_code"] == -signal.SIGKILL and event["mesh_s"] is not None
    assert report["discovery"]["peer_counts"] == [2] * 3 and report["node_exit_codes"] == [0] * 3


@needs_ray
def test_a_lost_launcher_takes_its_daemons_with_it_and_they_count_as_exited(tmp_path, local_ray):
    """The actor's process dies (killed as a lost Ray node would lose it): its daemons get
    SIGTERM from PR_SET_PDEATHSIG, nothing is left running, and the launcher reports them lost."""
    from testnet.cluster import Cluster
    from testnet.raynodes import LOST

    with _placement() as placement, Cluster.prepare(tmp_path, 2, placement=placement) as cluster:
        cluster.start_all()
        wait_for(lambda: all(status is not None for status in cluster.statuses()), timeout=60)
        pids = [spec.process.pid for spec in cluster.specs]
        (_, launcher, _), *_ = placement.launchers
        ray.kill(launcher)
        wait_for(lambda: all(_gone(pid) for pid in pids), timeout=30)
        assert [cluster.alive(spec) for spec in cluster.specs] == [False, False]
        assert [spec.process.returncode for spec in cluster.specs] == [LOST, LOST]
        assert cluster.stop() == {0: LOST, 1: LOST}
