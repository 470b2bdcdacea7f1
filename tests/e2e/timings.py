"""Wall-clock timings the e2e scenario records; printed in pytest's terminal summary."""

TIMINGS: dict[str, float] = {}
