"""`logs`: `docker logs` of each rank over ssh, every line prefixed with its rank and node, the API
key redacted. `--follow` streams one rank (`--rank N`), redacting line by line. `--nccl` keeps only
NCCL's device and transport lines (`NET/IB : Using ...`, `... via NET/IB/0`) and its warnings, which
NCCL logs at serving.ncclDebug: true.

Output (text only): `[rank0 spark1] <line>` per line; for a rank whose log cannot be read, one line
`[rank1 spark2] (no log: <why>)` on stderr. Exit code 0, or 1 when a rank's log could not be read.
"""

from __future__ import annotations

from typing import Optional, TextIO

from programs import bootlog

from .nodes import Nodes, logs_cmd, redact
from .stack import DsparkError, Stack


def run(stack: Stack, nodes: Nodes, out: TextIO, err: TextIO, rank: Optional[int] = None, follow: bool = False,
        since: Optional[str] = None, tail: str = "100", nccl: bool = False) -> int:  # fmt: skip
    """`nccl`: only NCCL's device and transport lines (and its warnings), as serving.ncclDebug logs them."""
    if rank is not None and not 0 <= rank < len(nodes):
        raise DsparkError(f"--rank {rank}: stack {stack.short} has ranks 0..{len(nodes) - 1}")
    if follow and rank is None:
        raise DsparkError("--follow streams one rank: add --rank N (0 is the head, which serves the API)")
    key = stack.require_key("to redact it from the logs")
    selected = [nodes[rank]] if rank is not None else list(nodes)
    if follow:
        node = selected[0]
        prefix = f"[{node.label()}] "
        try:
            for line in nodes.stream(node, logs_cmd(node.container, tail=tail, since=since, follow=True)):
                if nccl and not bootlog.NCCL_TRANSPORT_LINE.search(line):
                    continue
                out.write(prefix + redact(line, key) + "\n")
                out.flush()
        except KeyboardInterrupt:
            pass
        return 0
    results = nodes.each(lambda n: nodes.run(n, logs_cmd(n.container, tail=tail, since=since)), selected)
    failed = 0
    for node, (code, text) in zip(selected, results):
        prefix = f"[{node.label()}] "
        text = redact(text, key)
        if code != 0:
            failed += 1
            why = text.strip().splitlines()[-1] if text.strip() else f"exit code {code}"
            err.write(f"{prefix}(no log: {why})\n")
            continue
        for line in text.splitlines():
            if not nccl or bootlog.NCCL_TRANSPORT_LINE.search(line):
                out.write(prefix + line + "\n")
    out.flush()
    return 1 if failed else 0
