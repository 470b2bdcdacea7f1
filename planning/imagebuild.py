"""Images built on a node's own engine instead of pulled (nothing is pushed to a registry): the serving image's
overlay (`imageBuild`, like the reference's `start.sh build` on each node) and the monitoring image. The build's
inputs have one digest; the image carries it as a label, so a node that holds an image built from the same inputs
builds nothing, and a changed input builds again. The context travels on the build command's stdin as a tar
(base64: the command's stdin is text), made the same way every time so that the same inputs send the same bytes.
"""
from __future__ import annotations

import base64
import gzip
import io
import shlex
import tarfile
from pathlib import Path
from typing import Optional

q = shlex.quote
MAX_CONTEXT_BYTES = 32 * 2**20  # a context sent on stdin: an overlay's Dockerfile and adapter, not a model


def context_tar(context: Path, files: list[str]) -> bytes:
    """A gzipped tar of `files` (paths relative to `context`, as plan.context_files lists them): names sorted,
    modes kept, owners, times and the gzip header's time zeroed, so that the same files give the same bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(files):
            data = (context / rel).read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), (context / rel).stat().st_mode & 0o777, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def context_stdin(context: Path, files: list[str]) -> str:
    """What the build command reads on stdin: the context's tar, base64."""
    return base64.b64encode(context_tar(context, files)).decode()


def unless_built(image: str, label: str, digest: str, build: str) -> str:
    """A node's script: `build` unless the node holds `image` labelled `label=digest` (built from these inputs)."""
    fmt = f'{{{{index .Config.Labels "{label}"}}}}'
    return (f'if [ "$(docker image inspect -f {q(fmt)} {q(image)} 2>/dev/null)" = {q(digest)} ]; then\n'
            f'  echo {q(image + " is built from these inputs")}\n'
            f'else\n  {build}\nfi\n')


def context_build(image: str, label: str, digest: str, dockerfile: str, args: dict[str, str],
                  platform: Optional[str]) -> str:  # fmt: skip
    """A node's script: build `image` from the context on stdin (context_stdin), with its Dockerfile, build args and
    platform, labelled with the inputs' digest; nothing when the node holds it already (unless_built)."""
    flags = [f"--label {q(f'{label}={digest}')}", f"-t {q(image)}", f"-f {q(dockerfile)}",
             *(f"--build-arg {q(f'{k}={v}')}" for k, v in sorted(args.items())),
             *([f"--platform {q(platform)}"] if platform else [])]
    return unless_built(image, label, digest, f"base64 -d | docker build {' '.join(flags)} -")
