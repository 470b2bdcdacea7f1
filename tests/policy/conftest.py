import pytest
from policy_helpers import STACKS

from harness import Recording, run_program


@pytest.fixture(scope="session")
def recordings() -> dict[str, Recording]:
    """tp3 and tp4 as the program registers them (run once per session)."""
    return {stack: run_program(stack) for stack in STACKS}
