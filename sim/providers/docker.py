"""TEST DOUBLE of pulumi-docker 5.2.0's resource plugin (`pulumi-resource-docker`).

The real plugin (Go: a Terraform bridge over kreuzwerker/terraform-provider-docker v4.5.0 plus a
native `docker.Image`) cannot be built here, so the engine runs this instead (launcher:
sim/providers/bin/pulumi-resource-docker). It implements what the program uses, with the real
provider's semantics as read in its source; anything else fails with a clear error, no silent drops.

- Provider config (one plugin process = one provider instance = one node): `host` (`ssh://user@host[:port]`,
  or any docker URL such as `unix:///var/run/docker.sock`) and `sshOpts`. For ssh hosts an `ssh` shim that
  adds `sshOpts` is put first on this process's PATH (the real provider also shells out to the system
  ssh with those options) and the docker SDK speaks `docker system dial-stdio` through it. The engine
  is reached lazily, on the first operation that needs it: never at preview.
- `docker:index/container:Container`: Diff = the Terraform schema's ForceNew fields replace (name, image,
  command, entrypoints, envs, labels, mounts, devices, ulimits, capabilities, networkMode, ipcMode, gpus,
  ...), others (restart, mustRun, wait, destroyGraceSeconds, memory, ...) update; set-typed inputs
  (envs, labels, mounts, ...) compare without order; a Computed input dropped from the program is no
  change; the Diff asks for delete-before-replace (pulumi-docker sets it for containers), and its
  detailed diff names nested paths (`labels[2].value`, `command[3]`) as the bridge's MakeDetailedDiffV2
  (sim/providers/detailed_diff.py); so do the Volume's and RemoteImage's. Create = docker
  create + start (an image missing on the node is pulled first, as findImage does: here that fails, no
  registry is reachable, with the real provider's "Unable to create container with image" error), then
  like the real one reads the container
  back: one that already exited is still created, with `mustRun: false` and `exitCode` in its state.
  A start that fails after `docker create` (a missing device, the GPU hook) leaves the container
  `Created` and hands it to the engine as half-created (ErrorResourceInitFailed, base.InitFailed): it
  stays in the state with init errors and the next `up`'s empty Update starts nothing, as the bridge's.
  Update applies the restart policy / resources (`docker update`) and starts the container when
  `mustRun` goes false -> true; nothing else. Delete stops with `destroyGraceSeconds` (0 when unset,
  as the real one) and removes it (force, anonymous volumes unless `removeVolumes: false`); a missing
  container is fine. Read (refresh): gone -> dropped; otherwise the fields the real Read re-reads from
  `docker inspect` (name, image, command, entrypoints, restart, networkMode, ipcMode, memory, mounts,
  capabilities, and ulimits/devices/gpus when configured; never envs or labels) go into the state and,
  for the keys the inputs have, into the inputs, as the bridge extracts them; stopped -> `mustRun: false`
  (+ `exitCode`) too. A field that does not round-trip therefore shows as a diff after a refresh.
- `docker:index/volume:Volume`: name, driver, driverOpts, labels replace; create/remove (retrying
  "in use" for 30 s like the real one; missing is fine); Read: gone if missing, else name, driver,
  driverOpts, labels and mountpoint as the node has them (a volume recreated with other options is a diff).
- `docker:index/remoteImage:RemoteImage`: name, platform, triggers, pullTriggers replace; Create/Update
  ensure the image is on the node (pull when missing); outputs `imageId`, `repoDigest`; id = imageId +
  name; Delete removes it unless `keepLocally`; Read: gone if missing.
- `docker:index/image:Image` (native in pulumi-docker): Check adds `buildOnPreview` (false), defaults
  `build.context` (".") / `build.dockerfile` (<context>/Dockerfile) / `build.platform` (linux/<this
  machine's arch>), and `build.contextDigest`: sha256 of the Dockerfile and every build-context file not
  excluded by `<dockerfile>.dockerignore` or `<context>/.dockerignore` (names, modes, contents), so a
  changed context file is a diff (update = rebuild) and an ignored one is not. Every change is an
  update, `imageName` included: pulumi-docker's Diff never replaces an Image. Create/Update build on the
  node's engine, the context uploaded from the plugin's cwd (the project dir), tagged `imageName`; never
  at preview; outputs add imageName, baseImageName, context, dockerfile, platform, registryServer and
  `repoDigest` (the image id, as with skipPush). Read changes nothing, Delete leaves the image.

Deliberate limits of the double: no push (`skipPush` must be true) and no `buildOnPreview`; the classic
builder instead of BuildKit; inputs the program does not use (volumes, uploads, networksAdvanced, ...)
are rejected at Check.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid
from contextlib import contextmanager
from pathlib import Path

import docker
import docker.errors
from docker.utils.build import tar as build_tar

from sim.providers.base import (
    UNKNOWN,
    Provider,
    InitFailed,
    ProviderError,
    from_struct,
    has_unknown,
    reveal,
    serve,
    type_of,
)
from .docker_schema import (
    CONTAINER_SUPPORTED, CONTAINER_UPDATABLE, IMAGE_BUILD_SUPPORTED, IMAGE_SUPPORTED, REMOTE_IMAGE_SUPPORTED,
    VOLUME_SUPPORTED, container_create_kwargs, container_update_kwargs, context_digest, diff_container, diff_image,
    diff_remote_image, diff_volume, host_platform, ignore_patterns, labels_map, read_back_container,
    read_back_volume, refreshed_inputs, repo_digest, stopped_fields,
)  # fmt: skip

# The Terraform resources' default CRUD timeouts (seconds), applied when the engine sends none (no customTimeouts).
BRIDGED_DEFAULT_TIMEOUTS = {"docker:index/container:Container": 20 * 60, "docker:index/remoteImage:RemoteImage": 20 * 60}

CONTAINER = "docker:index/container:Container"
VOLUME = "docker:index/volume:Volume"
REMOTE_IMAGE = "docker:index/remoteImage:RemoteImage"
IMAGE = "docker:index/image:Image"
TYPES = (CONTAINER, VOLUME, REMOTE_IMAGE, IMAGE)

# Builds and stops can stream nothing for minutes; the SDK's timeout is per socket read.
DOCKER_TIMEOUT = 600
VOLUME_IN_USE_RETRY_SECONDS = 30  # resourceDockerVolumeDelete's retry window
SHIM_PREFIX = "docker-double-ssh-"

# ---------------------------------------------------------------------------------------- provider


def _reject_unsupported(kind: str, inputs: dict, supported: frozenset) -> None:
    extra = sorted(set(inputs) - supported)
    if extra:
        raise ProviderError(f"{kind}: inputs not implemented by the docker TEST DOUBLE: {extra}")


class DockerProvider(Provider):
    name = "docker"
    version = "5.2.0"

    def __init__(self, cwd: Path | None = None):
        self.cwd = Path(cwd or os.getcwd())  # the engine starts plugins in the project directory
        self.host: str | None = None
        self.ssh_opts: list[str] = []
        self._shim_dir: str | None = None
        self._docker: docker.DockerClient | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ connection

    def configure(self, config: dict) -> None:
        self.host = config.get("host") or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        opts = config.get("sshOpts") or []
        if isinstance(opts, str):  # config variables arrive JSON-encoded
            opts = json.loads(opts) if opts.strip() else []
        self.ssh_opts = [str(o) for o in opts]
        if self.host.startswith("ssh://"):
            self._install_ssh_shim()
        elif self.host.startswith("unix://"):
            # The bridged provider builds its client and pings a local engine as it is configured, in preview
            # too (terraform-provider-docker config.go: "Error pinging Docker server"): no engine, no preview.
            try:
                docker.DockerClient(base_url=self.host, timeout=10).ping()
            except docker.errors.DockerException as exc:
                raise ProviderError(f"Error pinging Docker server: {exc}") from None

    def _install_ssh_shim(self) -> None:
        """`ssh` first on PATH = the system ssh with sshOpts (docker-py runs plain `ssh ... dial-stdio`).

        The shim lives in a temp dir named after its content, shared and never deleted: the engine
        kills plugins without running exit handlers, so per-process dirs would pile up."""
        path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if SHIM_PREFIX not in d)
        real_ssh = shutil.which("ssh", path=path) or "/usr/bin/ssh"  # never another double's shim
        script = (
            "#!/bin/sh\n# docker TEST DOUBLE (sim/providers/docker.py): the system ssh with a provider's sshOpts\n"
            f"exec {' '.join(shlex.quote(a) for a in [real_ssh, *self.ssh_opts])} \"$@\"\n"
        )
        digest = hashlib.sha256(script.encode()).hexdigest()[:16]
        shim_dir = Path(tempfile.gettempdir()) / f"{SHIM_PREFIX}{os.getuid()}" / digest
        shim_dir.mkdir(parents=True, exist_ok=True)
        tmp = shim_dir / f".ssh.{os.getpid()}"
        tmp.write_text(script)
        tmp.chmod(0o755)
        os.replace(tmp, shim_dir / "ssh")  # atomic: another plugin may be running the same shim
        self._shim_dir = str(shim_dir)
        os.environ["PATH"] = f"{shim_dir}{os.pathsep}{path}"

    def client(self) -> docker.DockerClient:
        """The node's engine, connected on first use (never at preview)."""
        with self._lock:
            if self._docker is None:
                if self.host is None:
                    raise ProviderError("docker TEST DOUBLE: used before Configure (no host)")
                try:
                    c = docker.DockerClient(
                        base_url=self.host, use_ssh_client=self.host.startswith("ssh://"), timeout=DOCKER_TIMEOUT
                    )
                    c.ping()
                except Exception as exc:  # noqa: BLE001 - any failure to reach the engine
                    why = f"{type(exc).__name__}: {exc}"
                    if self.host.startswith("ssh://"):
                        why += f"; ssh says: {self._ssh_diagnosis()}"
                    raise ProviderError(f"cannot reach the docker engine at {self.host}: {why}") from None
                self._docker = c
            return self._docker

    def _ssh_diagnosis(self) -> str:
        """docker-py leaves ssh's own error on our stderr ("Broken pipe" is all it reports): ask once more."""
        u = urllib.parse.urlparse(self.host)
        args = ["ssh", *(["-l", u.username] if u.username else []), *(["-p", str(u.port)] if u.port else [])]
        try:
            proc = subprocess.run([*args, "--", u.hostname, "docker version --format '{{.Server.Version}}'"],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            return f"{type(exc).__name__}: {exc}"
        out = (proc.stderr.strip() or proc.stdout.strip())[-500:]
        return f"exit {proc.returncode}: {out}" if proc.returncode else f"ssh works, docker version {out}"

    @contextmanager
    def _on_host(self, what: str):
        """Name the host in every docker/ssh/transport failure."""
        try:
            yield
        except ProviderError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ProviderError(f"{what} on {self.host}: {type(exc).__name__}: {exc}") from None

    # ------------------------------------------------------------------ dispatch

    @staticmethod
    def _known(type_: str) -> None:
        if type_ not in TYPES:
            raise ProviderError(
                f"the docker TEST DOUBLE does not implement resource type {type_} "
                "(only Container, Volume, RemoteImage and Image)"
            )

    def check(self, type_: str, olds: dict, news: dict) -> dict:
        self._known(type_)
        if type_ == CONTAINER:
            _reject_unsupported("Container", news, CONTAINER_SUPPORTED)
        elif type_ == VOLUME:
            _reject_unsupported("Volume", news, VOLUME_SUPPORTED)
        elif type_ == REMOTE_IMAGE:
            _reject_unsupported("RemoteImage", news, REMOTE_IMAGE_SUPPORTED)
        else:
            return self.check_image(news)
        return news

    def diff(self, type_: str, id_: str, olds: dict, news: dict, ignore: list[str]) -> Diff:
        self._known(type_)
        return {CONTAINER: diff_container, VOLUME: diff_volume, REMOTE_IMAGE: diff_remote_image,
                IMAGE: diff_image}[type_](olds, news, ignore)  # fmt: skip

    def Diff(self, request, context):
        """As base, but a Container diffs `mustRun` against the prior *state* (the bridge diffs against
        state): a container seen stopped (Create/Read) has mustRun=false there, so `up` restarts it
        unless the program ignores mustRun."""
        olds = from_struct(request.old_inputs) if request.HasField("old_inputs") else from_struct(request.olds)
        state = from_struct(request.olds)
        if type_of(request.urn) == CONTAINER and "mustRun" in state:
            olds = {**olds, "mustRun": state["mustRun"]}
        try:
            d = self.diff(type_of(request.urn), request.id, olds, from_struct(request.news),
                          list(request.ignoreChanges))  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            self._fail(context, f"diff {request.urn}", exc)
        return d.response()

    def _within_deadline(self, type_: str, fn):
        """Run `fn` under the step's deadline: the engine's customTimeouts, else the Terraform resource's default
        (20 minutes for docker_container and docker_image: resource_docker_container.go 12-14,
        resource_docker_image.go 10-12; none for a volume), as the SDK's context.WithTimeout around each CRUD
        call. Past it the step fails with the docker client's `context deadline exceeded` (the double cannot
        cancel the docker call itself: it is left to finish, where the real client's request is cancelled)."""
        timeout = self.step_timeout() or BRIDGED_DEFAULT_TIMEOUTS.get(type_)
        if timeout is None:
            return fn()
        done: dict = {}

        def work():
            try:
                done["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the step
                done["error"] = exc

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise ProviderError(f"context deadline exceeded (the step's {timeout:g} s)")
        if "error" in done:
            raise done["error"]
        return done["value"]

    def create(self, type_: str, urn: str, inputs: dict, preview: bool) -> tuple[str, dict]:
        self._known(type_)
        if preview:
            return "", inputs  # nothing is created, nothing is contacted at preview
        if type_ == CONTAINER:
            return self._within_deadline(type_, lambda: self.create_container(inputs, urn))
        create = {VOLUME: self.create_volume, REMOTE_IMAGE: self.ensure_remote_image, IMAGE: self.build_image}[type_]
        return self._within_deadline(type_, lambda: create(inputs))

    def read(self, type_: str, urn: str, id_: str, state: dict, inputs: dict) -> tuple[dict, dict] | None:
        self._known(type_)
        if type_ == CONTAINER:
            return self.read_container(id_, state, inputs)
        if type_ == VOLUME:
            return self.read_volume(id_, state, inputs)
        if type_ == REMOTE_IMAGE:
            return self.read_remote_image(state, inputs)
        return state, inputs  # pulumi-docker's Image Read does no reconciliation

    def update(self, type_: str, urn: str, id_: str, olds: dict, news: dict, preview: bool) -> dict:
        self._known(type_)
        if preview:
            return news
        if type_ == CONTAINER:
            return self._within_deadline(type_, lambda: self.update_container(id_, olds, news))
        if type_ == REMOTE_IMAGE:
            return self._within_deadline(type_, lambda: self.ensure_remote_image(news)[1])
        if type_ == IMAGE:
            return self.build_image(news)[1]  # any change to an Image rebuilds it
        return news  # a Volume has nothing to update in place (cluster volumes aside)

    def delete(self, type_: str, urn: str, id_: str, state: dict) -> None:
        self._known(type_)
        if type_ == CONTAINER:
            self._within_deadline(type_, lambda: self.delete_container(id_, state))
        elif type_ == VOLUME:
            self.delete_volume(id_, state)
        elif type_ == REMOTE_IMAGE:
            self.delete_remote_image(state)
        # IMAGE: pulumi-docker's Delete is a no-op: the built image stays on the node

    # ------------------------------------------------------------------ Container

    def create_container(self, inputs: dict, urn: str = "") -> tuple[str, dict]:
        i = reveal(inputs)
        name = i.get("name", "")
        kwargs = container_create_kwargs(i)  # input errors before touching the node
        client = self.client()
        with self._on_host(f"creating container {name}"):
            # findImage (terraform-provider-docker resource_docker_container_funcs.go): the local image, else a
            # pull; what a pull fails with is the error (here: no registry is reachable, so it always fails)
            image = i["image"]
            try:
                client.images.get(image)
            except docker.errors.ImageNotFound:
                try:
                    client.images.pull(image)
                except docker.errors.DockerException as exc:
                    raise ProviderError(f"Unable to create container with image {image}: unable to pull image "
                                        f"{image}: error pulling image {image}: {exc}") from None
            container = client.containers.create(**kwargs)
        # From here on the container exists: resourceDockerContainerCreate has called d.SetId (v4.5.0 line 460),
        # so a failure is a half-created resource the bridge hands back with its ID (InitFailed), not a removal:
        # the container stays `Created` on the node and in the state, with the planned inputs (mustRun true:
        # no Read ran), and the next `up` sends it an empty Update that starts nothing (resourceDockerContainerUpdate
        # starts a container only when mustRun goes false -> true, line 998).
        try:
            if i.get("start", True):
                try:
                    container.start()  # line 586: "Unable to start container: %s"
                except docker.errors.APIError as exc:
                    raise ProviderError(f"Unable to start container: Error response from daemon: "
                                        f"{exc.explanation or exc}") from None
                if i.get("wait", False):
                    self._wait_healthy(container, int(i.get("waitTimeout", 60)))
            with self._on_host(f"reading container {name}"):
                container.reload()  # the real Create ends with a Read of the container
        except ProviderError as exc:
            # pulumi-terraform-bridge's Create: errors.Wrapf(err, "creating %s", urn) over Terraform's diagnostics
            raise InitFailed(container.id, dict(inputs), [f"creating {urn}: 1 error occurred:\n\t* {exc}"]) from None
        return container.id, {**inputs, **stopped_fields(container.attrs)}

    @staticmethod
    def _wait_healthy(container, timeout: int) -> None:
        deadline = time.monotonic() + timeout
        while True:
            container.reload()
            health = (container.attrs.get("State") or {}).get("Health")
            if health is None:
                raise ProviderError(
                    "you have supplied a 'wait' argument, but the container does not have a healthcheck defined"
                )
            if health.get("Status") == "healthy":
                return
            if time.monotonic() > deadline:
                raise ProviderError(f"container {container.name} failed to be in healthy state in time")
            time.sleep(1)

    def read_container(self, id_: str, state: dict, inputs: dict) -> tuple[dict, dict] | None:
        client = self.client()
        with self._on_host(f"reading container {id_[:12]}"):
            try:
                container = client.containers.get(id_)
            except docker.errors.NotFound:
                return None
        # resourceDockerContainerRead re-reads the container's fields (read_back_container) and, when it is not
        # running, its exit code and mustRun=false; the bridge's Read returns inputs taken from that state.
        read = {**read_back_container(container.attrs, inputs), **stopped_fields(container.attrs)}
        new_inputs = refreshed_inputs(inputs, {k: v for k, v in read.items() if k != "exitCode"})
        return {**state, **read}, new_inputs

    def update_container(self, id_: str, olds: dict, news: dict) -> dict:
        o, n = reveal(olds), reveal(news)
        client = self.client()
        with self._on_host(f"updating container {n.get('name', id_[:12])}"):
            container = client.containers.get(id_)
            if any(o.get(k) != n.get(k) for k in CONTAINER_UPDATABLE):
                container.update(**container_update_kwargs(n))
            # resourceDockerContainerUpdate starts the container only when mustRun goes false -> true.
            if not o.get("mustRun", True) and n.get("mustRun", True) and n.get("start", True):
                container.start()
        return news

    def delete_container(self, id_: str, state: dict) -> None:
        s = reveal(state)
        client = self.client()
        with self._on_host(f"deleting container {s.get('name', id_[:12])}"):
            try:
                container = client.containers.get(id_)
            except docker.errors.NotFound:
                return
            if not s.get("attach", False):
                grace = int(s.get("destroyGraceSeconds") or 0)
                try:
                    container.stop(timeout=grace if grace > 0 else 0)  # unset = 0 s, as the real provider
                except docker.errors.NotFound:
                    return
            try:
                container.remove(force=True, v=bool(s.get("removeVolumes", True)))
                container.wait(condition="removed" if s.get("rm") else "not-running")
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if "is already in progress" not in str(exc):
                    raise

    # ------------------------------------------------------------------ Volume

    def create_volume(self, inputs: dict) -> tuple[str, dict]:
        i = reveal(inputs)
        client = self.client()
        with self._on_host(f"creating volume {i.get('name', '')}"):
            volume = client.volumes.create(
                name=i.get("name"), driver=i.get("driver"), driver_opts=i.get("driverOpts"),
                labels=labels_map(i.get("labels")) or None,
            )  # fmt: skip
        outputs = {**inputs, "mountpoint": volume.attrs.get("Mountpoint", "")}
        outputs.setdefault("name", volume.name)  # Optional+Computed
        outputs.setdefault("driver", volume.attrs.get("Driver", "local"))
        return volume.name, outputs

    def read_volume(self, id_: str, state: dict, inputs: dict) -> tuple[dict, dict] | None:
        client = self.client()
        with self._on_host(f"reading volume {id_}"):
            try:
                volume = client.volumes.get(id_)
            except docker.errors.NotFound:
                return None
        read = read_back_volume(volume.attrs)  # resourceDockerVolumeRead (resource_docker_volume.go 308-312)
        return {**state, **read}, refreshed_inputs(inputs, {k: v for k, v in read.items() if k != "mountpoint"})

    def delete_volume(self, id_: str, state: dict) -> None:
        client = self.client()
        deadline = time.monotonic() + VOLUME_IN_USE_RETRY_SECONDS
        with self._on_host(f"deleting volume {id_}"):
            while True:
                try:
                    client.api.remove_volume(id_, force=True)
                    return
                except docker.errors.NotFound:
                    return
                except docker.errors.APIError as exc:
                    if "volume is in use" in str(exc) and time.monotonic() < deadline:
                        time.sleep(2)
                        continue
                    raise

    # ------------------------------------------------------------------ RemoteImage

    def ensure_remote_image(self, inputs: dict) -> tuple[str, dict]:
        """findImage: the local image, else a pull."""
        i = reveal(inputs)
        name = i["name"]
        client = self.client()
        with self._on_host(f"image {name}"):
            try:
                image = client.images.get(name)
            except docker.errors.ImageNotFound:
                try:
                    image = client.images.pull(name, platform=i.get("platform") or None)
                except Exception as exc:  # noqa: BLE001
                    raise ProviderError(
                        f"image {name} is not on {self.host} and pulling it failed: {type(exc).__name__}: {exc}"
                    ) from None
        outputs = {**inputs, "imageId": image.id, "repoDigest": repo_digest(name, image.attrs.get("RepoDigests") or [])}
        return image.id + name, outputs  # the real resource's id: image id + name

    def read_remote_image(self, state: dict, inputs: dict) -> tuple[dict, dict] | None:
        name = reveal(state).get("name") or reveal(inputs)["name"]
        client = self.client()
        with self._on_host(f"reading image {name}"):
            try:
                image = client.images.get(name)
            except docker.errors.ImageNotFound:
                return None
        digest = repo_digest(name, image.attrs.get("RepoDigests") or [])
        return {**state, "imageId": image.id, "repoDigest": digest}, inputs

    def delete_remote_image(self, state: dict) -> None:
        s = reveal(state)
        if s.get("keepLocally"):
            return  # shared, multi-GB images stay on the node
        client = self.client()
        with self._on_host(f"removing image {s['name']}"):
            try:
                client.images.remove(s["name"], force=bool(s.get("forceRemove", False)))
            except docker.errors.ImageNotFound:
                pass

    # ------------------------------------------------------------------ Image (build)

    def check_image(self, news: dict) -> dict:
        """pulumi-docker provider.go Check: defaults, Dockerfile check and `build.contextDigest`."""
        _reject_unsupported("Image", news, IMAGE_SUPPORTED)
        inputs = dict(news)
        if reveal(inputs.get("buildOnPreview")) is True:
            raise ProviderError("Image: buildOnPreview is not implemented by the docker TEST DOUBLE")
        inputs["buildOnPreview"] = False  # the real default (an unknown value counts as false too)
        if reveal(inputs.get("skipPush")) is not True and not has_unknown(inputs.get("skipPush")):
            raise ProviderError("Image: pushing is not implemented by the docker TEST DOUBLE; set skip_push=True")
        build = inputs.get("build")
        build = {} if build is None else dict(build)
        _reject_unsupported("Image build", build, IMAGE_BUILD_SUPPORTED)
        if build.get("context") is None:
            build["context"] = "."
        if build.get("dockerfile") is None and build["context"] != UNKNOWN:
            build["dockerfile"] = posixpath.join(build["context"], "Dockerfile")
        dockerfile, ctx = build.get("dockerfile"), build["context"]
        if dockerfile is not None and dockerfile != UNKNOWN:
            path = self.cwd / dockerfile
            if not path.is_file():
                if Path(dockerfile).is_absolute():
                    raise ProviderError(f"expected a relative Dockerfile path; got {dockerfile!r} instead")
                if ctx != UNKNOWN and (self.cwd / ctx / dockerfile).is_file():
                    raise ProviderError(
                        f"could not open dockerfile at relative path {dockerfile!r}. "
                        f"Try setting `dockerfile` to {posixpath.join(ctx, dockerfile)!r}"
                    )
                raise ProviderError(f"could not open dockerfile at relative path {dockerfile!r}")
            if ctx != UNKNOWN:
                build["contextDigest"] = context_digest(Path(ctx), Path(dockerfile), self.cwd)
        if build.get("platform") is None:
            build["platform"] = host_platform()
        inputs["build"] = build
        return inputs

    def build_image(self, inputs: dict) -> tuple[str, dict]:
        """docker build on the node's engine, the context uploaded from the plugin's cwd (dockerBuild)."""
        i = reveal(inputs)
        b, name = i["build"], i["imageName"]
        context, dockerfile = self.cwd / b["context"], self.cwd / b["dockerfile"]
        patterns = ignore_patterns(dockerfile, context)
        rel = os.path.relpath(dockerfile, context)
        if rel.startswith(".."):  # a Dockerfile outside the context travels inside the tar under a random name
            df_name = f".dockerfile.{uuid.uuid4().hex[:20]}"
            df = (df_name, dockerfile.read_text())
        else:
            df_name, df = rel, (rel, None)
        client = self.client()
        with self._on_host(f"building image {name}"):
            with build_tar(str(context), exclude=list(patterns), dockerfile=df) as fileobj:
                try:
                    image, _ = client.images.build(
                        fileobj=fileobj, custom_context=True, dockerfile=df_name, tag=name,
                        buildargs={k: v for k, v in (b.get("args") or {}).items()}, platform=b.get("platform"),
                        target=b.get("target"), network_mode=b.get("network"),
                        rm=True, forcerm=True,  # no intermediate containers left behind, failed build or not
                    )  # fmt: skip
                except docker.errors.BuildError as exc:
                    lines = "".join(str(x.get("stream") or x.get("error") or "") for x in exc.build_log)
                    tail = "\n".join(lines.rstrip().splitlines()[-20:])
                    raise ProviderError(f"building image {name} on {self.host}: {exc.msg}\n{tail}") from None
        outputs = {
            **inputs,
            "imageName": name,
            "baseImageName": name,
            "context": b["context"],
            "dockerfile": rel,
            "platform": b.get("platform"),
            "registryServer": (i.get("registry") or {}).get("server", ""),
            "repoDigest": image.id,  # with skipPush the real provider reports the local image id here
        }
        return name, outputs


def main() -> None:
    serve(DockerProvider())


if __name__ == "__main__":
    main()
