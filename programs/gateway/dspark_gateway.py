"""What LiteLLM's config.yaml names (custom_auth, callbacks). LiteLLM executes this file anew for every
setting that names it (importlib, by path), so the hooks and their state (the database connection, the
usage totals, the Prometheus collector) live in gateway_hooks, imported once through sys.path."""

from gateway_hooks import usage_logger, user_api_key_auth

__all__ = ["usage_logger", "user_api_key_auth"]
