"""What every tier shares: the import path, the split of the suite over pytest-xdist's workers (pytest.ini
runs two), and the end-of-run tables the e2e tier records (timings, heals, scrape costs), gathered from the
worker that ran it."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
for p in (ROOT, TESTS):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from e2e.timings import EXPOSURE, HEALS, SCRAPES, TIMINGS  # noqa: E402  (needs the path above)

# What holds state another worker would trip over runs whole on one worker, in collection order; everything
# else is spread over the workers test by test. The e2e tier and tests/sim use apart clusters (own names and
# subnets), so they may run beside each other. (xdist's own `--dist loadgroup` cannot say this under pytest
# 9.2: it renames `item._nodeid`, which pytest 9.2 no longer reads, so its groups are silently dropped.)
SHARED_STATE = {
    "tests/e2e/": "the cluster `sim` and its brought-up stacks, handed from module to module",
    "tests/sim/": "the session's cluster `simtest` and containers of fixed names",
    "tests/unit/test_checkpoint_copy.py": "the head's rsync daemon on its fixed port (8730) on loopback",
}


def work_unit(nodeid: str) -> str:
    """What runs on one worker, in order: a test's shared-state unit, or else the test alone."""
    return next((prefix for prefix in SHARED_STATE if nodeid.startswith(prefix)), nodeid)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's: which scheduler the controller uses
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedStateScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SharedStateScheduling(config, log)


def pytest_sessionfinish(session):
    """On an xdist worker: hand what the e2e tier recorded to the controller, which prints it."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None and (TIMINGS or HEALS or SCRAPES or EXPOSURE):
        out["dspark_figures"] = json.dumps({"timings": TIMINGS, "heals": HEALS, "scrapes": SCRAPES,
                                            "exposure": EXPOSURE})


@pytest.hookimpl(optionalhook=True)  # defined by pytest-xdist: a worker is done
def pytest_testnodedown(node, error):
    figures = json.loads(getattr(node, "workeroutput", {}).get("dspark_figures") or "{}")
    TIMINGS.update(figures.get("timings", {}))
    HEALS.update(figures.get("heals", {}))
    SCRAPES.update({k: tuple(v) for k, v in figures.get("scrapes", {}).items()})
    EXPOSURE.update(figures.get("exposure", {}))


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:  # the simulated cluster ran: say what it did not exercise, and how long things took
        from sim import adaptations

        terminalreporter.section("e2e: simulated cluster")
        terminalreporter.write_line(adaptations.describe())
        terminalreporter.section("e2e timings (seconds)")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{name:45s} {seconds:8.1f}")
    if SCRAPES:
        terminalreporter.section("Prometheus: each target's last scrape (what it costs)")
        terminalreporter.write_line(f"{'stack job target':55s} {'seconds':>8s} {'samples':>8s}")
        for name, (seconds, samples) in SCRAPES.items():
            terminalreporter.write_line(f"{name:55s} {seconds:8.4f} {samples:8.0f}")
    if EXPOSURE:
        terminalreporter.section("from a host on the management network that belongs to no stack")
        for name, seen in EXPOSURE.items():
            terminalreporter.write_line(f"{name:55s} {seen}")
    if HEALS:
        terminalreporter.section("self-healing: seconds after the fault (no command run)")
        cols = ("detected", "restarted", "serving", "answering")
        terminalreporter.write_line(f"{'fault':45s} " + " ".join(f"{c:>10s}" for c in cols))
        for name, marks in HEALS.items():
            terminalreporter.write_line(f"{name:45s} " + " ".join(
                f"{marks[c]:10.1f}" if marks.get(c) is not None else f"{'-':>10s}" for c in cols))
