"""What a simulated node's own docker engine holds: the images of a fresh node (``NODE_IMAGES``: the engine TEST
DOUBLE image under both its names, and the packaged images, ``sim.images.PACKAGED``), each ``docker load``ed from
its cached tar (``sim.images``) when missing or of another image ID, and the reset of a kept engine to that set
(no container, volume, network or build cache).
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from . import backend, images
from .inventory import NodeInfo, SimError, parallel

NODE_IMAGES = (*images.ENGINE_IMAGES, *(i.name for i in images.PACKAGED))  # every image name a fresh node holds

# What create removes from a node's kept engine: every container, volume, network and build cache, and
# every image but the engine images and the gateway image (a node then holds what a fresh one would).
RESET_INNER = (
    "docker ps -aq | xargs -r docker rm -f -v >/dev/null; "
    "docker volume ls -q | xargs -r docker volume rm -f >/dev/null; "
    "docker network prune -f >/dev/null; docker builder prune -af >/dev/null 2>&1; "
    "keep=$(docker image inspect --format '{{.Id}}' %s 2>/dev/null | sort -u); "
    "for id in $(docker image ls -aq --no-trunc | sort -u); do "
    "echo \"$keep\" | grep -qx \"$id\" || docker rmi -f \"$id\" >/dev/null 2>&1 || true; done; "
    "docker image ls --format '{{.Repository}}:{{.Tag}}' | grep -vxF -e %s | xargs -r docker rmi >/dev/null 2>&1 || true"
)


def reset_inner(n: NodeInfo) -> None:
    names = " ".join(NODE_IMAGES)
    flags = " -e ".join(NODE_IMAGES)
    r = backend.exec_in(n.container, "sh", "-c", RESET_INNER % (names, flags), timeout=300)
    if r.returncode != 0:
        raise SimError(f"{n.name}: resetting its kept docker engine failed: {(r.stderr or r.stdout).strip()}")


def _load_image(n: NodeInfo, names: tuple[str, ...], tar: Path, want_id: str) -> str:
    """``docker load`` the tar (one image under ``names``) on the node unless every name is current."""
    r = backend.exec_in(n.container, "docker", "image", "inspect", "--format", "{{.Id}}", *names)
    if r.returncode == 0 and r.stdout.split() == [want_id] * len(names):
        return "present"
    with open(tar, "rb") as f:
        pr = subprocess.run([backend.docker_bin(), "exec", "-i", n.container, "docker", "load"], stdin=f,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    if pr.returncode != 0:
        raise SimError(f"docker load on {n.name} failed: {pr.stderr.decode(errors='replace').strip()}")
    return "loaded"


def load_engine_image(n: NodeInfo, tar: Path, want_id: str) -> str:
    """Load the engine image (all names in ``images.ENGINE_IMAGES``) unless every name is current."""
    return _load_image(n, images.ENGINE_IMAGES, tar, want_id)


def packaged_tars(log) -> list[tuple[images.PackagedImage, Path, str]]:
    """Every packaged image built (or cached), with its tar and image ID."""
    out = []
    for img in images.PACKAGED:
        images.ensure_packaged(img, log)
        out.append((img, images.packaged_tar(img, log), backend.image_id(img.name)))
    return out


def load_packaged(nodes: list[NodeInfo], tars: list[tuple[images.PackagedImage, Path, str]], timings: dict,
                  log) -> None:
    """Load each packaged image on every node unless it is current there."""
    for img, tar, want_id in tars:
        t = time.monotonic()
        res = parallel(lambda n: _load_image(n, (img.name,), tar, want_id), nodes)
        timings[f"{img.rootfs.kind}_image_load"] = time.monotonic() - t
        log(f"  {img.name}: " + ", ".join(f"{n.name} {r}" for n, r in zip(nodes, res)))
