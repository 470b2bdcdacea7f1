"""TEST DOUBLE entry point: ``python3 -m sglang.launch_server`` (simulator stand-in)."""
import sys

from .server import main

if __name__ == "__main__":
    sys.exit(main(engine="sglang"))
