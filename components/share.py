"""CheckpointShare: the checkpoint reachable on every node as one docker volume.

nfs mode: the head exports the checkpoint read-only to exactly the worker fabric IPs, workers mount
it as a docker `local` volume with NFS options; the head binds it locally. local mode: every node
binds its own copy. With model.source: download, the head fetches it once per revision; in local mode
the head then serves it read-only (rsync) to the workers, which copy it over their ConnectX-7 links
instead of each pulling ~400 GiB from the hub. Deleting these volumes never touches the checkpoint
files, and downloads and copies are never deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from .node import SparkNode
from planning.clusterplan import ExportPlan, SeedPlan


@dataclass(frozen=True)
class CheckpointShareArgs:
    stack: str
    export: Optional[ExportPlan]  # nfs mode with workers; the nodes' parts are in nodes[i].node
    nodes: list[SparkNode]
    images: list[docker.RemoteImage]  # the download runs the engine image's `hf` CLI
    hf_token: Optional[Any] = None  # secret Output[str], for source: download
    seed: Optional[SeedPlan] = None  # the head seeds the workers' copies (source: download, share.mode: local)


class CheckpointShare(pulumi.ComponentResource):
    """`export` (head, nfs mode only) and `volumes[i]` on node i."""

    def __init__(self, name: str, args: CheckpointShareArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:CheckpointShare", name, None, opts)
        stack, nodes = args.stack, args.nodes
        self.downloads: dict[int, remote.Command] = {}  # the head's (and, in local mode, each node's) copy
        self.seed: Optional[remote.Command] = None
        for rank, node in enumerate(nodes):
            download = node.node.download
            if download is None or download.from_head:
                continue
            self.downloads[rank] = remote.Command(
                f"{name}-download-{node.node.name}",
                connection=node.connection,
                create=download.create,
                stdin=args.hf_token,
                triggers=list(download.triggers),
                # The token is on its stdin: none of the download's output goes to the engine's log, so no
                # tool that echoes it can leak it there (the files' progress: `du -sh` on the node).
                logging=remote.Logging.NONE,
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    # ~400 GiB fetched over hours: destroy leaves the checkpoint where it is.
                    retain_on_delete=True,
                    # The download runs the engine image's `hf` CLI on a node that passed preflight.
                    depends_on=[node.preflight, args.images[rank]],
                ),
            )
        if args.seed is not None:
            self._seed_workers(name, args)
        self.export: Optional[remote.Command] = None
        if args.export is not None:
            self.export = remote.Command(
                f"{name}-export",
                connection=nodes[0].connection,
                create=args.export.create,
                delete=args.export.delete,
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    # create and delete write the same exports file: remove the old one first.
                    delete_before_replace=True,
                    # Export only a checkpoint that is there, from a head that passed preflight.
                    depends_on=[nodes[0].preflight, *self.downloads.values()],
                ),
            )
        self.volumes: list[docker.Volume] = []
        for rank, node in enumerate(nodes):
            nfs_client = self.export is not None and rank > 0
            before = [self.export] if nfs_client else ([self.downloads[rank]] if rank in self.downloads else [])
            self.volumes.append(
                docker.Volume(
                    f"{name}-{node.node.name}",
                    name=node.node.volume_name,
                    driver="local",
                    driver_opts=node.node.volume_options,
                    labels=[docker.VolumeLabelArgs(label="deepseek-spark.stack", value=stack)],
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        provider=node.docker,
                        # A fixed volume name per node: the old volume must go before the new one is made.
                        delete_before_replace=True,
                        # Workers mount the head's export; a node with its own copy waits for its download.
                        depends_on=before,
                    ),
                )
            )
        self.register_outputs({"volumes": [v.name for v in self.volumes]})

    def _seed_workers(self, name: str, args: CheckpointShareArgs) -> None:
        """source: download, share.mode: local: the head serves its download read-only (rsync) to the
        workers, each copies it over its ConnectX-7 link, then the head stops serving."""
        head = args.nodes[0]
        self.seed = remote.Command(
            f"{name}-seed",
            connection=head.connection,
            create=args.seed.start,
            delete=args.seed.stop,
            # A new revision is served again once the head has downloaded it.
            triggers=list(head.node.download.triggers),
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=self,
                # Serve only a complete download.
                depends_on=[self.downloads[0]],
            ),
        )
        copies = []
        for rank, node in enumerate(args.nodes[1:], start=1):
            self.downloads[rank] = remote.Command(
                f"{name}-copy-{node.node.name}",
                connection=node.connection,
                create=node.node.download.create,
                triggers=list(node.node.download.triggers),
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    # ~400 GiB moved over the fabric: destroy leaves the copy where it is.
                    retain_on_delete=True,
                    # Copy from a head that serves it, onto a node that passed preflight.
                    depends_on=[self.seed, node.preflight],
                ),
            )
            copies.append(self.downloads[rank])
        self.seed_stop = remote.Command(
            f"{name}-seed-stop",
            connection=head.connection,
            create=args.seed.stop,
            triggers=[self.seed.id],
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=self,
                # Stop serving the checkpoint once every worker holds its copy.
                depends_on=copies,
            ),
        )
