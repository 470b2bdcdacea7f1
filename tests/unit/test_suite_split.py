"""The suite's split over pytest-xdist's workers (tests/conftest.py): what shares state stays whole on one
worker, and the two docker-driven units may run beside each other only because their clusters are apart."""
import importlib.util
import ipaddress
from pathlib import Path

from sim import cluster as sim_cluster

TESTS = Path(__file__).resolve().parent.parent


def suite_conftest():
    spec = importlib.util.spec_from_file_location("suite_conftest", TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_what_shares_state_is_one_unit_and_the_rest_goes_test_by_test():
    unit = suite_conftest().work_unit
    e2e = [f"tests/e2e/{p.name}::test_x" for p in (TESTS / "e2e").glob("test_*.py")]
    assert len(e2e) >= 7 and {unit(n) for n in e2e} == {"tests/e2e/"}
    sim = [f"tests/sim/{p.name}::test_x[a]" for p in (TESTS / "sim").glob("test_*.py")]
    assert {unit(n) for n in sim} == {"tests/sim/"}
    copy = ["tests/unit/test_checkpoint_copy.py::test_a", "tests/unit/test_checkpoint_copy.py::test_b"]
    assert {unit(n) for n in copy} == {"tests/unit/test_checkpoint_copy.py"}
    for alone in ("tests/unit/test_plan.py::test_a", "tests/program/test_program.py::test_b[tp4]",
                  "tests/conformance/test_real_parsers.py::test_c[vllm]", "tests/e2e_like.py::test_d"):
        assert unit(alone) == alone


def test_the_e2e_and_sim_clusters_are_apart():
    """The e2e tier's cluster and tests/sim's (their fixtures' defaults) share no name, network or subnet."""
    from e2e.conftest import CLUSTER

    text = (TESTS / "sim" / "conftest.py").read_text()
    assert '"SIM_TEST_CLUSTER", "simtest"' in text and '"SIM_TEST_SUBNET", "172.30.98.0/24"' in text
    e2e, simtest = sim_cluster.plan(CLUSTER, 4), sim_cluster.plan("simtest", 3, "172.30.98.0/24")
    assert e2e.network != simtest.network and not set(e2e.rail_networks) & set(simtest.rail_networks)
    nets = [ipaddress.ip_network(n) for n in (e2e.subnet, *e2e.rail_subnets)]
    others = [ipaddress.ip_network(n) for n in (simtest.subnet, *simtest.rail_subnets)]
    assert not any(a.overlaps(b) for a in nets for b in others)
    assert not {n.container for n in e2e.nodes} & {n.container for n in simtest.nodes}


def test_the_e2e_figures_travel_from_the_worker_to_the_controller(monkeypatch):
    """A worker's timings, heals and scrape costs reach the controller's tables (they print there)."""
    from types import SimpleNamespace

    from e2e import timings

    conftest = suite_conftest()
    for name in ("TIMINGS", "HEALS", "SCRAPES"):
        monkeypatch.setattr(conftest, name, {})
    conftest.TIMINGS["sim: no-op up"] = 6.8
    conftest.HEALS["a rank SIGKILLed"] = {"detected": 0.4, "answering": 3.4}
    conftest.SCRAPES["sim engine 172.30.99.11:8888"] = (0.0012, 149.0)
    worker = SimpleNamespace(config=SimpleNamespace(workeroutput={}))
    conftest.pytest_sessionfinish(worker)
    sent = worker.config.workeroutput
    assert "dspark_figures" in sent and timings.TIMINGS is not conftest.TIMINGS
    for name in ("TIMINGS", "HEALS", "SCRAPES"):  # the controller's own, empty until a worker is down
        monkeypatch.setattr(conftest, name, {})
    conftest.pytest_testnodedown(SimpleNamespace(workeroutput=sent), None)
    assert conftest.TIMINGS == {"sim: no-op up": 6.8}
    assert conftest.HEALS == {"a rank SIGKILLed": {"detected": 0.4, "answering": 3.4}}
    assert conftest.SCRAPES == {"sim engine 172.30.99.11:8888": (0.0012, 149.0)}
    conftest.pytest_testnodedown(SimpleNamespace(workeroutput={}), None)  # a worker that ran no e2e test
    assert conftest.TIMINGS == {"sim: no-op up": 6.8}
