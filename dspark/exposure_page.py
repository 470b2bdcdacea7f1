"""docs/exposure.md, generated from the exposure plan (planning/exposure.py) of every checked-in stack:
`python -m dspark.exposure_page` writes it; tests/unit/test_exposure.py fails when the committed page differs."""

from __future__ import annotations

import yaml

from declared.stack import parse_stack
from declared.stackfiles import ROOT, project_stacks
from planning import exposure, stackplan
from planning.exposure import NodeExposure

PAGE = ROOT / "docs" / "exposure.md"
REGENERATE = "python -m dspark.exposure_page"

INTRO = f"""# Who may reach what

What you come here for: what each stack opens on every node, to whom, and how it authenticates; the fence
that holds it; and how to open more. Generated from `planning/exposure.py` by `{REGENERATE}`: edit the
plan, not this page.

Every stack is **closed by default**. From the office network a node answers ssh (from `firewall.operators`)
and, on the node that serves it, the stack's endpoint (from `firewall.clients`); both default to anywhere.
Every other port is an inner one: bound to the narrowest address its software allows, and let through only
from the parts of the stack that use it. vLLM, Ray and PyTorch say their inter-node planes have no
authentication and must be isolated; the fence isolates them.

## The planes

- **loopback**: what only the node itself uses (Prometheus, Alertmanager, the gateway's database);
- **data**: the group's own traffic (NCCL, the rendezvous, Ray, NFS, checkpoint copies), over the ConnectX-7
  links, or the management network with `fabric.bootstrap: management`; none of it authenticates, so only the
  group's other nodes reach it, on any port (NCCL's and Ray's are partly ephemeral);
- **management** (each node's `host`): ssh, the endpoint, and the inner HTTP ports the stack's router,
  gateway, guards and Prometheus reach.

## Who a source is

| source | who |
|---|---|
""" + "".join(f"| `{name}` | {what} |\n" for name, what in exposure.SOURCES.items()) + """
## The fence

Every node gets one nftables table of the stack's own, `inet dspark_<stack>`, whose input chain drops what no
rule lets in (loopback, replies to what the node opened, and ICMP always pass). It never touches the owner's
tables, docker's or ufw's; their drops still apply (an accept in one table does not override a drop in
another). It is applied from where Pulumi runs, and never locks the operator out:

1. the address this machine reaches the node from (`$SSH_CONNECTION` on the node) must pass the new ssh rule,
   or `up` stops before anything changes, naming the rule and the fix;
2. the node checks the rule set (`nft -c`), saves the table it has, arms a rollback, applies the new table in
   one transaction (`nft -f`);
3. a **new** ssh connection (not the shared one: established connections pass whatever the rules say)
   disarms the rollback and installs the boot unit `deepseek-spark-fence-<stack>.service`
   (`Before=docker.service`), so after a power cut the fence is in force before any container starts. If no
   new connection gets through, the node restores its previous rules within `firewall.confirmSeconds`
   (default 60) by itself, and `up` fails naming the ssh rule.

`pulumi preview` shows each node's rule set (the fence command's stdin) and, in its log, one line per node
of what it lets in; `dspark plan` prints every listener; `dspark doctor` compares the fence on each node with
the plan and prints what a host on the management network can reach. Two stacks on the same nodes would
close each other's ports: applying a fence refuses a node that holds another stack's.

## Opening more

```yaml
config:
  deepseek-spark:cluster:
    firewall:
      clients: [10.20.0.0/16]          # who may call the endpoint (default: anywhere)
      operators: [10.20.5.0/24]        # who may ssh to the nodes (default: anywhere); keep Pulumi's machine in it
      scrapers: [10.20.9.7]            # a team's Prometheus: node exporters, guards, the engine's /metrics
      open:                            # a port of your own on every node of the stack
        - {port: 8080, sources: [10.20.0.0/16], why: "the lab's dashboard"}
      # enabled: false                 # no fence at all: every listener answers whoever reaches it
```

An operator reaches an inner port through ssh, as `dspark` and the readiness probe do:

```bash
ssh -N -L 9090:127.0.0.1:9090 <user>@<monitoring node>   # Prometheus, then http://127.0.0.1:9090
ssh -N -L 8888:<head host>:8888 <user>@<head host>         # a group's engine behind the router or gateway
```

## Every stack's listeners
"""


def node_table(ne: NodeExposure) -> str:
    lines = ["| " + " | ".join(exposure.ROW) + " |", "|" + "---|" * len(exposure.ROW)]
    for row in exposure.rows(ne):
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    return "\n".join(lines)


def stack_section(stack: str) -> str:
    cp = stackplan_of(stack)
    out, seen = [f"### `{stack}`", ""], {}
    for ne in cp.exposure:  # nodes with the same listeners (but addresses) share a table
        key = tuple((lst.what, lst.port, lst.plane, lst.sources) for lst in ne.listeners)
        seen.setdefault(key, []).append(ne)
    for nodes in seen.values():
        names = ", ".join(f"{ne.node} ({ne.host})" for ne in nodes)
        out += [f"{names}:", "", node_table(nodes[0]), ""]
    return "\n".join(out)


def render() -> str:
    head = next(iter(stackplan_of("tp3").exposure), None)
    example = f"\nThe fence of `tp3` on {head.node}, as `nft -f` reads it:\n\n```\n{head.ruleset}```\n" if head else ""
    return INTRO + "\n" + "\n".join(stack_section(s) for s in project_stacks()) + example


def stackplan_of(stack: str) -> stackplan.clusterplan.ClusterPlan:
    """The plan of a checked-in stack, from its stack file."""
    doc = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text()) or {}
    return stackplan.build_stack(parse_stack((doc.get("config") or {})["deepseek-spark:cluster"]), stack)


def main() -> int:
    PAGE.write_text(render())
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
