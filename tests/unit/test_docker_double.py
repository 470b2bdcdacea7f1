"""The docker plugin TEST DOUBLE (sim/providers/docker.py): diff rules, input -> docker SDK mapping,
Create/Read/Update/Delete semantics against a fake docker client, and the build-context digest."""

import json
import os
import shutil
import subprocess

import docker.errors
import pytest
from google.protobuf import struct_pb2
from pulumi.runtime.proto import provider_pb2

from sim.providers import base
from sim.providers import docker as dd
from sim.providers.docker_schema import _normalized_container as normalized_container
from sim.providers.base import SECRET_SIG, SIG_KEY, UNKNOWN, ProviderError, to_struct

URN = "urn:pulumi:sim::deepseek-spark::deepseek-spark:index:SglangGroup$docker:index/container:Container::rank0"


def container_inputs(**over):
    base = {
        "name": "dspark-sim-rank0",
        "image": "sglang-sim:test-double",
        "entrypoints": ["/bin/sh", "-c"],
        "command": ["serve"],
        "envs": ["A=1", "B=2"],
        "labels": [{"label": "deepseek-spark.rank", "value": "0"}, {"label": "deepseek-spark.stack", "value": "sim"}],
        "networkMode": "host",
        "ipcMode": "host",
        "gpus": "all",
        "devices": [{"hostPath": "/dev/infiniband", "containerPath": "/dev/infiniband", "permissions": "rwm"}],
        "capabilities": {"adds": ["IPC_LOCK", "SYS_PTRACE"]},
        "ulimits": [{"name": "memlock", "soft": -1, "hard": -1}, {"name": "nofile", "soft": 1048576, "hard": 1048576}],
        "mounts": [
            {"target": "/model", "source": "ckpt", "type": "volume", "readOnly": True},
            {"target": "/key", "source": "/var/lib/key", "type": "bind", "readOnly": True},
        ],
        "restart": "no",
        "mustRun": True,
        "wait": False,
        "destroyGraceSeconds": 30,
    }
    base.update(over)
    return base


# ------------------------------------------------------------------------------ Container diff


def test_changed_label_replaces_delete_before_replace():
    olds = container_inputs()
    news = container_inputs(labels=[{"label": "deepseek-spark.rank", "value": "1"}])
    d = dd.DockerProvider().diff(dd.CONTAINER, "id", olds, news, [])
    assert d.changed == ["labels"] and d.replaces == ["labels"]
    resp = d.response()
    assert resp.deleteBeforeReplace is True
    # the bridge's detailed diff (MakeDetailedDiffV2): set elements matched by identity, compared at their index
    kinds = {k: provider_pb2.PropertyDiff.Kind.Name(v.kind) for k, v in resp.detailedDiff.items()}
    assert kinds == {"labels[0].value": "UPDATE_REPLACE", "labels[1]": "DELETE_REPLACE"}


def test_detailed_diffs_name_list_indices_and_map_keys_like_the_bridge():
    d = dd.diff_container(container_inputs(command=["serve", "--tp", "3"]),
                          container_inputs(command=["serve", "--tp", "4", "--x"], memory=100), [])  # fmt: skip
    assert d.detailed == {"command[2]": "UPDATE_REPLACE", "command[3]": "ADD_REPLACE", "memory": "ADD"}
    v = dd.diff_volume({"name": "v", "driverOpts": {"type": "nfs", "o": "ro"}},
                       {"name": "v", "driverOpts": {"type": "nfs", "o": "ro,nconnect=8"}}, [])  # fmt: skip
    assert v.detailed == {"driverOpts.o": "UPDATE_REPLACE"}
    assert dd.diff_container(container_inputs(), container_inputs(), []).detailed == {}


@pytest.mark.parametrize(
    "key,value",
    [("name", "x"), ("image", "other:1"), ("command", ["x"]), ("entrypoints", ["x"]), ("envs", ["A=2"]),
     ("networkMode", "bridge"), ("ipcMode", "private"), ("gpus", "1"), ("devices", []), ("ulimits", []),
     ("mounts", []), ("capabilities", {"adds": ["IPC_LOCK"]})],
)  # fmt: skip
def test_force_new_fields_replace(key, value):
    d = dd.diff_container(container_inputs(), container_inputs(**{key: value}), [])
    assert d.replaces == [key]


@pytest.mark.parametrize("key,value", [("restart", "unless-stopped"), ("mustRun", False), ("wait", True),
                                       ("destroyGraceSeconds", 60), ("memory", 512)])  # fmt: skip
def test_non_force_new_fields_update_in_place(key, value):
    d = dd.diff_container(container_inputs(), container_inputs(**{key: value}), [])
    assert d.changed == [key] and d.replaces == []
    assert d.response().deleteBeforeReplace is False


def test_ignore_changes_honoured():
    olds, news = container_inputs(mustRun=False), container_inputs()
    assert dd.diff_container(olds, news, ["mustRun"]).changed == []
    assert dd.diff_container(olds, news, []).changed == ["mustRun"]


def test_sets_ignore_order_and_defaults_fill_in():
    olds = container_inputs()
    news = container_inputs(envs=["B=2", "A=1"], labels=list(reversed(olds["labels"])),
                            capabilities={"adds": ["SYS_PTRACE", "IPC_LOCK"]})  # fmt: skip
    assert dd.diff_container(olds, news, []).changed == []
    # restart "no" is the schema default: stating it or not is no change
    no_restart = container_inputs()
    del no_restart["restart"]
    assert dd.diff_container(olds, no_restart, []).changed == []
    # command is a list: order matters
    assert dd.diff_container(container_inputs(command=["a", "b"]), container_inputs(command=["b", "a"]), []).replaces


def test_computed_input_dropped_is_no_change_but_unknown_replaces():
    news = container_inputs()
    del news["command"]
    assert dd.diff_container(container_inputs(), news, []).changed == []
    after = container_inputs(labels=[{"label": "deepseek-spark.after", "value": UNKNOWN}])
    assert dd.diff_container(container_inputs(), after, []).replaces == ["labels"]


def test_secret_wrapper_alone_is_no_change():
    secret = {SIG_KEY: SECRET_SIG, "value": ["A=1", "B=2"]}
    assert dd.diff_container(container_inputs(), container_inputs(envs=secret), []).changed == []


def test_grpc_diff_takes_must_run_from_state():
    """A container that exited at Create has mustRun=false in its state: `up` restarts it, unless ignored."""
    provider = dd.DockerProvider()
    inputs = container_inputs()
    state = {**inputs, "mustRun": False, "exitCode": 1}

    def request(ignore):
        return provider_pb2.DiffRequest(urn=URN, id="abc", olds=to_struct(state), news=to_struct(inputs),
                                        old_inputs=to_struct(inputs), ignoreChanges=ignore)  # fmt: skip

    resp = provider.Diff(request([]), None)
    assert list(resp.diffs) == ["mustRun"] and list(resp.replaces) == []
    assert provider.Diff(request(["mustRun"]), None).changes == provider_pb2.DiffResponse.DIFF_NONE


# ------------------------------------------------------------------------------ other diffs


def test_volume_diff():
    vol = {"name": "ckpt", "driver": "local", "driverOpts": {"type": "none", "o": "bind", "device": "/m"},
           "labels": [{"label": "deepseek-spark.stack", "value": "sim"}]}  # fmt: skip
    for key, value in [("name", "other"), ("driver", "nfs"), ("driverOpts", {"type": "nfs"}), ("labels", [])]:
        d = dd.DockerProvider().diff(dd.VOLUME, "ckpt", vol, {**vol, key: value}, [])
        assert d.replaces == [key] and d.response().deleteBeforeReplace is False
    assert dd.diff_volume(vol, dict(vol), []).changed == []


def test_remote_image_diff():
    img = {"name": "sglang:1", "keepLocally": True}
    assert dd.diff_remote_image(img, {**img, "name": "sglang:2"}, []).replaces == ["name"]
    d = dd.diff_remote_image(img, {**img, "keepLocally": False}, [])
    assert d.changed == ["keepLocally"] and d.replaces == []


def test_image_diff_is_always_an_update():
    img = {"imageName": "sglang:overlay", "skipPush": True, "buildOnPreview": False,
           "build": {"context": "o", "dockerfile": "o/Dockerfile", "platform": "linux/amd64", "contextDigest": "a"}}
    rebuilt = {**img, "build": {**img["build"], "contextDigest": "b"}}
    d = dd.diff_image(img, rebuilt, [])
    assert d.changed == ["build"] and d.replaces == []
    renamed = dd.diff_image(img, {**img, "imageName": "sglang:other"}, [])
    assert renamed.changed == ["imageName"] and renamed.replaces == []  # pulumi-docker never replaces an Image
    creds = dd.diff_image({**img, "registry": {"server": "r", "password": "a"}},
                          {**img, "registry": {"server": "r", "password": "b"}}, [])  # fmt: skip
    assert creds.changed == []


# ------------------------------------------------------------------------------ input -> docker SDK


def test_container_create_kwargs():
    kw = dd.container_create_kwargs(container_inputs(envs=["A=1"], maxRetryCount=0))
    assert kw["name"] == "dspark-sim-rank0" and kw["image"] == "sglang-sim:test-double"
    assert kw["entrypoint"] == ["/bin/sh", "-c"] and kw["command"] == ["serve"]
    assert kw["environment"] == ["A=1"]
    assert kw["labels"] == {"deepseek-spark.rank": "0", "deepseek-spark.stack": "sim"}
    assert kw["network_mode"] == "host" and kw["ipc_mode"] == "host"
    (req,) = kw["device_requests"]
    assert req["Count"] == -1 and req["Capabilities"] == [["gpu"]]
    assert kw["devices"] == ["/dev/infiniband:/dev/infiniband:rwm"]
    assert kw["cap_add"] == ["IPC_LOCK", "SYS_PTRACE"] and "cap_drop" not in kw
    assert [(u["Name"], u["Soft"], u["Hard"]) for u in kw["ulimits"]] == [
        ("memlock", -1, -1), ("nofile", 1048576, 1048576)]  # fmt: skip
    vol, bind = kw["mounts"]
    assert (vol["Type"], vol["Source"], vol["Target"], vol["ReadOnly"]) == ("volume", "ckpt", "/model", True)
    assert (bind["Type"], bind["Source"], bind["Target"], bind["ReadOnly"]) == ("bind", "/var/lib/key", "/key", True)
    assert kw["restart_policy"] == {"Name": "no", "MaximumRetryCount": 0}
    assert kw["init"] is False and kw["auto_remove"] is False


def test_container_create_kwargs_defaults_and_variants():
    kw = dd.container_create_kwargs({"name": "c", "image": "i", "restart": "unless-stopped", "gpus": "2",
                                     "capabilities": {"drops": ["ALL"]}, "shmSize": 64,
                                     "ports": [{"internal": 8000, "external": 30000}]})  # fmt: skip
    assert kw["network_mode"] == "bridge"  # the schema default
    assert kw["restart_policy"]["Name"] == "unless-stopped"
    assert kw["device_requests"][0]["Count"] == 2
    assert kw["cap_drop"] == ["ALL"] and "cap_add" not in kw
    assert kw["shm_size"] == 64 * 1024 * 1024
    assert kw["ports"] == {"8000/tcp": [("0.0.0.0", 30000)]}
    assert "entrypoint" not in kw and "command" not in kw and "mounts" not in kw
    assert dd.container_create_kwargs({"name": "c", "image": "i", "gpus": "device=0,1"})["device_requests"][0][
        "DeviceIDs"] == ["0", "1"]  # fmt: skip
    with pytest.raises(ProviderError):
        dd.container_create_kwargs({"name": "c", "image": "i", "command": ["a", ""]})


def test_check_rejects_unimplemented_inputs_and_types():
    p = dd.DockerProvider()
    assert p.check(dd.CONTAINER, {}, container_inputs()) == container_inputs()
    with pytest.raises(ProviderError, match="uploads"):
        p.check(dd.CONTAINER, {}, container_inputs(uploads=[{"file": "/x", "content": "y"}]))
    with pytest.raises(ProviderError, match="does not implement resource type docker:index/network:Network"):
        p.check("docker:index/network:Network", {}, {"name": "n"})
    with pytest.raises(ProviderError, match="does not implement"):
        p.create("docker:index/network:Network", "urn", {"name": "n"}, preview=False)


# ------------------------------------------------------------------------------ fake docker client


class FakeContainer:
    def __init__(self, client, cid, name, running=True, exit_code=0):
        self.client, self.id, self.name = client, cid, name
        self.running, self.exit_code = running, exit_code
        self.calls = []

    inspect: dict = {}

    @property
    def attrs(self):
        return {**self.inspect, "Id": self.id, "State": {"Running": self.running, "ExitCode": self.exit_code}}

    def start(self):
        self.calls.append(("start",))
        if self.client.start_error:
            raise docker.errors.APIError("500 Server Error", explanation=self.client.start_error)
        self.running = not self.client.exits_at_once

    def reload(self):
        pass

    def stop(self, timeout):
        self.calls.append(("stop", timeout))
        self.running = False

    def remove(self, force=False, v=False):
        self.calls.append(("remove", force, v))
        self.client.containers.items.pop(self.id, None)

    def wait(self, condition):
        self.calls.append(("wait", condition))

    def update(self, **kwargs):
        self.calls.append(("update", kwargs))


class FakeContainers:
    def __init__(self, client):
        self.client, self.items, self.created = client, {}, []

    def get(self, cid):
        if cid not in self.items:
            raise docker.errors.NotFound(f"No such container: {cid}")
        return self.items[cid]

    def create(self, **kwargs):
        self.created.append(kwargs)
        c = FakeContainer(self.client, f"c{len(self.created):063d}", kwargs["name"], running=False, exit_code=3)
        self.items[c.id] = c
        return c


class FakeImages:
    def __init__(self, present=()):
        self.present = set(present)

    def get(self, name):
        if name not in self.present:
            raise docker.errors.ImageNotFound(f"No such image: {name}")
        return type("Img", (), {"id": "sha256:" + "1" * 64, "attrs": {"RepoDigests": []}})()

    def pull(self, name, **kw):
        self.pulled = [*getattr(self, "pulled", []), name]
        if name.startswith("pullable/"):
            self.present.add(name)
            return self.get(name)
        raise docker.errors.APIError(f"pull access denied for {name.split(':')[0]}, repository does not exist")


class FakeClient:
    def __init__(self, images=("sglang-sim:test-double",), exits_at_once=False, start_error=""):
        self.containers = FakeContainers(self)
        self.images = FakeImages(images)
        self.exits_at_once, self.start_error = exits_at_once, start_error


def provider_with(client):
    p = dd.DockerProvider()
    p.host = "ssh://root@spark1"
    p._docker = client  # skip the connection
    return p


def test_create_starts_container_and_returns_inputs():
    client = FakeClient()
    p = provider_with(client)
    cid, outputs = p.create(dd.CONTAINER, URN, container_inputs(), preview=False)
    c = client.containers.items[cid]
    assert c.calls == [("start",)] and c.running
    assert outputs == container_inputs()
    assert client.containers.created[0]["name"] == "dspark-sim-rank0"


def test_create_of_container_that_exits_at_once_succeeds_with_must_run_false():
    client = FakeClient(exits_at_once=True)
    cid, outputs = provider_with(client).create(dd.CONTAINER, URN, container_inputs(), preview=False)
    assert cid in client.containers.items  # still created
    assert outputs["mustRun"] is False and outputs["exitCode"] == 3


def test_create_without_image_pulls_it_and_fails_as_the_real_one_when_the_pull_fails():
    """findImage: a missing image is pulled at container create (so a pruned image can come back as whatever
    its tag is now); a failed pull is the real provider's error."""
    client = FakeClient(images=())
    with pytest.raises(ProviderError) as err:
        provider_with(client).create(dd.CONTAINER, URN, container_inputs(image="other:1"), False)
    # the real text (the engine names the resource; the host is its provider's)
    assert "Unable to create container with image other:1: unable to pull image other:1: error pulling image " \
           "other:1: pull access denied for other" in str(err.value)
    assert client.images.pulled == ["other:1"] and not client.containers.created
    cid, _ = provider_with(client).create(dd.CONTAINER, URN, container_inputs(image="pullable/x:1"), False)
    assert client.containers.created[-1]["image"] == "pullable/x:1"


GPU_HOOK_ERROR = ("failed to create task for container: failed to create shim task: OCI runtime create failed: "
                  "error running prestart hook #0: exit status 1, stdout: , stderr: nvidia-container-cli: "
                  "initialization error: nvml error: driver not loaded: unknown")


def test_a_start_that_fails_after_create_keeps_the_container_as_half_created_like_the_bridge():
    """resourceDockerContainerCreate sets the ID before it starts the container: a failed start is a partial
    state (ErrorResourceInitFailed) with the container still there (`Created`), not a removal."""
    client = FakeClient(start_error=GPU_HOOK_ERROR)
    p = provider_with(client)
    with pytest.raises(base.InitFailed) as err:
        p.create(dd.CONTAINER, URN, container_inputs(), preview=False)
    cid = client.containers.created and next(iter(client.containers.items))
    assert err.value.id == cid and ("remove", True, True) not in client.containers.items[cid].calls
    assert err.value.properties == container_inputs()  # the planned state: mustRun still true (no Read ran)
    assert err.value.reasons == [f"creating {URN}: 1 error occurred:\n\t* Unable to start container: "
                                 f"Error response from daemon: {GPU_HOOK_ERROR}"]
    # the next `up`: no diff, so the engine sends an empty Update for the init errors; it starts nothing
    p.update(dd.CONTAINER, URN, cid, container_inputs(), container_inputs(), preview=False)
    assert client.containers.items[cid].calls == [("start",)]
    # a refresh reads it not running: mustRun false in state and inputs, which the next `up` diffs
    state, inputs = p.read(dd.CONTAINER, URN, cid, container_inputs(), container_inputs())
    assert state["mustRun"] is False and inputs["mustRun"] is False


def test_a_half_created_resource_reaches_the_engine_as_an_error_resource_init_failed_detail():
    """The gRPC status carries google.rpc.Status with the ErrorResourceInitFailed detail the engine parses."""
    from google.rpc import status_pb2

    class Aborted(Exception):
        pass

    class Context:
        trailing = ()

        def set_trailing_metadata(self, md):
            self.trailing = md

        def abort(self, code, message):
            self.code, self.message = code, message
            raise Aborted

    ctx = Context()
    with pytest.raises(Aborted):
        dd.DockerProvider()._fail(ctx, "create", base.InitFailed("cid1", {"name": "r0"}, ["creating u: boom"]))
    (key, raw), = ctx.trailing
    status = status_pb2.Status.FromString(raw)
    detail = provider_pb2.ErrorResourceInitFailed()
    assert key == "grpc-status-details-bin" and status.details[0].Unpack(detail)
    assert detail.id == "cid1" and list(detail.reasons) == ["creating u: boom"]
    assert base.from_struct(detail.properties) == {"name": "r0"} and ctx.message == "create: creating u: boom"


def test_preview_never_contacts_the_engine():
    p = dd.DockerProvider()  # not configured, no client: any engine call would raise
    for kind, inputs in [(dd.CONTAINER, container_inputs()), (dd.VOLUME, {"name": "v"}),
                         (dd.REMOTE_IMAGE, {"name": "i"}), (dd.IMAGE, {"imageName": "i"})]:  # fmt: skip
        assert p.create(kind, URN, inputs, preview=True) == ("", inputs)
        assert p.update(kind, URN, "id", inputs, inputs, preview=True) == inputs


# `docker inspect` of container_inputs()'s container, in the fields moby reports (docker 26, the sim's nodes)
INSPECT = {
    "Name": "/dspark-sim-rank0", "Image": "sha256:" + "1" * 64,
    "Config": {"Image": "sglang-sim:test-double", "Cmd": ["serve"], "Entrypoint": ["/bin/sh", "-c"],
               "Env": ["A=1", "B=2", "PATH=/usr/bin"], "Labels": {"deepseek-spark.rank": "0", "from-image": "x"}},
    "HostConfig": {
        "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0}, "NetworkMode": "host", "IpcMode": "host",
        "Privileged": False, "Memory": 0, "MemorySwap": 0, "ShmSize": 67108864, "LogConfig": {"Type": "json-file"},
        "CapAdd": ["IPC_LOCK", "SYS_PTRACE"], "CapDrop": None,
        "Ulimits": [{"Name": "memlock", "Soft": -1, "Hard": -1}, {"Name": "nofile", "Soft": 1048576, "Hard": 1048576}],
        "Devices": [{"PathOnHost": "/dev/infiniband", "PathInContainer": "/dev/infiniband", "CgroupPermissions": "rwm"}],
        "DeviceRequests": [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}],
        "Mounts": [{"Type": "volume", "Source": "ckpt", "Target": "/model", "ReadOnly": True},
                   {"Type": "bind", "Source": "/var/lib/key", "Target": "/key", "ReadOnly": True}],
    },
}  # fmt: skip


def test_read_container_running_gone_stopped():
    client = FakeClient()
    p = provider_with(client)
    c = FakeContainer(client, "abc", "dspark-sim-rank0", running=True)
    c.inspect = INSPECT
    client.containers.items["abc"] = c
    state, inputs = container_inputs(), container_inputs()
    new_state, new_inputs = p.read(dd.CONTAINER, URN, "abc", state, inputs)
    assert normalized_container(new_inputs) == normalized_container(inputs), "a refresh changes no input"
    assert new_state["shmSize"] == 64 and new_state["logDriver"] == "json-file"  # computed, read into the state
    assert not dd.diff_container(new_inputs, container_inputs(), []).changed
    c.running, c.exit_code = False, 137
    new_state, new_inputs = p.read(dd.CONTAINER, URN, "abc", state, inputs)
    assert new_state["mustRun"] is False and new_state["exitCode"] == 137
    assert new_inputs["mustRun"] is False
    assert p.read(dd.CONTAINER, URN, "gone", state, inputs) is None


def test_refresh_reads_drift_back_into_the_inputs_so_up_repairs_it():
    """resourceDockerContainerRead re-reads the fields, the bridge extracts the inputs from them: a memory limit
    changed on the node is an in-place update at the next `up`, a mount changed underneath a replacement;
    envs and labels are never read (they merge with the image's)."""
    client = FakeClient()
    p = provider_with(client)
    c = FakeContainer(client, "abc", "dspark-sim-rank0", running=True)
    c.inspect = {**INSPECT, "HostConfig": {**INSPECT["HostConfig"], "Memory": 256 * 1024 * 1024,
                                           "MemorySwap": 1024 * 1024 * 1024,
                                           "Mounts": INSPECT["HostConfig"]["Mounts"][:1]}}  # fmt: skip
    client.containers.items["abc"] = c
    program = container_inputs(memory=1024, memorySwap=1024)
    _, refreshed = p.read(dd.CONTAINER, URN, "abc", program, program)
    assert refreshed["memory"] == 256 and len(refreshed["mounts"]) == 1
    assert refreshed["envs"] == ["A=1", "B=2"] and refreshed["labels"] == container_inputs()["labels"]
    d = dd.diff_container(refreshed, program, [])
    assert sorted(d.changed) == ["memory", "mounts"] and d.replaces == ["mounts"]


def test_refresh_of_a_volume_recreated_with_other_options_is_a_replacement():
    client = FakeClient()
    client.volumes = type("Volumes", (), {"get": lambda self, vid: type("V", (), {"attrs": {
        "Name": "ckpt", "Driver": "local", "Options": {"type": "nfs", "o": "addr=10.0.0.1,ro"},
        "Labels": {"deepseek-spark.stack": "sim"}, "Mountpoint": "/var/lib/docker/volumes/ckpt/_data"}})()})()
    p = provider_with(client)
    inputs = {"name": "ckpt", "driver": "local", "driverOpts": {"type": "nfs", "o": "addr=10.0.0.1,ro,nconnect=8"},
              "labels": [{"label": "deepseek-spark.stack", "value": "sim"}]}
    state, refreshed = p.read(dd.VOLUME, URN, "ckpt", inputs, inputs)
    assert state["mountpoint"].endswith("/ckpt/_data") and refreshed["driverOpts"]["o"] == "addr=10.0.0.1,ro"
    assert dd.diff_volume(refreshed, inputs, []).replaces == ["driverOpts"]
    same = dict(refreshed)
    assert p.read(dd.VOLUME, URN, "ckpt", same, same)[1] == same


def test_update_applies_restart_and_starts_only_when_must_run_goes_true():
    client = FakeClient()
    p = provider_with(client)
    c = FakeContainer(client, "abc", "dspark-sim-rank0", running=False)
    client.containers.items["abc"] = c
    olds = container_inputs()
    p.update(dd.CONTAINER, URN, "abc", olds, container_inputs(restart="unless-stopped"), preview=False)
    assert c.calls == [("update", {"restart_policy": {"Name": "unless-stopped", "MaximumRetryCount": 0}})]
    c.calls.clear()
    p.update(dd.CONTAINER, URN, "abc", olds, container_inputs(destroyGraceSeconds=5), preview=False)
    assert c.calls == []  # nothing to do on the node
    p.update(dd.CONTAINER, URN, "abc", {**olds, "mustRun": False}, container_inputs(), preview=False)
    assert c.calls == [("start",)]


def test_delete_container_stops_with_grace_and_removes():
    client = FakeClient()
    p = provider_with(client)
    c = FakeContainer(client, "abc", "dspark-sim-rank0")
    client.containers.items["abc"] = c
    p.delete(dd.CONTAINER, URN, "abc", container_inputs())
    assert c.calls == [("stop", 30), ("remove", True, True), ("wait", "not-running")]
    assert "abc" not in client.containers.items
    p.delete(dd.CONTAINER, URN, "abc", container_inputs())  # already gone: fine


def test_remote_image_keep_locally_and_read():
    client = FakeClient(images=("sglang:1",))
    client.images.remove = lambda *a, **k: pytest.fail("keepLocally: the image must stay")
    p = provider_with(client)
    rid, outputs = p.create(dd.REMOTE_IMAGE, URN, {"name": "sglang:1", "keepLocally": True}, preview=False)
    assert rid == "sha256:" + "1" * 64 + "sglang:1" and outputs["imageId"].startswith("sha256:")
    p.delete(dd.REMOTE_IMAGE, URN, rid, outputs)
    assert p.read(dd.REMOTE_IMAGE, URN, rid, outputs, {"name": "sglang:1"})[0]["imageId"] == outputs["imageId"]
    client.images.present.clear()
    assert p.read(dd.REMOTE_IMAGE, URN, rid, outputs, {"name": "sglang:1"}) is None


# ------------------------------------------------------------------------------ configure / ssh shim


def test_configure_ssh_shim_from_json_or_list(monkeypatch):
    monkeypatch.setenv("PATH", os.environ["PATH"])  # restored after the test
    opts = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=7"]
    for given in (json.dumps(opts), opts):
        p = dd.DockerProvider()
        p.configure({"host": "ssh://root@10.0.0.2:2222", "sshOpts": given})
        assert p.host == "ssh://root@10.0.0.2:2222" and p.ssh_opts == opts and p._docker is None
        shim = os.path.join(p._shim_dir, "ssh")
        assert os.environ["PATH"].split(os.pathsep)[0] == p._shim_dir
        assert shutil.which("ssh") == shim
        assert "BatchMode=yes" in open(shim).read()
        if os.path.exists("/usr/bin/ssh"):  # the shim really hands the options to ssh (-G: print config, no connection)
            out = subprocess.run([shim, "-G", "10.0.0.2"], capture_output=True, text=True, check=True).stdout
            assert "connecttimeout 7" in out and "batchmode yes" in out
    # PATH holds one shim only, whatever the number of Configure calls
    assert sum("docker-double-ssh-" in d for d in os.environ["PATH"].split(os.pathsep)) == 1


def test_configure_non_ssh_host_has_no_shim(monkeypatch):
    pinged = []
    monkeypatch.setattr(dd.docker, "DockerClient", lambda **kw: type("C", (), {"ping": lambda self: pinged.append(kw)})())
    p = dd.DockerProvider()
    p.configure({"host": "unix:///var/run/docker.sock"})
    assert p._shim_dir is None and p.ssh_opts == []
    assert pinged[0]["base_url"] == "unix:///var/run/docker.sock"


def test_configure_pings_a_local_engine_and_fails_without_one(tmp_path):
    """Like the bridged provider: a unix:// engine is pinged when the provider is configured (preview too)."""
    with pytest.raises(ProviderError, match="Error pinging Docker server: "):
        dd.DockerProvider().configure({"host": f"unix://{tmp_path}/none.sock"})


# ------------------------------------------------------------------------------ Image: Check and context digest


@pytest.fixture
def project(tmp_path):
    ctx = tmp_path / "overlay"
    (ctx / "src").mkdir(parents=True)
    (ctx / "Dockerfile").write_text("FROM sglang-sim:test-double\nCOPY src /src\n")
    (ctx / "src" / "patch.py").write_text("print(1)\n")
    (ctx / "notes.md").write_text("scratch\n")
    (ctx / ".dockerignore").write_text("# scratch\n*.md\n")
    return tmp_path


def image_inputs(**build):
    return {"imageName": "sglang:overlay", "skipPush": True,
            "build": {"context": "overlay", "dockerfile": "overlay/Dockerfile", "args": {"A": "1"}, **build}}


def test_check_image_adds_digest_and_defaults(project):
    p = dd.DockerProvider(cwd=project)
    checked = p.check(dd.IMAGE, {}, image_inputs())
    assert checked["buildOnPreview"] is False
    assert checked["build"]["platform"] == dd.host_platform()
    assert len(checked["build"]["contextDigest"]) == 64
    assert p.check(dd.IMAGE, {}, image_inputs(platform="linux/arm64"))["build"]["platform"] == "linux/arm64"
    defaults = p.check(dd.IMAGE, {}, {"imageName": "x", "skipPush": True, "build": {"context": "overlay"}})["build"]
    assert defaults["dockerfile"] == "overlay/Dockerfile"


def test_digest_ignores_dockerignored_files_but_not_others(project):
    p = dd.DockerProvider(cwd=project)

    def digest():
        return p.check(dd.IMAGE, {}, image_inputs())["build"]["contextDigest"]

    first = digest()
    (project / "overlay" / "notes.md").write_text("changed, but ignored\n")
    assert digest() == first
    (project / "overlay" / "src" / "patch.py").write_text("print(2)\n")
    second = digest()
    assert second != first
    (project / "overlay" / "src" / "patch.py").chmod(0o755)  # a mode change counts too
    assert digest() != second
    (project / "overlay" / "src" / "new.py").write_text("")
    assert digest() != second


def test_dockerfile_specific_ignore_file_wins(project):
    p = dd.DockerProvider(cwd=project)
    (project / "overlay" / "Dockerfile.dockerignore").write_text("src\n")
    first = p.check(dd.IMAGE, {}, image_inputs())["build"]["contextDigest"]
    (project / "overlay" / "src" / "patch.py").write_text("print(3)\n")
    assert p.check(dd.IMAGE, {}, image_inputs())["build"]["contextDigest"] == first
    (project / "overlay" / "notes.md").write_text("now counted\n")
    assert p.check(dd.IMAGE, {}, image_inputs())["build"]["contextDigest"] != first


def test_check_image_errors(project):
    p = dd.DockerProvider(cwd=project)
    with pytest.raises(ProviderError, match="Try setting `dockerfile` to 'overlay/Dockerfile'"):
        p.check(dd.IMAGE, {}, image_inputs(dockerfile="Dockerfile"))
    with pytest.raises(ProviderError, match="pushing"):
        p.check(dd.IMAGE, {}, {**image_inputs(), "skipPush": False})
    with pytest.raises(ProviderError, match="buildOnPreview"):
        p.check(dd.IMAGE, {}, {**image_inputs(), "buildOnPreview": True})
    unknown = p.check(dd.IMAGE, {}, image_inputs(dockerfile=UNKNOWN))
    assert "contextDigest" not in unknown["build"]  # nothing to hash until the path is known


def test_struct_round_trip_of_checked_image(project):
    checked = dd.DockerProvider(cwd=project).check(dd.IMAGE, {}, image_inputs())
    assert isinstance(to_struct(checked), struct_pb2.Struct)


def test_a_step_past_its_deadline_fails_with_context_deadline_exceeded_and_the_bridged_defaults_apply():
    """customTimeouts (the engine's `timeout`) bound a Container's or RemoteImage's Create/Update/Delete; without
    them the Terraform resources' 20-minute defaults do; a Volume has none."""
    import time

    client = FakeClient()
    p = provider_with(client)
    slow = client.containers.create

    def create_slowly(**kw):
        time.sleep(1.5)
        return slow(**kw)

    client.containers.create = create_slowly
    p._step.timeout = 0.3  # what Provider._start_step takes from the request
    try:
        with pytest.raises(ProviderError, match=r"context deadline exceeded \(the step's 0.3 s\)"):
            p.create(dd.CONTAINER, URN, container_inputs(), preview=False)
        p._step.timeout = None
        assert dd.BRIDGED_DEFAULT_TIMEOUTS == {dd.CONTAINER: 1200, dd.REMOTE_IMAGE: 1200}
        cid, _ = p.create(dd.CONTAINER, URN, container_inputs(), preview=False)  # well within 20 minutes
        assert cid in client.containers.items
    finally:
        p._step.timeout = None
