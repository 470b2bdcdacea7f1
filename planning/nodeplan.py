"""What the program creates on one node of a group: its connection, its checks, its checkpoint volume and
what fills it (a download, an engram shard). A leaf of the plan (planning/clusterplan.py holds it in a
StackPlan; the gateway and the monitoring are placed on a NodePlan); stackplan.build computes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class DownloadPlan:
    """model.source: download on a node that holds a copy: fetched once per revision (the head from the
    hub; with share.mode: local, each worker copies the head's over ConnectX-7: `from_head`)."""

    create: str
    triggers: tuple[str, ...]
    from_head: bool = False


@dataclass(frozen=True)
class ShardPlan:
    """The node's engram shard (SGLang): packed once per checkpoint revision, TP layout and rank."""

    files: tuple[str, ...]
    create: str
    delete: str
    triggers: tuple[str, ...]
    retain: bool


@dataclass(frozen=True)
class NodePlan:
    name: str
    rank: int
    host: str
    fabric_ip: str
    ssh_port: int
    ssh_user: str
    docker_host: str  # ssh://user@host[:port] for the docker provider
    ssh_opts: tuple[str, ...]  # the system ssh client's options (docker provider, readiness probe)
    host_key: Optional[str]  # pinned for remote commands; None: not verified
    dial_error_limit: int  # remote commands: failed dials before giving up (ssh.dialErrorLimit)
    per_dial_timeout: int  # remote commands: seconds per TCP connect (ssh.perDialTimeout)
    preflight: str  # read-only checks (commands.preflight)
    volume_name: str
    volume_options: dict[str, str]  # the checkpoint volume's driver_opts on this node
    download: Optional[DownloadPlan]
    shard: Optional[ShardPlan]

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"
