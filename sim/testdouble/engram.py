"""Fake checkpoint + engram pack (TEST DOUBLE, stdlib only).

Checkpoint layout (``/srv/models/DS4.1`` on every simulated node, identical everywhere)::

    config.json
    model-0000{1..4}-of-00004.safetensors     small deterministic blobs
    engram/index.json                         {"record_size": 264, "layers": {"1": {"file", "rows"}}}
    engram/layer<L>.bin                       rows * 264-byte records, no header

Packed shard ``engram-l<L>-r<R>of<TP>.bin``: a 4096-byte header (magic ``DSV41EN1`` then
little-endian u32 layer, u64 lo, u64 hi, u64 rows, u32 record_size, zero padded) followed by
records ``lo .. hi`` of that layer, where rank R owns ``rows*R//TP .. rows*(R+1)//TP``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys

RECORD_SIZE = 264
HEADER_SIZE = 4096
MAGIC = b"DSV41EN1"
HEADER_FMT = "<8sIQQQI"
# layer -> rows (deliberately not divisible by 3 or 4, so uneven splits are exercised)
LAYER_ROWS = {1: 4099, 14: 3001}
SAFETENSOR_SHARDS = 4


def record(layer: int, row: int) -> bytes:
    head = struct.pack("<II", layer, row)
    seed = (layer * 131 + row * 7) & 0xFF
    body = bytes((seed + i) & 0xFF for i in range(RECORD_SIZE - len(head)))
    return head + body


def checkpoint_files() -> dict[str, bytes]:
    """Relative path -> content of the fake checkpoint (deterministic)."""
    files: dict[str, bytes] = {}
    config = {
        "_comment": "SIMULATOR STAND-IN: fake DeepSeek-V4.1-Flash checkpoint (test double)",
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "num_hidden_layers": 2,
        "engram_layers": sorted(LAYER_ROWS),
    }
    files["config.json"] = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
    # DSPARK's draft weights, bundled as a dspark/ subfolder (what argcheck looks for)
    files["dspark/config.json"] = b'{"_comment": "SIMULATOR STAND-IN: fake DSPARK draft model (test double)"}\n'
    for i in range(1, SAFETENSOR_SHARDS + 1):
        name = f"model-{i:05d}-of-{SAFETENSOR_SHARDS:05d}.safetensors"
        header = json.dumps({"__metadata__": {"format": "pt", "sim": "test-double", "shard": str(i)}}).encode()
        payload = hashlib.sha256(name.encode()).digest() * 32
        files[name] = struct.pack("<Q", len(header)) + header + payload
    index = {"record_size": RECORD_SIZE, "layers": {}}
    for layer, rows in sorted(LAYER_ROWS.items()):
        fname = f"layer{layer}.bin"
        index["layers"][str(layer)] = {"file": fname, "rows": rows}
        files[f"engram/{fname}"] = b"".join(record(layer, r) for r in range(rows))
    files["engram/index.json"] = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
    return files


def shard_range(rows: int, rank: int, tp: int) -> tuple[int, int]:
    if tp < 1 or not 0 <= rank < tp:
        raise ValueError(f"rank {rank} out of range for tp {tp}")
    return rows * rank // tp, rows * (rank + 1) // tp


def shard_name(layer: int, rank: int, tp: int) -> str:
    return f"engram-l{layer}-r{rank}of{tp}.bin"


def shard_size(rows: int, rank: int, tp: int, record_size: int = RECORD_SIZE) -> int:
    lo, hi = shard_range(rows, rank, tp)
    return HEADER_SIZE + (hi - lo) * record_size


def header(layer: int, lo: int, hi: int, record_size: int = RECORD_SIZE) -> bytes:
    h = struct.pack(HEADER_FMT, MAGIC, layer, lo, hi, hi - lo, record_size)
    return h + b"\0" * (HEADER_SIZE - len(h))


def parse_header(data: bytes) -> dict:
    magic, layer, lo, hi, rows, rs = struct.unpack_from(HEADER_FMT, data)
    if magic != MAGIC:
        raise ValueError("bad magic")
    return {"layer": layer, "lo": lo, "hi": hi, "rows": rows, "record_size": rs}


def pack(model: str, out: str, rank: int, tp: int, layers: list[int] | None = None,
         chunk_rows: int = 1024, log=print) -> list[dict]:
    """Pack rank ``rank`` of ``tp``; idempotent (a file of the exact expected size is skipped)."""
    with open(os.path.join(model, "engram", "index.json")) as f:
        index = json.load(f)
    rs = int(index["record_size"])
    available = {int(k): v for k, v in index["layers"].items()}
    wanted = sorted(available) if not layers else layers
    missing = [l for l in wanted if l not in available]
    if missing:
        raise SystemExit(f"pack_engram: layer(s) {missing} not in checkpoint (have {sorted(available)})")
    os.makedirs(out, exist_ok=True)
    results = []
    for layer in wanted:
        rows = int(available[layer]["rows"])
        lo, hi = shard_range(rows, rank, tp)
        dest = os.path.join(out, shard_name(layer, rank, tp))
        expected = HEADER_SIZE + (hi - lo) * rs
        if os.path.exists(dest) and os.path.getsize(dest) == expected:
            log(f"skip {dest}: already packed ({expected} bytes, rows {lo}..{hi})")
            results.append({"file": dest, "action": "skip", "size": expected, "lo": lo, "hi": hi})
            continue
        tmp = dest + ".partial"
        src = os.path.join(model, "engram", available[layer]["file"])
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            fout.write(header(layer, lo, hi, rs))
            fin.seek(lo * rs)
            left = hi - lo
            while left > 0:
                n = min(left, max(1, chunk_rows))
                buf = fin.read(n * rs)
                if len(buf) != n * rs:
                    raise SystemExit(f"pack_engram: short read in {src}")
                fout.write(buf)
                left -= n
            fout.flush()
            os.fsync(fout.fileno())
        os.rename(tmp, dest)
        dfd = os.open(out, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        log(f"packed {dest}: layer {layer} rows {lo}..{hi} of {rows} ({expected} bytes)")
        results.append({"file": dest, "action": "packed", "size": expected, "lo": lo, "hi": hi})
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pack_engram.py",
                                description="TEST DOUBLE engram packer (simulator stand-in)",
                                allow_abbrev=False)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--layers", default=None, help="comma separated, e.g. 1,14 (default: all)")
    p.add_argument("--chunk-rows", type=int, default=1024)
    a = p.parse_args(argv)
    if a.tp < 1 or not 0 <= a.rank < a.tp:
        p.error(f"--rank {a.rank} must be in 0..{a.tp - 1}")
    layers = [int(x) for x in a.layers.split(",") if x.strip()] if a.layers else None
    pack(a.model, a.out, a.rank, a.tp, layers, a.chunk_rows, log=lambda m: print(m, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
