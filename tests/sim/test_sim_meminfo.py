"""sim/meminfo.py's pure part: the figures a node's /proc/meminfo shows, read back by the real gate's parser."""

from programs import memgate
from sim import meminfo


def test_a_fresh_node_shows_a_sparks_memory_with_an_empty_cache(tmp_path):
    f = meminfo.figures(meminfo.DEFAULT_MODEL, 0)
    path = tmp_path / "meminfo"
    path.write_text(meminfo.render(f))
    read = memgate.meminfo(str(path))
    assert read["MemTotal"] == 124620 and read["Cached"] == 600
    assert read["MemAvailable"] == 124620 - 2400 - 600 + 540 and read["MemFree"] == 124620 - 2400 - 600


def test_written_files_fill_the_cache_scaled_and_capped_and_mostly_count_as_available():
    f = meminfo.figures(meminfo.DEFAULT_MODEL, 100 * 1024)  # 100 KiB of sim files ~ 25 GiB
    assert f["cached"] == 600 + 25600 and f["available"] == f["free"] + f["cached"] * 9 // 10
    full = meminfo.figures(meminfo.DEFAULT_MODEL, 1879298)  # the whole fake checkpoint: ~460 GiB, capped
    assert full["free"] == 256 and full["cached"] == 124620 - 2400 - 256


def test_held_memory_is_used_and_not_available():
    model = {**meminfo.DEFAULT_MODEL, "holds": {"sim-memory-hold": {"mib": 118000, "pid": 1}}}
    f = meminfo.figures(model, 0)
    assert f["used"] == 120400 and f["available"] == 124620 - 120400 - 600 + 540


def test_the_layout_is_the_kernels():
    text = meminfo.render(meminfo.figures(meminfo.DEFAULT_MODEL, 0))
    assert text.splitlines()[0] == "MemTotal:       127610880 kB"
    assert "HugePages_Total:       0\n" in text and text.endswith("Hugepagesize:       2048 kB\n")
