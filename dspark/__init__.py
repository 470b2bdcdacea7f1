"""dspark: the operator CLI of a deepseek-spark stack.

    python -m dspark plan   --stack tp4 [--json]                  # what each node runs (no Pulumi, no nodes)
    python -m dspark status --stack tp4 [--json] [--watch 30]     # ranks, revision, health; exit 0/1/2
    python -m dspark logs   --stack tp4 [--rank 0] [--follow] [--since 10m] [--tail 100]
    python -m dspark doctor --stack tp4 [--json]                  # preflight now + drift, each with its fix
    python -m dspark smoke  --stack tp4 [--json]                  # one chat completion, one streamed
    python -m dspark bench  --stack tp4 [--concurrency 1,2,4,8,16] [--out DIR] [--tokenizer tokenizer.json]
                                                                  # llama-benchy: raw results, a plot, the seed's figures
    python -m dspark repair --stack tp4 [--yes]                   # drift only: refresh + up (for a timer)
    python -m dspark restart --stack tp4 [--yes]                  # the group over, as a whole (a rank is down)
    python -m dspark diagnose --stack tp4 [--out FILE]            # one support file for an issue, no secret in it

It reads the stack's config from `Pulumi.<stack>.yaml` (`--project-dir`, default the current
directory) and, for the commands that need them, the stack's outputs (`--outputs-file`, or
`pulumi stack output --json --show-secrets --stack <stack>`). It reaches the nodes the way the
program does: the system `ssh` with the stack's ssh options (`planning.commands.ssh_opts`). The
API key is never printed: every line read from a node or the endpoint is redacted.

Exit codes: status 0 healthy, 1 degraded, 2 down; doctor 1 when it found something; smoke 1 when a
request failed or missed the expected answer; bench 1 when llama-benchy failed; repair 0 no drift or
repaired, 1 failed, 2 drift found without --yes, 4 a config change is pending; restart 0 restarted,
1 failed, 2 preview only (no --yes); diagnose 0 once its file is written; 3 whenever dspark
itself cannot run (arguments, config, outputs). `--group NAME` picks a group of a stack with groups.
"""
