"""What a client needs to reach the endpoint (pure): the `client_config` stack output and the LiteLLM
entry in it. `dspark.clients` renders the other formats from the same pieces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Client:
    base_url: str  # ends in /v1
    api_key: str
    model: str
    stack: str = ""
    ca_pem: Optional[str] = None  # the CA an https endpoint is verified with (the front door's); None: the system's

    @property
    def chat_completions_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


def litellm_config(c: Client, key_env: Optional[str] = None) -> dict:
    """LiteLLM proxy config: one model_list entry routed to the endpoint as an OpenAI-compatible API.
    `key_env`: reference the key as `os.environ/NAME` instead of writing it into the file."""
    return {
        "model_list": [
            {
                "model_name": c.model,
                "litellm_params": {
                    "model": f"openai/{c.model}",
                    "api_base": c.base_url,
                    "api_key": f"os.environ/{key_env}" if key_env else c.api_key,
                },
            }
        ]
    }


def client_config(endpoint: str, model: str, api_key: str, ca_pem: Optional[str] = None) -> dict:
    """What an OpenAI SDK, curl or a gateway needs (holds the key: exported as a secret); `ca_pem`: the CA its https
    endpoint is verified with (`dspark.clients` writes it to a file each format points at)."""
    return {
        **({"ca_pem": ca_pem} if ca_pem else {}),
        "base_url": endpoint,
        "api_key": api_key,
        "model": model,
        "openai_env": {"OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": api_key, "OPENAI_MODEL": model},
        "litellm": litellm_config(Client(endpoint, api_key, model))["model_list"][0],
    }
