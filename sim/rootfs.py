"""The simulator's root filesystems (no registry: debootstrap + the host's pip) and their base images.

* recipes (``RootfsSpec``): Debian suite, variant, packages, paths removed after debootstrap, and pinned PyPI wheels
  installed into the rootfs's python (``ROOTFS_SITE``): the node's, the engine TEST DOUBLE image's (REAL Ray and
  the REAL SGLang router, ``RAY_WHEELS`` + ``ROUTER_WHEELS``), the gateway's (the pins of
  ``programs/gateway/requirements.txt``) and the monitoring image's (``ROOTFS``);
* rootfs tarballs: ``~/.cache/deepseek-spark-sim/rootfs/<kind>-<key>.tar`` where ``key`` hashes the recipe
  (suite, variant, packages, cleanup, wheels) -- debootstrap is the slow part; wheels are cached in
  ``~/.cache/deepseek-spark-sim/wheels``; the Debian mirror comes from the machine's apt sources
  (``DSPARK_SIM_MIRROR`` overrides it);
* base images ``dspark-sim-<kind>-base:<key>``: the tarball imported with ``docker import --change``.

The images made from them (an overlay committed on a base image) are ``sim.images``'.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import backend

SUITE = "bookworm"
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
GATEWAY_REQUIREMENTS = Path(__file__).parent.parent / "programs" / "gateway" / "requirements.txt"
GATEWAY_WHEEL_PLATFORM = ("--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
                          *WHEEL_PLATFORM[2:])
ROOTFS_SITE = "usr/local/lib/python3.11/dist-packages"  # bookworm's python3 is 3.11
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
# ethtool stand-in hands every interface and option it does not model to; nftables: the real nft, the fence's;
# nmap: the outsider's scan (sim/outsider.py, which runs the node image)
NODE_ROOTFS = RootfsSpec("node", ("openssh-server", "docker.io", "python3", "iproute2", "procps",
                                  "sudo", "ca-certificates", "iputils-ping", "ethtool", "nftables", "nmap"))
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
MONITORING_ROOTFS = RootfsSpec("monitoring", ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter",
                                              "ca-certificates"))
# the front door: Debian's nginx, what programs/frontdoor/Dockerfile installs
FRONTDOOR_ROOTFS = RootfsSpec("frontdoor", ("nginx", "ca-certificates"))
ROOTFS = (NODE_ROOTFS, ENGINE_ROOTFS, GATEWAY_ROOTFS, MONITORING_ROOTFS, FRONTDOOR_ROOTFS)


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


def base_tag(spec: RootfsSpec) -> str:
    return f"dspark-sim-{spec.kind}-base:{spec.key()}"


def ensure_base(spec: RootfsSpec, log=print) -> str:
    """The base image of ``spec`` (its rootfs built or cached, then ``docker import``ed) unless it exists."""
    tag = base_tag(spec)
    if backend.image_id(tag):
        return tag
    tar = build_rootfs(spec, log)
    t0 = time.monotonic()
    backend.docker("import", "--change", "LABEL deepseek-spark.sim.base=" + spec.kind, str(tar), tag)
    log(f"image {tag}: imported in {time.monotonic() - t0:.0f}s")
    return tag
