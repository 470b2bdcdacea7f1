"""Credentials made where Pulumi runs and kept in its state as secrets (the gateway's keys, a group's
guard token): one local command each, whose output is the credential."""

from __future__ import annotations

import pulumi
from pulumi_command import local


def generated_key(name: str, command: str, triggers: list, parent: pulumi.Resource) -> pulumi.Output:
    """A random credential, made once where Pulumi runs and kept in the state as a secret."""
    cmd = local.Command(
        name,
        create=command,
        triggers=triggers,
        logging=local.Logging.NONE,
        add_previous_output_in_env=False,
        # The key is the command's stdout: the state must hold it encrypted.
        opts=pulumi.ResourceOptions(parent=parent, additional_secret_outputs=["stdout"]),
    )
    return pulumi.Output.secret(cmd.stdout.apply(lambda s: s.strip()))
