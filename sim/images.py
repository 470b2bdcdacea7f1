"""Build and cache the simulator images (no registry: a rootfs of ``sim.rootfs`` + an overlay committed on it).

* base images ``dspark-sim-<kind>-base:<key>`` and their rootfs tarballs: ``sim.rootfs``;
* final images: base + a small overlay layer (stand-ins, entrypoint, test-double code) committed
  as ``dspark-sim-node:<hash>`` and ``sglang-sim:td-<hash>``, where ``hash`` covers the rootfs key and
  every overlay byte, so a rebuild happens only when an input changes. The engine image holds both
  TEST DOUBLES (``python3 -m sglang.launch_server``; ``vllm serve``) plus REAL Ray and the REAL SGLang
  router (PyPI wheels, ``sim.rootfs`` ``RAY_WHEELS`` + ``ROUTER_WHEELS``, installed into the rootfs at build time)
  and is tagged ``sglang-sim:test-double`` and ``vllm-sim:test-double`` (one image ID, ``ENGINE_IMAGES``).
* the packaged images (``PACKAGED``), each also tagged ``<repo>:sim-<hash>``, are NOT test doubles: registry
  packages only, no code of ours, what real nodes build from ``programs/<kind>/Dockerfile``:
  - the team gateway ``deepseek-spark-gateway:litellm-1.110.2`` (``GATEWAY_IMAGE``): REAL LiteLLM (proxy, the
    PyPI pins of ``programs/gateway/requirements.txt``) and REAL PostgreSQL 15 (Debian's ``postgresql-15``);
  - the monitoring ``deepseek-spark-monitoring:bookworm`` (``MONITORING_IMAGE``): REAL Prometheus, Alertmanager
    and node exporter (Debian's ``prometheus``, ``prometheus-alertmanager``, ``prometheus-node-exporter``).
* saved tars (what ``sim.nodeimages`` loads onto the nodes): ``~/.cache/deepseek-spark-sim/images/``.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from planning import frontdoor, prometheus

from . import backend
from .rootfs import (ENGINE_ROOTFS, FRONTDOOR_ROOTFS, GATEWAY_ROOTFS, MONITORING_ROOTFS, NODE_ROOTFS, ROOTFS, RootfsSpec,
                     base_tag, build_rootfs, cache_dir, ensure_base, rootfs_path)
from .testdouble import engram

SIM_VERSION = "5"  # bump when a node built from an older image must be re-created (cluster.create does)
ASSETS = Path(__file__).parent / "assets"
TESTDOUBLE = Path(__file__).parent / "testdouble"
# the node's copies of sim modules, as the package dspark_sim (relative imports only): the fabric model and what
# applies it (/usr/local/sbin/sim-fabric runs dspark_sim.fabric_node)
NODE_MODULES = (Path(__file__).parent / "fabric.py", Path(__file__).parent / "fabric_node.py")
MEMINFO = Path(__file__).parent / "meminfo.py"  # the node's /usr/local/sbin/sim-meminfo (same file as sim.meminfo)
OPTIONS = Path(__file__).parent.parent / "declared" / "options"  # the real engines' option tables
ENGINE_IMAGE = "sglang-sim:test-double"
VLLM_IMAGE = "vllm-sim:test-double"
ENGINE_IMAGES = (ENGINE_IMAGE, VLLM_IMAGE)  # one image, two names; saved together, loaded together
GATEWAY_IMAGE = "deepseek-spark-gateway:litellm-1.110.2"
MONITORING_IMAGE = "deepseek-spark-monitoring:bookworm"  # declared.stack.MONITORING_IMAGE
FRONTDOOR_IMAGE = "deepseek-spark-frontdoor:nginx-1.22"  # declared.stack.FRONTDOOR_IMAGE
FIXED_MTIME = 1735689600  # 2025-01-01T00:00:00Z: deterministic tars


@dataclass
class Overlay:
    """Files added on top of a rootfs: path -> (bytes, mode); plus image config changes."""
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)

    def add(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.files[path.lstrip("/")] = (data, mode)

    def digest(self) -> str:
        h = hashlib.sha256()
        for p in sorted(self.files):
            data, mode = self.files[p]
            h.update(f"{p}\0{mode:o}\0{len(data)}\0".encode())
            h.update(data)
        h.update(json.dumps(self.changes).encode())
        return h.hexdigest()

    def tar_bytes(self) -> bytes:
        return files_tar(self.files)


def files_tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    """A deterministic tar (root-owned, fixed mtime) with parent directories included."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        dirs: set[str] = set()
        for p in sorted(files):
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    ti = tarfile.TarInfo(d)
                    ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, FIXED_MTIME
                    tf.addfile(ti)
            data, mode = files[p]
            ti = tarfile.TarInfo(p)
            ti.size, ti.mode, ti.mtime = len(data), mode, FIXED_MTIME
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


NODE_PACKAGE = "usr/lib/python3/dist-packages/dspark_sim"  # the node's python3 (bookworm's) finds it
NODE_PACKAGE_INIT = b'"""SIMULATOR STAND-IN (dspark-sim): the node\'s copies of sim modules."""\n'
SIM_FABRIC = '''#!/usr/bin/python3
# SIMULATOR STAND-IN: sim-fabric of a dspark-sim node; see dspark_sim.fabric_node (sim/fabric_node.py).
import sys

from dspark_sim.fabric_node import main

if __name__ == "__main__":
    sys.exit(main())
'''


def node_overlay(rootfs_key: str) -> Overlay:
    ov = Overlay()
    a = ASSETS / "node"
    ov.add("usr/local/sbin/sim-entrypoint", (a / "sim-entrypoint").read_bytes(), 0o755)
    ov.add("usr/local/sbin/sim-runc", (a / "sim-runc").read_bytes(), 0o755)
    ov.add("usr/local/sbin/sim-fabric", SIM_FABRIC.encode(), 0o755)
    ov.add(f"{NODE_PACKAGE}/__init__.py", NODE_PACKAGE_INIT)
    for path in NODE_MODULES:
        ov.add(f"{NODE_PACKAGE}/{path.name}", path.read_bytes())
    ov.add("usr/local/sbin/sim-meminfo", MEMINFO.read_bytes(), 0o755)
    ov.add("usr/sbin/sysctl", (a / "sysctl").read_bytes(), 0o755)  # over procps' (see the stand-in's header)
    for name in ("nvidia-smi", "ethtool", "ibdev2netdev", "ib_write_bw", "nvidia-container-runtime-hook", "systemctl"):
        ov.add(f"usr/local/bin/{name}", (a / name).read_bytes(), 0o755)
    ov.add("etc/ssh/sshd_config.d/10-dspark-sim.conf", (a / "sshd-sim.conf").read_bytes())
    ov.add("etc/motd", b"dspark-sim: SIMULATED DGX Spark node (container). Nothing here is real hardware.\n")
    ov.changes = [
        "ENV container=docker",
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        'ENTRYPOINT ["/usr/bin/tini", "-g", "--", "/usr/local/sbin/sim-entrypoint"]',
        "CMD []",
        "LABEL deepseek-spark.sim.image=node",
    ]
    ov.add("etc/dspark-sim-version", f"dspark-sim node image v{SIM_VERSION} rootfs {rootfs_key}\n".encode())
    return ov


def engine_overlay(rootfs_key: str) -> Overlay:
    ov = Overlay()
    pkg = "usr/lib/python3/dist-packages"
    for path in sorted(TESTDOUBLE.glob("*.py")):  # every module of the doubles (a missing one breaks the image)
        ov.add(f"{pkg}/dspark_testdouble/{path.name}", path.read_bytes())
    # the REAL engines' option tables the doubles' parsers are built from (declared/options)
    for table in sorted(OPTIONS.glob("*.json")):
        ov.add(f"{pkg}/dspark_testdouble/options/{table.name}", table.read_bytes())
    # the real module paths programs/argcheck.py imports, as TEST DOUBLES (dspark_testdouble.parsers)
    shim = b'"""TEST DOUBLE (dspark-sim): see dspark_testdouble.parsers."""\nfrom dspark_testdouble.parsers import %s  # noqa: F401\n'
    for path, names in (("sglang/srt/server_args.py", b"ServerArgs, prepare_server_args"),
                        ("vllm/entrypoints/cli/serve.py", b"ServeSubcommand, cmd_init"),
                        ("vllm/utils/argparse_utils.py", b"FlexibleArgumentParser")):
        ov.add(f"{pkg}/{path}", shim % names)
    for init in ("sglang/srt", "vllm/entrypoints", "vllm/entrypoints/cli", "vllm/utils"):
        ov.add(f"{pkg}/{init}/__init__.py", b'"""TEST DOUBLE package (dspark-sim)."""\n')
    ov.add(f"{pkg}/sglang/__init__.py",
           b'"""TEST DOUBLE: sglang-sim (dspark-sim). This is NOT SGLang."""\n__version__ = "0.0.0+test-double"\n')
    ov.add(f"{pkg}/sglang/launch_server.py",
           b'"""TEST DOUBLE of sglang.launch_server (dspark-sim); see dspark_testdouble.server."""\n'
           b"import sys\n\nfrom dspark_testdouble.server import main\n\n"
           b'if __name__ == "__main__":\n    sys.exit(main(engine="sglang"))\n')
    ov.add(f"{pkg}/vllm/__init__.py",
           b'"""TEST DOUBLE: vllm-sim (dspark-sim). This is NOT vLLM; the CLI is `vllm serve`."""\n'
           b"from dspark_testdouble.vllm_serve import __version__  # noqa: F401\n")
    ov.add("usr/local/bin/vllm", CLI_SCRIPT.format(what="vllm", mod="vllm_serve", fn="main").encode(), 0o755)
    ov.add("opt/dsv41/scripts/pack_engram.py",
           b"#!/usr/bin/python3\n# TEST DOUBLE engram packer (dspark-sim); see dspark_testdouble.engram.\n"
           b"import sys\n\nfrom dspark_testdouble.engram import main\n\n"
           b'if __name__ == "__main__":\n    sys.exit(main())\n', 0o755)
    ov.add("etc/dspark-sim-version",
           f"sglang-sim/vllm-sim test-double image v{SIM_VERSION} rootfs {rootfs_key}\n".encode())
    ov.changes = [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV PYTHONUNBUFFERED=1",
        # real Ray (RAY_VERSION) in a container on a small test machine: no docker-CPU warning, no usage
        # stats, and an object store capped at 256 MiB (Ray's default is 30% of RAM)
        "ENV RAY_DISABLE_DOCKER_CPU_WARNING=1",
        "ENV RAY_USAGE_STATS_ENABLED=0",
        "ENV RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES=268435456",
        'CMD ["/bin/sh"]',
        "LABEL deepseek-spark.sim.image=sglang-sim deepseek-spark.sim.test-double=true "
        "deepseek-spark.sim.engines=sglang,vllm",
    ]
    return ov


@dataclass(frozen=True)
class PackagedImage:
    """An image of registry packages only (its rootfs), under the one name nodes hold; ``changes``: the image
    config its ``programs/<kind>/Dockerfile`` sets."""

    name: str
    rootfs: RootfsSpec
    changes: tuple[str, ...]

    @property
    def repo(self) -> str:
        return self.name.partition(":")[0]

    def overlay(self) -> Overlay:
        return Overlay(changes=list(self.changes))

    def tag(self) -> str:
        """Its content-hash tag (``<repo>:sim-<hash>``): a changed package set or config is a new image."""
        return image_tag(self.repo, self.rootfs, self.overlay()).replace(":", ":sim-")

    def tar_name(self, iid: str) -> str:
        return f"{self.rootfs.kind}-{iid.split(':')[-1][:16]}.tar"


_PACKAGES_ONLY = "deepseek-spark.sim.test-double=false deepseek-spark.sim.built-from=registry-packages-only"
GATEWAY = PackagedImage(GATEWAY_IMAGE, GATEWAY_ROOTFS, (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LITELLM_LOCAL_MODEL_COST_MAP=True",
    "ENV PYTHONUNBUFFERED=1",
    'CMD ["/bin/sh"]',
    f"LABEL deepseek-spark.sim.image=gateway {_PACKAGES_ONLY} deepseek-spark.gateway.litellm=1.110.2 "
    "deepseek-spark.gateway.postgresql=15",
))
MONITORING = PackagedImage(MONITORING_IMAGE, MONITORING_ROOTFS, (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    'CMD ["/bin/sh"]',
    f"LABEL deepseek-spark.sim.image=monitoring {_PACKAGES_ONLY} deepseek-spark.monitoring.prometheus=2.42 "
    "deepseek-spark.monitoring.alertmanager=0.25 deepseek-spark.monitoring.node-exporter=1.5",
    # what the program's build on a node labels its image with (planning/prometheus.image_build): the nodes hold
    # this one already, so the program's build finds it current and builds nothing
    f"LABEL {prometheus.BUILT_FROM}={prometheus.dockerfile_digest(prometheus.DOCKERFILE.read_text())}",
))
FRONTDOOR = PackagedImage(FRONTDOOR_IMAGE, FRONTDOOR_ROOTFS, (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    'CMD ["nginx", "-g", "daemon off;"]',
    f"LABEL deepseek-spark.sim.image=frontdoor {_PACKAGES_ONLY} deepseek-spark.frontdoor.nginx=1.22",
    # what the program's build on a node labels its image with (planning/frontdoor.py): the nodes hold this one
    # already, so the program's build finds it current and builds nothing
    f"LABEL {frontdoor.BUILT_FROM}={frontdoor.imagebuild_digest(frontdoor.DOCKERFILE.read_text())}",
))
PACKAGED = (GATEWAY, MONITORING, FRONTDOOR)  # every node holds each


CLI_SCRIPT = '''#!/usr/bin/python3
# TEST DOUBLE `{what}` CLI (dspark-sim); see dspark_testdouble.{mod}. This is NOT the real {what}.
import sys

from dspark_testdouble.{mod} import {fn}

if __name__ == "__main__":
    sys.exit({fn}())
'''


def image_tag(repo: str, rootfs: RootfsSpec, overlay: Overlay) -> str:
    h = hashlib.sha256(f"{rootfs.key()}\0{overlay.digest()}\0{SIM_VERSION}".encode()).hexdigest()[:16]
    return f"{repo}:{h}"


def node_image_tag() -> str:
    return image_tag("dspark-sim-node", NODE_ROOTFS, node_overlay(NODE_ROOTFS.key()))


def engine_image_tag() -> str:
    return image_tag("sglang-sim", ENGINE_ROOTFS, engine_overlay(ENGINE_ROOTFS.key())).replace(":", ":td-")


def checkpoint_tar() -> bytes:
    """The fake checkpoint under /srv/models/DS4.1 (+ empty /srv/engram), as a tar for docker cp."""
    files = {f"srv/models/DS4.1/{k}": (v, 0o644) for k, v in engram.checkpoint_files().items()}
    files["srv/engram/.keep"] = (b"", 0o644)
    return files_tar(files)


# ------------------------------------------------------------------ builds (side effects) ----
def commit_overlay(base: str, overlay: Overlay, tags: list[str]) -> None:
    name = f"dspark-sim-build-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    backend.docker("create", "--name", name, base, "/bin/true")
    try:
        backend.docker("cp", "-", f"{name}:/", input=overlay.tar_bytes())
        args = ["commit"]
        for c in overlay.changes:
            args += ["--change", c]
        backend.docker(*args, name, tags[0])
        for t in tags[1:]:
            backend.docker("tag", tags[0], t)
    finally:
        backend.docker("rm", "-f", name, check=False)


def ensure_node_image(log=print) -> str:
    tag = node_image_tag()
    if backend.image_id(tag):
        log(f"image {tag}: cached")
        return tag
    base = ensure_base(NODE_ROOTFS, log)
    commit_overlay(base, node_overlay(NODE_ROOTFS.key()), [tag])
    log(f"image {tag}: built")
    return tag


def ensure_engine_image(log=print) -> str:
    """Build (or find) the engine image and point every name in ``ENGINE_IMAGES`` at it."""
    tag = engine_image_tag()
    names = ", ".join(ENGINE_IMAGES)
    if not backend.image_id(tag):
        base = ensure_base(ENGINE_ROOTFS, log)
        commit_overlay(base, engine_overlay(ENGINE_ROOTFS.key()), [tag, *ENGINE_IMAGES])
        log(f"image {tag} ({names}): built")
    else:
        want = backend.image_id(tag)
        for name in ENGINE_IMAGES:
            if backend.image_id(name) != want:
                backend.docker("tag", tag, name)
        log(f"image {tag} ({names}): cached")
    return ENGINE_IMAGE


def ensure_packaged(img: PackagedImage, log=print) -> str:
    """Build (or find) a packaged image (its content-hash tag) and point its name at it."""
    tag = img.tag()
    if not backend.image_id(tag):
        base = ensure_base(img.rootfs, log)
        commit_overlay(base, img.overlay(), [tag, img.name])
        log(f"image {tag} ({img.name}): built")
    else:
        if backend.image_id(img.name) != backend.image_id(tag):
            backend.docker("tag", tag, img.name)
        log(f"image {tag} ({img.name}): cached")
    return img.name


def engine_tar_name(iid: str) -> str:
    return f"engine-sim-{iid.split(':')[-1][:16]}.tar"


def _image_tar(names: tuple[str, ...], tar_name, log=print) -> Path:
    """``docker save`` of one image under all of ``names``, cached by image ID (``tar_name(iid)``)."""
    iid = backend.image_id(names[0])
    if not iid:
        raise RuntimeError(f"{names[0]} missing; run `python -m sim build`")
    for name in names[1:]:
        if backend.image_id(name) != iid:
            raise RuntimeError(f"{name} is not the same image as {names[0]}; run `python -m sim build`")
    out = cache_dir() / "images" / tar_name(iid)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".partial")
        backend.docker("save", "-o", str(tmp), *names)
        os.replace(tmp, out)
        log(f"saved {', '.join(names)} to {out}")
    return out


def engine_image_tar(log=print) -> Path:
    """``docker save`` of the engine image under all its names (``ENGINE_IMAGES``), cached by image ID."""
    return _image_tar(ENGINE_IMAGES, engine_tar_name, log)


def packaged_tar(img: PackagedImage, log=print) -> Path:
    """``docker save`` of a packaged image (its one name: nodes get no hash tag), cached by image ID."""
    return _image_tar((img.name,), img.tar_name, log)


def build_all(log=print) -> dict:
    """Build (or find cached) the node, engine and packaged images; cold debootstraps run in parallel."""
    from concurrent.futures import ThreadPoolExecutor
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(build_rootfs, s, log) for s in ROOTFS if not backend.image_id(base_tag(s))]
        for f in futs:
            f.result()
    node = ensure_node_image(log)
    engine = ensure_engine_image(log)
    engine_image_tar(log)
    out = {"node_image": node, "engine_image": engine, "engine_images": list(ENGINE_IMAGES),
           "engine_image_id": backend.image_id(engine)}
    for img in PACKAGED:
        ensure_packaged(img, log)
        packaged_tar(img, log)
        out[f"{img.rootfs.kind}_image"] = img.name
        out[f"{img.rootfs.kind}_image_id"] = backend.image_id(img.name)
    prune_stale(log)
    return {**out, "seconds": round(time.monotonic() - t0, 1)}


def prune_stale(log=print) -> list[str]:
    """Drop sim image tags and cached tarballs of older inputs (images in use are kept)."""
    keep = {node_image_tag(), engine_image_tag(), *ENGINE_IMAGES, *(i.tag() for i in PACKAGED),
            *(i.name for i in PACKAGED), *(base_tag(spec) for spec in ROOTFS)}
    r = backend.docker("images", "--format", "{{.Repository}}:{{.Tag}}", check=False)
    removed = []
    for ref in r.stdout.split():
        repo, _, tag = ref.partition(":")
        ours = repo in ("dspark-sim-node", *(f"dspark-sim-{spec.kind}-base" for spec in ROOTFS)) or \
            (repo == "sglang-sim" and tag.startswith("td-")) or \
            (repo in {i.repo for i in PACKAGED} and tag.startswith("sim-"))
        if ours and ref not in keep and backend.docker("rmi", ref, check=False).returncode == 0:
            removed.append(ref)
    keep_files = {rootfs_path(spec).name for spec in ROOTFS}
    iid = backend.image_id(ENGINE_IMAGE)
    if iid:
        keep_files.add(engine_tar_name(iid))
    for img in PACKAGED:
        pid = backend.image_id(img.name)
        if pid:
            keep_files.add(img.tar_name(pid))
    for sub in ("rootfs", "images"):
        d = cache_dir() / sub
        for p in d.glob("*.tar") if d.is_dir() else []:
            if p.name not in keep_files:
                p.unlink()
                removed.append(str(p))
    if removed:
        log("pruned stale: " + ", ".join(removed))
    return removed
