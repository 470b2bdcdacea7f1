"""Fixture program of tests/unit/test_language_host.py: what the language host gave it, as outputs."""
import os
import sys

import pulumi

cfg = pulumi.Config()
if cfg.get_bool("explode"):
    def helper():
        raise ValueError("boom from the fixture program")
    helper()

pulumi.export("greeting", cfg.require("greeting"))
pulumi.export("secret_len", cfg.require_secret("token").apply(len))
pulumi.export("stack", pulumi.get_stack())
pulumi.export("project", pulumi.get_project())
pulumi.export("dry_run", pulumi.runtime.is_dry_run())
pulumi.export("cwd", os.getcwd())
pulumi.export("python", sys.executable)
pulumi.export("virtual_env", os.environ.get("VIRTUAL_ENV"))
pulumi.export("secret_keys", os.environ.get("PULUMI_CONFIG_SECRET_KEYS"))
if cfg.get_bool("makeForbidden"):
    pulumi.ComponentResource("lhfixture:index:Forbidden", "bad-box")
