"""Credentials made where Pulumi runs and kept in its state as secrets (the gateway's keys, a group's
guard token): one local command each, whose output is the credential. A credential changes only on purpose:
its `triggers` (a member's rotation) or `pulumi up --replace <urn>`, both shown in the preview as a replace;
any other change of the command (a new generator, a moved Python) is an update that prints the kept value."""

from __future__ import annotations

import pulumi
from pulumi_command import local

# An update re-prints the credential the state holds (pulumi-command puts the previous stdout in the environment of
# the next run: addPreviousOutputInEnv, on by default), so no change but a replace makes a new one.
KEEP = 'printf "%s\\n" "$PULUMI_COMMAND_STDOUT"'


def generated_key(name: str, command: str, triggers: list, parent: pulumi.Resource) -> pulumi.Output:
    """A random credential, made once where Pulumi runs and kept in the state as a secret."""
    cmd = local.Command(
        name,
        create=command,
        update=KEEP,
        triggers=triggers,
        logging=local.Logging.NONE,
        add_previous_output_in_env=True,
        # The key is the command's stdout: the state must hold it encrypted.
        opts=pulumi.ResourceOptions(parent=parent, additional_secret_outputs=["stdout"]),
    )
    return pulumi.Output.secret(cmd.stdout.apply(lambda s: s.strip()))
