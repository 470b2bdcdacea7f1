"""Build and cache the simulator images (no registry: debootstrap + ``docker import``).

* rootfs tarballs: ``~/.cache/deepseek-spark-sim/rootfs/<kind>-<key>.tar`` where ``key`` hashes
  the debootstrap recipe (suite, variant, packages, cleanup) -- debootstrap is the slow part;
* base images ``dspark-sim-<kind>-base:<key>``: the tarball imported with ``docker import --change``;
* final images: base + a small overlay layer (stand-ins, entrypoint, test-double code) committed
  as ``dspark-sim-node:<hash>`` and ``sglang-sim:td-<hash>``, where ``hash`` covers the rootfs key and
  every overlay byte, so a rebuild happens only when an input changes. The engine image holds both
  TEST DOUBLES (``python3 -m sglang.launch_server``; ``vllm serve``) plus REAL Ray and the REAL SGLang
  router (PyPI wheels, ``RAY_WHEELS`` + ``ROUTER_WHEELS``, installed into the rootfs at build time) and is tagged
  ``sglang-sim:test-double`` and ``vllm-sim:test-double`` (one image ID, ``ENGINE_IMAGES``).
* the packaged images (``PACKAGED``), each also tagged ``<repo>:sim-<hash>``, are NOT test doubles: registry
  packages only, no code of ours, what real nodes build from ``programs/<kind>/Dockerfile``:
  - the team gateway ``deepseek-spark-gateway:litellm-1.110.2`` (``GATEWAY_IMAGE``): REAL LiteLLM (proxy, the
    PyPI pins of ``programs/gateway/requirements.txt``) and REAL PostgreSQL 15 (Debian's ``postgresql-15``);
  - the monitoring ``deepseek-spark-monitoring:bookworm`` (``MONITORING_IMAGE``): REAL Prometheus, Alertmanager
    and node exporter (Debian's ``prometheus``, ``prometheus-alertmanager``, ``prometheus-node-exporter``).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from planning import prometheus

from . import backend
from .testdouble import engram

SIM_VERSION = "4"  # bump when a node built from an older image must be re-created (cluster.create does)
SUITE = "bookworm"
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
RECIPE_VERSION = "3"  # bump when build_rootfs's commands change
# REAL Ray in the engine image: the PyPI wheel and its (pinned, complete) dependency set, installed
# into the rootfs with the host's pip (--no-deps: nothing is resolved at build time). The set is part
# of the rootfs key, so a cached rootfs/base image needs no network.
RAY_VERSION = "2.49.2"
RAY_WHEELS = (
    f"ray=={RAY_VERSION}", "attrs==26.1.0", "certifi==2026.10.19.post1", "charset-normalizer==3.5.3",
    "click==8.5.1", "filelock==4.3.1", "idna==3.20", "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1",
    "msgpack==1.2.4", "packaging==26.4", "protobuf==7.36.2", "pyyaml==6.0.4", "referencing==0.37.0",
    "requests==2.34.2", "rpds-py==2026.9.1", "typing-extensions==4.16.0", "urllib3==2.8.0",
)
# The REAL SGLang router (PyPI ``sglang-router``, module ``sglang_router``: ``python3 -m
# sglang_router.launch_router``) and the rest of its pinned dependency set (resolved once with pip for
# cp311). attrs, click, idna and typing-extensions are shared with Ray: the RAY_WHEELS pins satisfy both
# (``pip check`` is clean with the whole set), so they are listed once, there.
ROUTER_VERSION = "0.3.2"
ROUTER_WHEELS = (
    f"sglang-router=={ROUTER_VERSION}", "aiohappyeyeballs==2.7.1", "aiohttp==3.14.5", "aiosignal==1.4.0",
    "annotated-doc==0.0.7", "annotated-types==0.8.0", "anyio==4.16.0", "fastapi==0.165.0", "frozenlist==1.8.0",
    "h11==0.16.0", "multidict==7.2.1", "opentelemetry-api==1.45.2", "orjson==3.13.0", "propcache==0.5.4",
    "pydantic==2.14.4", "pydantic-core==2.50.5", "setproctitle==1.3.8", "starlette==1.10.0",
    "typing-inspection==0.4.5", "uvicorn==0.54.0", "yarl==1.25.1",
)
ENGINE_WHEELS = RAY_WHEELS + ROUTER_WHEELS  # every name pinned once (tests/sim checks it)
WHEEL_PLATFORM = ("--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--implementation", "cp",
                  "--abi", "cp311", "--only-binary=:all:")
# The team gateway (LiteLLM's proxy + PostgreSQL 15): its pins live in programs/gateway/requirements.txt
# (the file programs/gateway/Dockerfile installs on real nodes). litellm, numpy and tiktoken ship
# manylinux_2_28 wheels only (bookworm's glibc is 2.36), so this set also takes that platform tag.
GATEWAY_IMAGE = "deepseek-spark-gateway:litellm-1.110.2"
GATEWAY_REQUIREMENTS = Path(__file__).parent.parent / "programs" / "gateway" / "requirements.txt"
GATEWAY_WHEEL_PLATFORM = ("--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
                          *WHEEL_PLATFORM[2:])
ROOTFS_SITE = "usr/local/lib/python3.11/dist-packages"  # bookworm's python3 is 3.11
FIXED_MTIME = 1735689600  # 2025-01-01T00:00:00Z: deterministic tars
CLEANUP = [
    "usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian",
    "var/lib/apt/lists", "var/cache/apt", "var/cache/debconf/templates.dat-old", "var/log",
    "etc/ssh/ssh_host_*", "etc/machine-id", "var/lib/dbus/machine-id",
]


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deepseek-spark-sim"


# ------------------------------------------------------------------ mirror discovery (pure) ----
def mirror_from_sources(deb822_texts: list[str], list_text: str = "", suite: str = SUITE) -> str | None:
    """The Debian mirror URI serving ``suite`` (not -security/-updates) from apt sources text.

    ``deb822_texts``: contents of ``/etc/apt/sources.list.d/*.sources``; ``list_text``: the
    one-line ``/etc/apt/sources.list`` format. deb822 stanzas win over one-line entries.
    """
    for text in deb822_texts:
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            key = None
            for line in stanza.splitlines():
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                if line[0] in " \t" and key:
                    fields[key] += " " + line.strip()
                    continue
                if ":" in line:
                    key, _, val = line.partition(":")
                    key = key.strip().lower()
                    fields[key] = val.strip()
            if fields.get("enabled", "yes").lower() == "no":
                continue
            if "deb" not in fields.get("types", "").split():
                continue
            if suite not in fields.get("suites", "").split():
                continue
            uris = fields.get("uris", "").split()
            if uris:
                return uris[0].rstrip("/")
    for line in list_text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line[4:])
        parts = line.split()
        if len(parts) >= 2 and parts[1] == suite:
            return parts[0].rstrip("/")
    return None


def discover_mirror(suite: str = SUITE) -> str:
    env = os.environ.get("DSPARK_SIM_MIRROR")
    if env:
        return env.rstrip("/")
    d = Path("/etc/apt/sources.list.d")
    texts = [p.read_text() for p in sorted(d.glob("*.sources"))] if d.is_dir() else []
    lst = Path("/etc/apt/sources.list")
    list_text = lst.read_text() if lst.exists() else ""
    for p in sorted(d.glob("*.list")) if d.is_dir() else []:
        list_text += "\n" + p.read_text()
    uri = mirror_from_sources(texts, list_text, suite)
    if not uri:
        raise RuntimeError(f"no apt source for suite {suite!r} in /etc/apt/sources.list(.d); "
                           "set DSPARK_SIM_MIRROR")
    return uri


# ------------------------------------------------------------------ recipes and keys (pure) ----
@dataclass(frozen=True)
class RootfsSpec:
    kind: str
    packages: tuple[str, ...]
    suite: str = SUITE
    variant: str = "minbase"
    wheels: tuple[str, ...] = ()  # PyPI requirements (pinned) installed into ROOTFS_SITE
    wheel_platform: tuple[str, ...] = WHEEL_PLATFORM  # pip download/install flags selecting the wheels
    remove: tuple[str, ...] = ()  # paths (globs) deleted after debootstrap, on top of CLEANUP (not re-created)

    def key(self) -> str:
        doc = {"kind": self.kind, "packages": sorted(self.packages), "suite": self.suite,
               "variant": self.variant, "cleanup": CLEANUP, "recipe": RECIPE_VERSION}
        if self.remove:
            doc["remove"] = sorted(self.remove)
        if self.wheels:
            doc["wheels"] = sorted(self.wheels)
            doc["wheel_platform"] = list(self.wheel_platform)
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


# iputils-ping: the real ping (no-fragment pings at the rail MTU); ethtool: the real one, which the
# ethtool stand-in hands every interface and option it does not model to
NODE_ROOTFS = RootfsSpec("node", ("openssh-server", "docker.io", "python3", "iproute2", "procps",
                                  "sudo", "ca-certificates", "iputils-ping", "ethtool"))
ENGINE_ROOTFS = RootfsSpec("engine", ("python3",), wheels=ENGINE_WHEELS)


def read_requirements(path: Path) -> tuple[str, ...]:
    """The ``name==version`` lines of a pip requirements file (comments and blank lines dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return tuple(line for line in lines if line)


# postgresql-15's postinst (postgresql-common) creates the `postgres` user and puts the server binaries in
# /usr/lib/postgresql/15/bin; runuser comes with util-linux (Essential, in minbase). The postinst also
# creates the cluster "15 main" (createcluster.conf's default): dropped, as the Dockerfile's
# `create_main_cluster = false` leaves none (the gateway's database lives on its own volume).
GATEWAY_ROOTFS = RootfsSpec("gateway", ("python3", "postgresql-15", "ca-certificates"),
                            wheels=read_requirements(GATEWAY_REQUIREMENTS), wheel_platform=GATEWAY_WHEEL_PLATFORM,
                            remove=("etc/postgresql/15", "var/lib/postgresql/15"))
MONITORING_IMAGE = "deepseek-spark-monitoring:bookworm"  # declared.config.MONITORING_IMAGE
MONITORING_ROOTFS = RootfsSpec("monitoring", ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter",
                                              "ca-certificates"))
ROOTFS = (NODE_ROOTFS, ENGINE_ROOTFS, GATEWAY_ROOTFS, MONITORING_ROOTFS)


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
    ov.add(f"{NODE_PACKAGE}/__init__.py", b'"""SIMULATOR STAND-IN (dspark-sim): the node\'s copies of sim modules."""\n')
    for path in NODE_MODULES:
        ov.add(f"{NODE_PACKAGE}/{path.name}", path.read_bytes())
    ov.add("usr/local/sbin/sim-meminfo", MEMINFO.read_bytes(), 0o755)
    ov.add("usr/sbin/sysctl", (a / "sysctl").read_bytes(), 0o755)  # over procps' (see the stand-in's header)
    for name in ("nvidia-smi", "ethtool", "ibdev2netdev", "ib_write_bw", "nvidia-container-runtime-hook"):
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
PACKAGED = (GATEWAY, MONITORING)  # every node holds each


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
def rootfs_path(spec: RootfsSpec) -> Path:
    return cache_dir() / "rootfs" / f"{spec.kind}-{spec.key()}.tar"


def build_rootfs(spec: RootfsSpec, log=print) -> Path:
    out = rootfs_path(spec)
    if out.exists():
        log(f"rootfs {spec.kind}: cached {out.name}")
        return out
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (run .ci/sim-setup)")
    out.parent.mkdir(parents=True, exist_ok=True)
    mirror = discover_mirror(spec.suite)
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"{spec.kind}-", dir=out.parent))
    root = work / "root"
    try:
        cmd = ["debootstrap", f"--variant={spec.variant}", f"--include={','.join(spec.packages)}",
               spec.suite, str(root), mirror]
        log(f"rootfs {spec.kind}: debootstrap {spec.suite} from {mirror} ({len(spec.packages)} packages)")
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"debootstrap failed ({r.returncode}):\n" + "\n".join(r.stdout.splitlines()[-30:]))
        for pattern in CLEANUP:
            for p in root.glob(pattern):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                    p.mkdir()
                else:
                    p.unlink()
        for pattern in spec.remove:
            for p in root.glob(pattern):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
        (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        if spec.wheels:
            install_wheels(spec.wheels, root, log, spec.wheel_platform)
        tmp = out.with_suffix(".tar.partial")
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "--xattrs", "-cf", str(tmp), "."], check=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"rootfs {spec.kind}: built {out.name} in {time.monotonic() - t0:.0f}s "
        f"({out.stat().st_size // 2**20} MiB)")
    return out


def install_wheels(reqs: tuple[str, ...], root: Path, log=print,
                   platform: tuple[str, ...] = WHEEL_PLATFORM) -> None:
    """``pip download`` the pinned wheels (for the rootfs's python, ``platform``: pip's platform flags;
    cached in ``cache_dir()/wheels``), then install them with the host's pip into ``root/ROOTFS_SITE``;
    console scripts go to ``root/usr/local/bin`` with ``#!/usr/bin/python3``."""
    import sys
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    t0 = time.monotonic()
    subprocess.run([*pip, "download", "--no-deps", "-d", str(wheels), *platform, *reqs], check=True)
    site = root / ROOTFS_SITE
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--find-links", str(wheels), "--target", str(site),
                    *platform, *reqs], check=True)
    bindir = root / "usr/local/bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for script in sorted((site / "bin").iterdir()) if (site / "bin").is_dir() else []:
        if not script.is_file():  # e.g. bin/__pycache__ of a wheel's .py script
            continue
        lines = script.read_text().splitlines(keepends=True)
        if lines and lines[0].startswith("#!"):
            lines[0] = "#!/usr/bin/python3\n"
        (bindir / script.name).write_text("".join(lines))
        (bindir / script.name).chmod(0o755)
    shutil.rmtree(site / "bin", ignore_errors=True)
    log(f"rootfs: installed {len(reqs)} wheels ({reqs[0]}) in {time.monotonic() - t0:.0f}s")


def ensure_base(spec: RootfsSpec, log=print) -> str:
    tag = f"dspark-sim-{spec.kind}-base:{spec.key()}"
    if backend.image_id(tag):
        return tag
    tar = build_rootfs(spec, log)
    t0 = time.monotonic()
    backend.docker("import", "--change", "LABEL deepseek-spark.sim.base=" + spec.kind, str(tar), tag)
    log(f"image {tag}: imported in {time.monotonic() - t0:.0f}s")
    return tag


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
        futs = [ex.submit(build_rootfs, s, log) for s in ROOTFS if not backend.image_id(f"dspark-sim-{s.kind}-base:{s.key()}")]
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
            *(i.name for i in PACKAGED), *(f"dspark-sim-{spec.kind}-base:{spec.key()}" for spec in ROOTFS)}
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
