"""The fence on one node: the stack's nftables table (planning/exposure.py renders it), applied from where Pulumi
runs over the system ssh (the docker provider's options), so that it can never lock the operator out:

1. a connection to the node says from which address this machine reaches it (`$SSH_CONNECTION`): an address the
   new ssh rule does not let in is refused before anything changes on the node, naming the rule;
2. on the node: the rule set (stdin) checked with `nft -c`, the table as it is now saved, a rollback armed that
   restores it after `--confirm` seconds, then the new table applied in one transaction (`nft -f`: our table only);
3. a NEW ssh connection (no shared master; established connections would pass whatever the rules say) disarms the
   rollback and makes the fence the one loaded at boot: a systemd unit ordered before docker.service, so after a
   power cut the fence is in force before any container starts. When that connection fails, nothing disarms the
   rollback: the node restores its previous rules by itself, and this fails naming the ssh rule.

`remove` takes the table, the unit and the files away (destroy). Standard library only.

    python3 -m programs.fence apply --stack S --node spark1 --target root@10.0.0.1 --port 22 --table dspark_S \
        --ssh-port 22 --operators 0.0.0.0/0 --confirm 60 [--ssh-opt=...] < fence.nft
    python3 -m programs.fence remove --stack S --node spark1 --target root@10.0.0.1 --port 22 --table dspark_S
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import shlex
import subprocess
import sys
from typing import Callable, Optional

DIR = "/etc/deepseek-spark"
UNIT_DIR = "/etc/systemd/system"

# The node's side, run by `sh -c` with its arguments; the rule set on stdin. Root, or passwordless sudo.
PRELUDE = r"""set -eu
S=""; [ "$(id -u)" = 0 ] || S="sudo -n"
NFT=$(command -v nft 2>/dev/null || echo /usr/sbin/nft)
[ -x "$NFT" ] || { echo "nft is missing on this node: install Debian's nftables (apt install nftables)" >&2; exit 3; }
d=/etc/deepseek-spark
"""

APPLY = PRELUDE + r"""table=$1 stack=$2 confirm=$3
new="$d/fence-$stack.new" prev="$d/fence-$stack.prev" pidf="$d/fence-$stack.rollback"
$S mkdir -p "$d"
$S sh -c "cat > '$new'"
other=$($S "$NFT" list tables | awk -v t="$table" '$2 == "inet" && $3 ~ /^dspark_/ && $3 != t { print $3; exit }')
if [ -n "$other" ]; then
  echo "the node holds another stack's fence (table inet $other): two stacks' fences close each other's ports; destroy that stack first (or: nft delete table inet $other)" >&2
  exit 4
fi
$S "$NFT" -c -f "$new"
{ printf 'table inet %s {}\ndelete table inet %s\n' "$table" "$table"; $S "$NFT" list table inet "$table" 2>/dev/null || true; } \
  | $S sh -c "cat > '$prev'"
if [ -s "$pidf" ]; then $S kill "$(cat "$pidf")" 2>/dev/null || true; fi
$S sh -c "setsid sh -c 'echo \$\$ > \"$pidf\"; sleep $confirm; \"$NFT\" -f \"$prev\" && echo \"\$(date -u) rolled back: no ssh confirmed the new fence in ${confirm}s\" >> \"$d/fence-$stack.log\"; rm -f \"$pidf\"' </dev/null >/dev/null 2>&1 &"
for _ in 1 2 3 4 5 6 7 8 9 10; do [ -s "$pidf" ] && break; sleep 0.1; done
[ -s "$pidf" ] || { echo "the rollback did not start: nothing applied" >&2; exit 5; }
$S "$NFT" -f "$new"
echo "applied table inet $table; the previous rules come back in ${confirm}s unless a new ssh connection confirms"
"""

CONFIRM = PRELUDE + r"""table=$1 stack=$2 unit=$3 text=$4
new="$d/fence-$stack.new" prev="$d/fence-$stack.prev" pidf="$d/fence-$stack.rollback"
[ -s "$pidf" ] || { echo "no rollback is armed: the fence was rolled back already, or never applied" >&2; exit 5; }
$S kill "$(cat "$pidf")"
$S rm -f "$pidf" "$prev"
$S mv "$new" "$d/fence-$stack.nft"
$S "$NFT" list table inet "$table" | $S sh -c "cat > '$d/fence-$stack.live'"
printf '%s' "$text" | $S sh -c "cat > '/etc/systemd/system/$unit'"
$S systemctl daemon-reload
$S systemctl enable "$unit" >/dev/null 2>&1
echo "confirmed by a new ssh connection; loaded at boot before docker.service ($unit)"
"""

REMOVE = PRELUDE + r"""table=$1 stack=$2 unit=$3
pidf="$d/fence-$stack.rollback"
if [ -s "$pidf" ]; then $S kill "$(cat "$pidf")" 2>/dev/null || true; fi
printf 'table inet %s {}\ndelete table inet %s\n' "$table" "$table" | $S "$NFT" -f -
$S systemctl disable "$unit" >/dev/null 2>&1 || true
$S rm -f "/etc/systemd/system/$unit" "$d/fence-$stack.nft" "$d/fence-$stack.new" "$d/fence-$stack.prev" \
  "$d/fence-$stack.live" "$pidf"
$S systemctl daemon-reload || true
echo "removed table inet $table and $unit"
"""


def unit_name(stack: str) -> str:
    return f"deepseek-spark-fence-{stack}.service"


def unit_text(stack: str, table: str) -> str:
    """The boot unit: the fence loaded before the network and docker come up (after an owner's own nftables
    service, whose `flush ruleset` would otherwise clear it), kept when stopped (no ExecStop: stopping it must
    not open the node)."""
    return (f"[Unit]\nDescription=deepseek-spark: the fence of stack {stack} (table inet {table})\n"
            "DefaultDependencies=no\nWants=network-pre.target\n"
            "Before=network-pre.target docker.service containerd.service shutdown.target\n"
            "After=nftables.service\nConflicts=shutdown.target\n\n"
            f"[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/usr/sbin/nft -f {DIR}/fence-{stack}.nft\n\n"
            "[Install]\nWantedBy=sysinit.target\n")  # fmt: skip


def client_address(ssh_connection: str) -> Optional[str]:
    """This machine's address as the node sees it: the first field of the node's $SSH_CONNECTION."""
    fields = ssh_connection.split()
    return fields[0] if len(fields) == 4 else None


def admitted(address: str, operators: list[str]) -> bool:
    ip = ipaddress.ip_address(address)
    if ip.version == 6:  # an IPv6 session: the rule lets IPv6 in only when operators is anywhere
        return "0.0.0.0/0" in operators
    return any(ip in ipaddress.ip_network(n) for n in operators)


class Node:
    """The node over the system ssh: `shared` (the stack's usual connection, master included) or a new one."""

    def __init__(self, a: argparse.Namespace, run: Callable = subprocess.run):
        self.a, self.run = a, run

    def sh(self, script: str, args: list[str], stdin: str = "", fresh: bool = False,
           timeout: float = 120) -> subprocess.CompletedProcess:  # fmt: skip
        opts = without_master(self.a.ssh_opt) + ["-o", "ControlMaster=no", "-o", "ControlPath=none"] if fresh \
            else list(self.a.ssh_opt)  # fresh: a new TCP connection, as a new operator's, with no master to ride on
        remote = "sh -c " + shlex.quote(script) + " fence " + " ".join(shlex.quote(x) for x in args)
        argv = ["ssh", *opts, "-p", str(self.a.port), self.a.target, remote]
        try:
            return self.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 255, "", f"ssh timed out after {timeout:.0f}s")


def without_master(opts: list[str]) -> list[str]:
    """The ssh options (one word each: `-o`, `X=Y`, ...) less the shared-connection ones (Control*)."""
    out, i = [], 0
    while i < len(opts):
        pair = opts[i:i + 2] if opts[i] == "-o" else opts[i:i + 1]
        if not pair[-1].removeprefix("-o").startswith("Control"):
            out += pair
        i += len(pair)
    return out


def apply(a: argparse.Namespace, rules: str, out=sys.stdout, run: Callable = subprocess.run) -> int:
    node, where = Node(a, run), f"fence on {a.node}"
    ssh_rule = f"tcp dport {a.ssh_port} ip saddr @operators accept (firewall.operators: {', '.join(a.operators)})"
    seen = node.sh('echo "$SSH_CONNECTION"', [])
    if seen.returncode != 0:
        out.write(f"{where}: cannot reach the node over ssh ({seen.returncode}): {seen.stderr.strip()[-400:]}\n")
        return 1
    address = client_address(seen.stdout.strip())
    if address is None or not admitted(address, a.operators):
        out.write(f"{where}: refused, nothing changed on the node: this machine reaches it from {address or '?'}, "
                  f"which the new ssh rule `{ssh_rule}` does not let in, so the next connection of this `up` (and "
                  f"yours) would be cut; fix: add {address or 'this machine'} to cluster.firewall.operators\n")  # fmt: skip
        return 1
    applied = node.sh(APPLY, [a.table, a.stack, str(a.confirm)], stdin=rules)
    if applied.returncode != 0:
        out.write(f"{where}: not applied, the node keeps its rules ({applied.returncode}): "
                  f"{(applied.stderr or applied.stdout).strip()[-800:]}\n")  # fmt: skip
        return 1
    out.write(f"{where}: {applied.stdout.strip()}\n")
    confirmed = node.sh(CONFIRM, [a.table, a.stack, unit_name(a.stack), unit_text(a.stack, a.table)], fresh=True,
                        timeout=max(10.0, a.confirm - 5.0))  # fmt: skip
    if confirmed.returncode != 0:
        out.write(f"{where}: a new ssh connection from here failed once the fence was applied ({confirmed.returncode}: "
                  f"{confirmed.stderr.strip()[-300:]}); the rule `{ssh_rule}` does not let this machine in, so the "
                  f"node restores its previous rules within {a.confirm}s by itself; fix firewall.operators\n")  # fmt: skip
        return 1
    out.write(f"{where}: {confirmed.stdout.strip()} (rules {hashlib.sha256(rules.encode()).hexdigest()[:16]})\n")
    return 0


def remove(a: argparse.Namespace, out=sys.stdout, run: Callable = subprocess.run) -> int:
    done = Node(a, run).sh(REMOVE, [a.table, a.stack, unit_name(a.stack)])
    if done.returncode != 0:
        out.write(f"fence on {a.node}: not removed ({done.returncode}): {(done.stderr or done.stdout).strip()[-600:]}\n")
        return 1
    out.write(f"fence on {a.node}: {done.stdout.strip()}\n")
    return 0


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m programs.fence", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("action", choices=("apply", "remove"))
    p.add_argument("--stack", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--target", required=True, help="user@host")
    p.add_argument("--port", type=int, default=22, help="the node's ssh port")
    p.add_argument("--table", required=True)
    p.add_argument("--ssh-port", type=int, default=22, help="the port the ssh rule lets in")
    p.add_argument("--operators", nargs="*", default=["0.0.0.0/0"])
    p.add_argument("--confirm", type=int, default=60, help="seconds before an unconfirmed fence is rolled back")
    p.add_argument("--ssh-opt", action="append", default=[], help="the system ssh's options (repeatable)")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    a = parse(argv)
    return apply(a, sys.stdin.read()) if a.action == "apply" else remove(a)


if __name__ == "__main__":
    sys.exit(main())
