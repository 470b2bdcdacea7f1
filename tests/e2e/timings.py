"""Wall-clock timings the e2e scenario records; printed in pytest's terminal summary."""

TIMINGS: dict[str, float] = {}
# Self-healing: per fault, seconds from the fault to the guard's detection, its group restart, the group serving
# again (the guard's journal) and a client's first answer (measured from outside).
HEALS: dict[str, dict[str, float]] = {}
# Prometheus's scrape of each target: "<stack> <job> <host:port>" -> (seconds of its last scrape, samples it served).
SCRAPES: dict[str, tuple[float, float]] = {}
# What a host on the management network that belongs to no stack saw (tests/e2e/exposure.py):
# "<stack> <phase> <node> <port>" -> the listener the plan names there; "<stack> anonymous GET <path>" -> its status.
EXPOSURE: dict[str, str] = {}
