"""programs/memgate.py against a fake /proc (meminfo, process status files) and fake sync/sysctl/sudo/docker."""

import json
import subprocess

import pytest

from programs import memgate


def write_meminfo(path, total_mib, available_mib, cached_mib, free_mib=None):
    free = available_mib if free_mib is None else free_mib
    path.write_text(
        f"MemTotal:       {total_mib * 1024} kB\nMemFree:        {free * 1024} kB\n"
        f"MemAvailable:   {available_mib * 1024} kB\nBuffers:          1024 kB\nCached:         {cached_mib * 1024} kB\n"
        "HugePages_Total:       0\n"
    )


@pytest.fixture
def node(tmp_path):
    """A fake node: /proc/meminfo, three processes, and a `run` that records what was executed. A drop
    (sysctl vm.drop_caches=3) moves the cached figure into available, as the kernel does."""
    proc = tmp_path / "proc"
    for pid, name, rss in ((1, "systemd", 12), (812, "dockerd", 80), (4242, "python3", 96000)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "status").write_text(f"Name:\t{name}\nPid:\t{pid}\nVmRSS:\t{rss * 1024} kB\n")
    (proc / "self").mkdir()
    meminfo = proc / "meminfo"
    state = {"calls": [], "sudo_ok": True, "cached": 40000, "available": 30000}

    def write():
        write_meminfo(meminfo, 124620, state["available"], state["cached"])

    def run(argv, **kw):
        state["calls"].append(argv)
        if argv[0] == "sudo" and not state["sudo_ok"]:
            return subprocess.CompletedProcess(argv, 1, "", "sudo: a password is required\n")
        if argv[-1] == "vm.drop_caches=3":
            state["available"] += state["cached"] - 900
            state["cached"] = 900
            write()
        if argv[0] == "docker":
            return subprocess.CompletedProcess(argv, 0, "other-model 93.1GiB / 120GiB\n", "")
        return subprocess.CompletedProcess(argv, 0, "", "")

    write()
    return state, run, str(meminfo), str(proc)


def gate(node, *args, euid=1000):
    state, run, meminfo, proc = node
    return memgate.main(["--node", "spark2", "--role", "worker", *args], run=run, meminfo_path=meminfo, proc=proc,
                        euid=euid)  # fmt: skip


def report(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1].removeprefix(memgate.REPORT_PREFIX))


def test_the_drop_runs_after_sync_through_the_narrow_sudo_rule_and_frees_the_cache(node, capsys):
    assert gate(node, "--need-mib", "60000") == 0
    state = node[0]
    assert state["calls"][0] == ["sync"]
    assert state["calls"][1] == ["sudo", "-n", "/usr/sbin/sysctl", "-w", "vm.drop_caches=3"]
    figures = report(capsys.readouterr().out)
    assert figures == {"node": "spark2", "role": "worker", "totalMiB": 124620, "availableMiB": 69100, "freeMiB": 69100,
                       "cachedBeforeMiB": 40000, "cachedMiB": 900, "needMiB": 60000, "dropped": True, "ok": True}


def test_root_drops_without_sudo(node):
    assert gate(node, "--need-mib", "1000", euid=0) == 0
    assert node[0]["calls"][1] == ["/usr/sbin/sysctl", "-w", "vm.drop_caches=3"]


def test_a_shortfall_names_the_node_the_figures_and_what_holds_memory(node, capsys):
    assert gate(node, "--need-mib", "110000") == 1
    out = capsys.readouterr()
    assert "memory spark2: FAIL available: 69100 MiB available (after dropping the page cache: 40000 -> 900 MiB " \
           "cached) of 124620 MiB, the memory plan needs 110000 MiB for the worker rank" in out.err
    # the largest process first, then the running containers as docker reports them
    assert "largest processes: python3 (pid 4242) 96000 MiB, dockerd (pid 812) 80 MiB" in out.err
    assert "containers: other-model 93.1GiB / 120GiB" in out.err
    assert "Fix: stop what holds the memory" in out.err
    assert report(out.out)["ok"] is False


def test_without_the_sudo_rule_the_gate_refuses_and_prints_the_rule(node, capsys):
    node[0]["sudo_ok"] = False
    assert gate(node, "--need-mib", "1000") == 1
    err = capsys.readouterr().err
    assert "FAIL page-cache: cannot drop the page cache" in err and "sudo: a password is required" in err
    assert "NOPASSWD: /usr/sbin/sysctl -w vm.drop_caches=3'" in err and "memory.dropCaches: false" in err


def test_no_drop_checks_the_figures_as_they_are(node, capsys):
    assert gate(node, "--need-mib", "60000", "--no-drop") == 1  # 30000 available while 40000 sit in the cache
    assert not any(c[-1] == "vm.drop_caches=3" for c in node[0]["calls"])
    assert "without dropping the page cache" in capsys.readouterr().err


def test_report_only_never_drops_and_never_fails(node, capsys):
    assert gate(node, "--need-mib", "999999", "--report-only") == 0
    assert node[0]["calls"] == []
    assert report(capsys.readouterr().out)["ok"] is False


def test_the_sudoers_rule_allows_exactly_the_drop():
    assert memgate.sudoers_rule("zurih") == "zurih ALL=(root) NOPASSWD: /usr/sbin/sysctl -w vm.drop_caches=3"


def test_it_reads_this_machines_real_meminfo():
    figures = memgate.meminfo()
    assert figures["MemTotal"] > 0 and 0 < figures["MemAvailable"] <= figures["MemTotal"]


def test_a_sync_that_does_not_finish_is_a_clear_refusal_not_a_traceback(node, capsys):
    state, run, meminfo, proc = node

    def slow(argv, **kw):
        if argv == ["sync"]:
            raise subprocess.TimeoutExpired(argv, kw.get("timeout"))
        return run(argv, **kw)

    assert memgate.main(["--node", "spark2", "--need-mib", "1000"], run=slow, meminfo_path=meminfo, proc=proc,
                        euid=0) == 1  # fmt: skip
    assert "sync did not finish within 300 s" in capsys.readouterr().err
