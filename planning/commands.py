"""Shell command strings run on the nodes (remote.Command) or where Pulumi runs (local.Command).

Small pure functions; every interpolated value goes through shlex.quote. No secret is ever an
argument here: the API key reaches nodes on stdin and the readiness probe through its environment.
Scripts are POSIX sh, because remote.Command runs them with the ssh user's login shell.
"""

from __future__ import annotations

import json
import shlex

from . import fabric, launch, memoryplan, plan
from declared.cluster import ClusterConfig
from programs import memgate as memgate_program

q = shlex.quote


def sudo(user: str) -> str:
    """Prefix for commands that need root on the node (`sudo -n`: fail instead of prompting)."""
    return "" if user == "root" else "sudo -n "


def key_sudo(cfg: ClusterConfig, user: str | None = None) -> str:
    """sudo for an API key file only when it lives outside the ssh user's home (the head's user, or
    `user`: the router node's)."""
    user = user or cfg.nodes[0].ssh_user
    return "" if plan.state_dir(cfg, user).startswith(f"/home/{user}/") else sudo(user)


def head_needs_sudo(cfg: ClusterConfig) -> bool:
    return bool(key_sudo(cfg)) or (cfg.share.mode == "nfs" and len(cfg.nodes) > 1 and cfg.nodes[0].ssh_user != "root")


def rails_check_args(cfg: ClusterConfig, rank: int, fmt: str = "check") -> list[str]:
    """programs/rails.py's arguments on node `rank`: `check` (preflight and the guard's start gate: link checks
    and peers too), `env` (a rank's entrypoint)."""
    f = cfg.fabric
    args = [*fabric.rails_args(cfg, rank), "--format", fmt]
    if fmt == "check":
        args += ["--node", cfg.nodes[rank].name, "--speed-mbps", str(f.link_speed_mbps), "--mtu", str(f.mtu)]
        args += [f"--peer={name}={ip}" for name, ip in fabric.peers(cfg, rank)]
    return args


def rails_run(cfg: ClusterConfig, rank: int, fmt: str, then: str = "") -> str:
    """`python3 -` of programs/rails.py in a quoted heredoc (`then`: the rest of its command line, e.g.
    `|| failed=1`): `check` for preflight (link checks and peers too), `env` for a rank's entrypoint."""
    return fabric.heredoc(rails_check_args(cfg, rank, fmt), then)


def preflight(cfg: ClusterConfig, stack: str, rank: int) -> str:
    """Read-only checks on one node; reports every failure (node, check, fix), exits 1 if any failed."""
    node = cfg.nodes[rank]
    own = plan.container_name(stack, rank)
    lines = [
        f"node={q(node.name)}; failed=0",
        'fail() { echo "preflight $node: FAIL $1: $2" >&2; failed=1; }',
        'ok() { echo "preflight $node: ok $1"; }',
        # docker usable by the ssh user
        "if docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; then ok docker; else "
        'fail docker "docker is missing or $(id -un) cannot use it; install docker and add the user to the docker group"; fi',
        # GPU visible, and not busy with anything but this stack's own rank
        "if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then ok gpu; else "
        'fail gpu "nvidia-smi lists no GPU; check the NVIDIA driver and container toolkit"; fi',
        "busy=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -c . || true)",
        f"mine=$(docker ps -q --filter name={q('^/' + own + '$')} 2>/dev/null | grep -c . || true)",
        'if [ "${busy:-0}" -gt 0 ] && [ "${mine:-0}" -eq 0 ]; then '
        'fail gpu-idle "$busy process(es) already use the GPU; stop them (nvidia-smi shows which) before serving"; '
        "else ok gpu-idle; fi",
        # a user-space OOM guard: reported, not required (a node out of memory can lock up instead of killing)
        "if pgrep -x earlyoom >/dev/null 2>&1 || systemctl is-active --quiet systemd-oomd 2>/dev/null; then "
        "ok oom-guard; else echo \"preflight $node: note oom-guard: neither earlyoom nor systemd-oomd runs, so memory "
        "pressure can wedge the node instead of killing a rank; install one (apt install earlyoom)\"; fi",
        # RDMA devices for NCCL over RoCE
        "if [ -e /dev/infiniband ]; then ok infiniband; else "
        'fail infiniband "/dev/infiniband is missing; install the MLNX/DOCA OFED drivers"; fi',
        # the data plane: rails of the cabled port, GIDs, speed, MTU, no-fragment pings (programs/rails.py)
        "if command -v python3 >/dev/null 2>&1; then",
        rails_run(cfg, rank, "check", " || failed=1"),
        'else fail fabric "python3 is missing on the node (the fabric checks run with it); install python3"; fi',
    ]
    if node.ssh_user != "root" and cfg.memory.drop_caches:
        # the memory gate drops the page cache on every node (programs/memgate.py) after the old ranks are gone:
        # proven here, before anything stops; `sudo -l CMD` asks whether the rule allows it without running it
        drop = " ".join(q(a) for a in memgate_program.DROP)
        lines.append(
            f"if sudo -n -l {drop} >/dev/null 2>&1; then ok sudo-drop-caches; else "
            f'fail sudo-drop-caches "$(id -un) may not run \'{drop}\' through sudo -n (the memory gate drops the '
            f"page cache before the group starts); add the rule '{memgate_program.sudoers_rule(node.ssh_user)}' with visudo "
            '-f /etc/sudoers.d/deepseek-spark, or set memory.dropCaches: false"; fi'
        )
    if cfg.fabric.bandwidth_gate and len(cfg.nodes) > 1:
        lines.append(
            "if command -v ib_write_bw >/dev/null 2>&1; then ok perftest; else "
            'fail perftest "ib_write_bw is missing (the bandwidth gate runs it between the nodes before the group '
            'starts); install Debian\'s perftest (apt install perftest), or set fabric.bandwidthGate: false"; fi'
        )
    if cfg.model.source == "download":
        lines += _download_space(cfg)
    if rank == 0 and head_needs_sudo(cfg):
        lines.append(
            "if sudo -n true 2>/dev/null; then ok sudo; else "
            'fail sudo "$(id -un) needs passwordless sudo on the head for the NFS export and the API key file; '
            'add a sudoers rule, or set stateDir under the home directory and share.mode: local"; fi'
        )
    if cfg.model.source == "shared" and (rank == 0 or cfg.share.mode == "local"):
        ckpt = cfg.model.checkpoint_dir
        n = cfg.model.expected_shards
        lines += [
            f"ckpt={q(ckpt)}",
            'if [ -f "$ckpt/config.json" ]; then ok checkpoint-config; else '
            'fail checkpoint-config "$ckpt/config.json is missing; download the checkpoint to model.checkpointDir"; fi',
            "shards=$(ls \"$ckpt\" 2>/dev/null | grep -c '^model-.*-of-.*\\.safetensors$' || true)",
            f'if [ "${{shards:-0}}" -ge {n} ]; then ok checkpoint-shards; else '
            f'fail checkpoint-shards "$shards of {n} model-*-of-*.safetensors files in $ckpt; finish the download"; fi',
        ]
    if cfg.engram is not None:
        lines += _engram_space(cfg, rank)
    lines += [
        'if [ "$failed" -ne 0 ]; then echo "preflight $node: failed, nothing was changed on the node" >&2; fi',
        'exit "$failed"',
    ]
    return "\n".join(lines) + "\n"


def _download_space(cfg: ClusterConfig) -> list[str]:
    """The checkpoint's room on this node before the group stops: a complete download (its stamp at the revision
    and every shard) needs none, else the filesystem of model.checkpointDir must hold the whole checkpoint."""
    gib = memoryplan.PROFILES[cfg.model.profile].checkpoint_gib
    if not gib:
        return []
    m = cfg.model
    return [
        f"cdir={q(m.checkpoint_dir)}; rev={q(m.revision)}",
        "have=$(ls \"$cdir\" 2>/dev/null | grep -c '\\.safetensors$' || true)",
        'd="$cdir"; while [ ! -d "$d" ]; do d=$(dirname "$d"); done',
        "avail=$(df -Pk \"$d\" | awk 'NR==2 {print $4}')",
        f'if [ "$(cat "$cdir/.deepseek-spark-download" 2>/dev/null)" = "$rev" ] && [ "${{have:-0}}" -ge '
        f'{m.expected_shards} ]; then ok checkpoint-space; '
        f'elif [ "${{avail:-0}}" -ge {int(gib * 1024 * 1024)} ]; then ok checkpoint-space; else '
        f'fail checkpoint-space "$d has $((avail / 1048576)) GiB free, the checkpoint needs {gib:.0f} GiB (download '
        f'on every node); free space or point model.checkpointDir at a larger disk"; fi',
    ]


def _engram_space(cfg: ClusterConfig, rank: int) -> list[str]:
    need_kb = int(memoryplan.engram_shard_gib(cfg) * 1024 * 1024)
    files = " ".join(q(f"{cfg.engram.dir}/{name}") for name in plan.shard_files(rank, cfg.serving.tp_size))
    return [
        f"edir={q(cfg.engram.dir)}",
        f"present=1; for s in {files}; do [ -f \"$s\" ] || present=0; done",
        'd="$edir"; while [ ! -d "$d" ]; do d=$(dirname "$d"); done',
        "avail=$(df -Pk \"$d\" | awk 'NR==2 {print $4}')",
        f'if [ "$present" -eq 1 ] || [ "${{avail:-0}}" -ge {need_kb} ]; then ok engram-space; else '
        f'fail engram-space "$d has $((avail / 1048576)) GiB free, the rank {rank} shard needs '
        f'{memoryplan.engram_shard_gib(cfg):.1f} GiB; free space or point engram.dir at a larger NVMe"; fi',
    ]


def download(cfg: ClusterConfig, stack: str) -> str:
    """Fetch the checkpoint into model.checkpointDir on this node, once per revision.

    Skips when a stamp with the current revision and the expected shards exist. An optional
    Hugging Face token arrives on stdin (first line) and reaches the container through its
    environment, never through the command line. The image's `hf` CLI fetches it (huggingface_hub
    1.0 removed `huggingface-cli`; `hf download` has been there since 0.34).
    """
    m = cfg.model
    return (
        "set -eu\n"
        f"dir={q(m.checkpoint_dir)}; stamp=\"$dir/.deepseek-spark-download\"; rev={q(m.revision)}; "
        f"repo={q(m.hf_repo or '')}\n"
        "count() { ls \"$dir\" 2>/dev/null | grep -c '\\.safetensors$' || true; }\n"
        f'if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$rev" ] && [ "$(count)" -ge {m.expected_shards} ]; then\n'
        '  echo "checkpoint $repo@$rev already in $dir"; exit 0\n'
        "fi\n"
        'mkdir -p "$dir"\n'
        "HF_TOKEN=''; IFS= read -r HF_TOKEN || true; export HF_TOKEN\n"
        'token=""; [ -n "$HF_TOKEN" ] && token="-e HF_TOKEN"\n'
        f"docker rm -f {q(stack + '-download')} >/dev/null 2>&1 || true\n"
        f"docker run --rm --name {q(stack + '-download')} --network host --entrypoint hf $token "
        f'-v "$dir":/download {q(cfg.image)} download {q(m.hf_repo or "")} --revision "$rev" --local-dir /download\n'
        f'if [ "$(count)" -lt {m.expected_shards} ]; then\n'
        f'  echo "checkpoint download: $(count) of {m.expected_shards} safetensors files in $dir" >&2; exit 1\n'
        "fi\n"
        "printf '%s\\n' \"$rev\" > \"$stamp\"\n"
    )


# The head's read-only rsync daemon that seeds the workers' copies (model.source: download, share.mode: local).
SEED_PORT = 8730
SEED_MODULE = "checkpoint"
SEED_HOURS = 24  # the daemon stops by itself after this, even if `up` was interrupted before seed-stop


# stop a running seed daemon and wait until it is gone (its port is free again)
_SEED_KILL = (
    'if [ -s "$d/rsyncd.pid" ]; then pid=$(cat "$d/rsyncd.pid"); kill "$pid" 2>/dev/null || true\n'
    '  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; rm -f "$d/rsyncd.pid"; fi\n'
)


def seed_dir(cfg: ClusterConfig, stack: str) -> str:
    return f"{plan.state_dir(cfg)}/{stack}/checkpoint-seed"


def seed_clients(cfg: ClusterConfig) -> list[str]:
    """The workers' addresses on their links with the head: the only hosts the daemon answers."""
    return [fabric.link(cfg, 0, r).b_ip if fabric.link(cfg, 0, r) else cfg.nodes[r].fabric_ip
            for r in range(1, len(cfg.nodes))]  # fmt: skip


def seed_start(cfg: ClusterConfig, stack: str) -> str:
    """On the head, after its download: serve the checkpoint read-only over rsync to exactly the workers'
    data-plane addresses, so each worker copies it over ConnectX-7 instead of pulling ~400 GiB from
    the hub. Runs in the background (bounded by SEED_HOURS) until seed_stop."""
    d = seed_dir(cfg, stack)
    conf = (f"pid file = {d}/rsyncd.pid\nlog file = {d}/rsyncd.log\nport = {SEED_PORT}\nuse chroot = no\n"
            f"max connections = {len(cfg.nodes)}\n"
            f"[{SEED_MODULE}]\n  path = {cfg.model.checkpoint_dir}\n  read only = yes\n  list = no\n"
            f"  hosts allow = {' '.join(seed_clients(cfg))}\n  hosts deny = *\n")  # fmt: skip
    return (
        "set -eu\n"
        "command -v rsync >/dev/null 2>&1 || "
        "{ echo 'checkpoint seed: rsync is missing on the head; install rsync (apt install rsync)' >&2; exit 1; }\n"
        f"d={q(d)}\nmkdir -p \"$d\"\n"
        + _SEED_KILL +
        f"printf '%s' {q(conf)} > \"$d/rsyncd.conf\"\n"
        f'nohup setsid timeout {SEED_HOURS}h rsync --daemon --no-detach --config "$d/rsyncd.conf" '
        '> "$d/rsyncd.out" 2>&1 < /dev/null &\n'
        "bg=$!\n"
        'for _ in $(seq 50); do [ -s "$d/rsyncd.pid" ] && break; kill -0 "$bg" 2>/dev/null || break; sleep 0.2; done\n'
        "sleep 0.5\n"  # it writes its pid file before it binds the port: still there means it listens
        'if [ ! -s "$d/rsyncd.pid" ] || ! kill -0 "$bg" 2>/dev/null; then\n'
        '  echo "checkpoint seed: rsync --daemon did not start:" >&2; cat "$d/rsyncd.log" "$d/rsyncd.out" >&2 || true; exit 1\n'
        "fi\n"
        f"echo {q(f'seeding {cfg.model.checkpoint_dir} read-only on port {SEED_PORT} to ' + ' '.join(seed_clients(cfg)))}\n"
    )


def seed_stop(cfg: ClusterConfig, stack: str) -> str:
    d = seed_dir(cfg, stack)
    return f"d={q(d)}\n" + _SEED_KILL + "echo 'checkpoint seed stopped'\n"


def checkpoint_copy(cfg: ClusterConfig, rank: int) -> str:
    """On worker `rank`: copy the head's checkpoint over their ConnectX-7 link, once per revision.

    rsync checks every file it moves (whole-file checksum) and keeps partial files, so an interrupted
    copy resumes; a second, dry pass must then find nothing left to move, and the shard count must
    match, before the stamp that marks the revision is written."""
    m = cfg.model
    lk = fabric.link(cfg, 0, rank)
    src = f"rsync://{lk.a_ip if lk else cfg.nodes[0].fabric_ip}:{SEED_PORT}/{SEED_MODULE}/"
    me = lk.b_ip if lk else cfg.nodes[rank].fabric_ip  # the source address: this worker's end of the link
    return (
        "set -eu\n"
        f"dir={q(m.checkpoint_dir)}; stamp=\"$dir/.deepseek-spark-download\"; rev={q(m.revision)}; src={q(src)}; "
        f"me={q(me)}\n"
        "count() { ls \"$dir\" 2>/dev/null | grep -c '\\.safetensors$' || true; }\n"
        f'if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$rev" ] && [ "$(count)" -ge {m.expected_shards} ]; then\n'
        '  echo "checkpoint at revision $rev already in $dir"; exit 0\n'
        "fi\n"
        "command -v rsync >/dev/null 2>&1 || "
        "{ echo 'checkpoint copy: rsync is missing on this node; install rsync (apt install rsync)' >&2; exit 1; }\n"
        'mkdir -p "$dir"\n'
        'rsync -rt --partial --address "$me" --exclude .deepseek-spark-download "$src" "$dir/"\n'
        'left=$(rsync -rtn --itemize-changes --address "$me" --exclude .deepseek-spark-download "$src" "$dir/" '
        "| grep -c . || true)\n"
        f'if [ "$left" -ne 0 ] || [ "$(count)" -lt {m.expected_shards} ]; then\n'
        f'  echo "checkpoint copy from $src: $(count) of {m.expected_shards} safetensors files, $left left to move" >&2; exit 1\n'
        "fi\n"
        "printf '%s\\n' \"$rev\" > \"$stamp\"\n"
        f"echo {q(f'checkpoint copied from {cfg.nodes[0].name} over ConnectX-7 to ')}\"$dir\"\n"
    )


def exports_file(stack: str) -> str:
    return f"/etc/exports.d/deepseek-spark-{stack}.exports"


def export_line(cfg: ClusterConfig) -> str:
    """One exports(5) line: the checkpoint, read-only, to exactly each worker's address on its link with
    the head (the address its mount comes from)."""
    opts = ",".join(cfg.share.export_options)
    clients = " ".join(f"{c}({opts})" for c in export_clients(cfg))
    return f"{cfg.model.checkpoint_dir} {clients}"


def export_clients(cfg: ClusterConfig) -> list[str]:
    return [fabric.nfs_link(cfg, rank)[1] for rank in range(1, len(cfg.nodes))]


def export_create(cfg: ClusterConfig, stack: str) -> str:
    s = sudo(cfg.nodes[0].ssh_user)
    path = exports_file(stack)
    return (
        "set -eu\n"
        "command -v exportfs >/dev/null 2>&1 || "
        "{ echo 'checkpoint export: exportfs not found on the head; install nfs-kernel-server' >&2; exit 1; }\n"
        f"{s}mkdir -p /etc/exports.d\n"
        f"printf '%s\\n' {q(export_line(cfg))} | {s}tee {q(path)} >/dev/null\n"
        f"{s}exportfs -ra\n"
        f"echo exported {q(cfg.model.checkpoint_dir)} read-only to {q(' '.join(export_clients(cfg)))}\n"
    )


def export_delete(cfg: ClusterConfig, stack: str) -> str:
    s = sudo(cfg.nodes[0].ssh_user)
    return f"set -eu\n{s}rm -f {q(exports_file(stack))}\n{s}exportfs -ra\n"


def _engram_paths(cfg: ClusterConfig, rank: int) -> tuple[str, list[str]]:
    tp = cfg.serving.tp_size
    stamp = f"{cfg.engram.dir}/.engram-r{rank}of{tp}.revision"
    return stamp, [f"{cfg.engram.dir}/{name}" for name in plan.shard_files(rank, tp)]


def engram_pack(cfg: ClusterConfig, stack: str, rank: int) -> str:
    """Pack rank `rank` of TP onto this node's NVMe, once per checkpoint revision.

    Skips when the shards and a stamp with the current revision exist; removes shards of another
    revision first; the pack script itself skips files that already have the exact size.
    """
    tp = cfg.serving.tp_size
    stamp, files = _engram_paths(cfg, rank)
    shards = " ".join(q(f) for f in files)
    name = f"{stack}-engram-pack-r{rank}"
    return (
        "set -eu\n"
        f"dir={q(cfg.engram.dir)}; stamp={q(stamp)}; rev={q(cfg.model.revision)}\n"
        f"present=1; for s in {shards}; do [ -f \"$s\" ] || present=0; done\n"
        'if [ "$present" -eq 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$rev" ]; then\n'
        f'  echo "engram r{rank}of{tp} at revision $rev already packed in $dir"; exit 0\n'
        "fi\n"
        'mkdir -p "$dir"\n'
        f'if [ -f "$stamp" ] && [ "$(cat "$stamp")" != "$rev" ]; then rm -f {shards} "$stamp"; fi\n'
        f"docker rm -f {q(name)} >/dev/null 2>&1 || true\n"
        f"docker run --rm --network none --entrypoint test {q(cfg.image)} -f /opt/dsv41/scripts/pack_engram.py || "
        f"{{ echo {q(f'engram pack: {cfg.image} has no DSV4.1 adapter (/opt/dsv41); build the recipe overlay image on top of lmsysorg/sglang:dev-dsv41 and set image: to it')} >&2; exit 1; }}\n"
        f"docker run --rm --name {q(name)} --network none --entrypoint python3 "
        f"-v {q(plan.checkpoint_volume_name(stack) + ':' + launch.MODEL_MOUNT + ':ro')} "
        f'-v "$dir":{q(launch.ENGRAM_MOUNT)} {q(cfg.image)} /opt/dsv41/scripts/pack_engram.py '
        f"--model {q(launch.MODEL_MOUNT)} --out {q(launch.ENGRAM_MOUNT)} --rank {rank} --tp {tp} "
        f"--layers {','.join(str(layer) for layer in plan.ENGRAM_LAYERS)}\n"
        f"printf '%s\\n' \"$rev\" > \"$stamp\"\n"
        f'echo "engram r{rank}of{tp} packed in $dir"\n'
    )


def engram_delete(cfg: ClusterConfig, rank: int) -> str:
    """Runs only when engram.retain is false (otherwise Pulumi retains the shard on delete)."""
    stamp, files = _engram_paths(cfg, rank)
    return "rm -f " + " ".join(q(f) for f in [*files, stamp]) + "\n"


def api_key_create(cfg: ClusterConfig, stack: str) -> str:
    """Write stdin (the API key) to a 0600 file on the head; the key itself is never in the command."""
    return secret_file_create(plan.api_key_path(cfg, stack), key_sudo(cfg))


def api_key_delete(cfg: ClusterConfig, stack: str) -> str:
    return secret_file_delete(plan.api_key_path(cfg, stack), key_sudo(cfg))


def secret_file_create(path: str, s: str = "") -> str:
    """Write stdin to a 0600 file at `path` (`s`: the sudo prefix, or "")."""
    directory = path.rsplit("/", 1)[0]
    return (
        "set -eu\numask 077\n"
        f"{s}mkdir -p {q(directory)}\n"
        f"{s}sh -c 'umask 077; cat > \"$1\"' sh {q(path)}\n"
        f"{s}chmod 600 {q(path)}\n"
    )


def secret_file_delete(path: str, s: str = "") -> str:
    return f"{s}rm -f {q(path)}\n"


def router_key_path(cfg: ClusterConfig, user: str, stack: str) -> str:
    """The router's copy of the API key on its node: the group's stateDir, or the node user's default."""
    return f"{plan.state_dir(cfg, user)}/{stack}-router/api-key"


def generation_record(stack: str, revision: str) -> str:
    """Local command of the group generation: it only states which group revision it stands for."""
    return f"echo {q(f'{stack}: serving group generation for revision {revision}')}\n"


READINESS_KEY_ENV = "DSPARK_API_KEY"


def ssh_opts(cfg: ClusterConfig) -> list[str]:
    """Options of the system ssh client, for the docker provider and whatever else reaches the nodes
    from where Pulumi runs (the readiness probe): one list item each."""
    ssh = cfg.ssh
    opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={ssh.connect_timeout}"]
    opts += ["-o", "StrictHostKeyChecking=" + ("yes" if ssh.strict_host_key_checking else "accept-new")]
    if ssh.known_hosts_file:
        opts += ["-o", f"UserKnownHostsFile={ssh.known_hosts_file}"]
    if ssh.identity_file:
        opts += ["-i", ssh.identity_file]
    if ssh.connection_reuse:
        # One master connection per node carries every docker connection and probe as a session: parallel
        # steps open no new connections for sshd's MaxStartups to drop. Without the ControlPath's directory
        # ssh warns and connects without a master.
        opts += ["-o", "ControlMaster=auto", "-o", f"ControlPath={ssh.control_path}",
                 "-o", f"ControlPersist={ssh.control_persist_seconds}"]
    return opts


def readiness(cfg: ClusterConfig, stack: str, url: str | None = None, restart_hint: str = "",
              health_path: str = "/health", tunnel: bool = False, ca_env: str = "") -> str:  # fmt: skip
    """Local command: wait for rank 0 /health, then one authenticated chat completion, failing at
    once if a rank's container exits meanwhile. `url`: probe that endpoint (the router's, the gateway's
    at `health_path`) instead, without watching ranks. `tunnel`: rank 0's API is an inner port behind
    the stack's front (the fence lets only the stack's parts in): reach it through ssh to the head. `ca_env`: an
    https `url` is verified with the CA (PEM) in that environment variable (the front door's)."""
    r = cfg.readiness
    ranks = [
        f"--rank {q(f'{rank}={plan.container_name(stack, rank)}@{n.ssh_user}@{n.host}:{n.ssh_port}')}"
        for rank, n in enumerate(cfg.nodes)
    ] if url is None else []  # fmt: skip
    return " ".join(
        [
            "python3 -m programs.probe",
            f"--url {q(url or plan.endpoint(cfg))}",
            f"--model {q(cfg.model.served_name)}",
            f"--timeout {r.timeout_seconds}",
            f"--interval {r.interval_seconds}",
            f"--prompt {q(r.prompt)}",
            f"--expect {q(r.expect)}",
            f"--key-env {READINESS_KEY_ENV}",
            # what rank 0 must report it obtained (its boot log), against the plan
            *([f"--engine {cfg.engine}", f"--expect-kv-tokens {memoryplan.expected_kv_tokens(cfg)}",
               f"--min-kv-share {r.min_kv_share:g}", f"--kv-shortfall {r.kv_shortfall}"] if ranks else []),
            *ranks,
            *([f"--restart-hint {q(restart_hint)}"] if ranks and restart_hint else []),
            *([f"--health-path {q(health_path)}"] if health_path != "/health" else []),
            *([f"--tunnel {q(f'{cfg.nodes[0].ssh_user}@{cfg.nodes[0].host}:{cfg.nodes[0].ssh_port}')}"] if tunnel else []),
            *([f"--ca-env {ca_env}"] if ca_env else []),
            *(f"--ssh-opt={q(o)}" for o in (ssh_opts(cfg) if ranks or tunnel else [])),
        ]
    )


def fence(cfg: ClusterConfig, rank: int, stack: str, table: str, operators: list[str], confirm: int,
          action: str = "apply") -> str:  # fmt: skip
    """Local command: the node's fence (its rule set on stdin) applied over the system ssh, refused when it would
    cut this machine's ssh, rolled back by the node unless a new ssh connection confirms it (programs/fence.py);
    `remove`: taken off."""
    n = cfg.nodes[rank]
    return " ".join([
        f"python3 -m programs.fence {action}", f"--stack {q(stack)}", f"--node {q(n.name)}",
        f"--target {q(f'{n.ssh_user}@{n.host}')}", f"--port {n.ssh_port}", f"--table {q(table)}",
        *([f"--ssh-port {n.ssh_port}", "--operators", *map(q, operators), f"--confirm {confirm}"]
          if action == "apply" else []),
        *(f"--ssh-opt={q(o)}" for o in ssh_opts(cfg)),
    ])  # fmt: skip


def fabric_gate(cfg: ClusterConfig) -> str | None:
    """Local command: ib_write_bw between every pair of linked nodes over all rails (programs/fabricgate.py);
    None when the gate is off or the group has one node."""
    f = cfg.fabric
    if not f.bandwidth_gate or len(cfg.nodes) < 2:
        return None
    spec = {
        "floor": f.min_bandwidth_gbps,
        "nodes": [{"name": n.name, "target": f"{n.ssh_user}@{n.host}", "port": n.ssh_port,
                   "rails_args": fabric.rails_args(cfg, i)} for i, n in enumerate(cfg.nodes)],  # fmt: skip
        "links": [{"a": cfg.nodes[lk.a].name, "b": cfg.nodes[lk.b].name, "a_ip": lk.a_ip, "b_ip": lk.b_ip}
                  for lk in fabric.links(cfg)],  # fmt: skip
    }
    return " ".join(["python3 -m programs.fabricgate", f"--spec {q(json.dumps(spec, separators=(',', ':')))}",
                     *(f"--ssh-opt={q(o)}" for o in ssh_opts(cfg))])  # fmt: skip


def memgate_args(cfg: ClusterConfig, rank: int, report_only: bool = False, need_mib: int | None = None) -> list[str]:
    """programs/memgate.py's arguments on the rank's node (the program's gate and the guard's): MemAvailable
    against the rank's need (`need_mib`: its node's budget entry, planning/budget.py; default memoryplan.rank_need_mib,
    the same figure)."""
    need = memoryplan.rank_need_mib(cfg, rank) if need_mib is None else need_mib
    args = ["--node", cfg.nodes[rank].name, "--role", "head" if rank == 0 else "worker",
            "--need-mib", str(int(need))]  # fmt: skip
    if report_only:
        args.append("--report-only")
    elif not cfg.memory.drop_caches:
        args.append("--no-drop")
    return args


def memgate(cfg: ClusterConfig, rank: int, report_only: bool = False, need_mib: int | None = None) -> str:
    """`python3 -` of programs/memgate.py (on stdin) on the rank's node: sync and drop the page cache
    (memory.dropCaches), then MemAvailable against the rank's need; `report_only`: figures only."""
    return "python3 - " + " ".join(q(a) for a in memgate_args(cfg, rank, report_only, need_mib))


def image_agree(cfg: ClusterConfig, group: str) -> str:
    """Local command: every node's image IDs (of plan.image_identity_refs), read over ssh now, must agree
    (programs/imagecheck.py); prints the agreed identity, which the group generation follows."""
    spec = {"group": group, "refs": plan.image_identity_refs(cfg),
            "nodes": [{"name": n.name, "target": f"{n.ssh_user}@{n.host}", "port": n.ssh_port} for n in cfg.nodes]}
    return " ".join(["python3 -m programs.imagecheck", f"--spec {q(json.dumps(spec, separators=(',', ':')))}",
                     *(f"--ssh-opt={q(o)}" for o in ssh_opts(cfg))])  # fmt: skip


def argcheck(spec: plan.RankSpec, checks: list[tuple[str, list[str]]], volume: str) -> str:
    """Run the image's own argument parsing for one rank (programs/argcheck.py, on stdin) in a
    throwaway container: no network, no GPU, the rank's env and its checkpoint volume read-only (the
    DSPARK draft weights are looked up there). Exits non-zero, naming node, rank, flag and the
    engine's own message, when the image refuses what the rank would run."""
    env = [f"-e {q(f'{k}={v}')}" for k, v in sorted(spec.env.items())]
    mount = f"--mount {q(f'type=volume,source={volume},target={launch.MODEL_MOUNT},readonly')}"
    return image_check(spec.image, spec.node, str(spec.rank), checks, [*env, mount])


def image_check(image: str, node: str, rank: str, checks: list[tuple[str, list[str]]],
                options: list[str] | None = None) -> str:  # fmt: skip
    """`docker run` of `image` with programs/argcheck.py on stdin, checking each (program, argv)."""
    runs = " ".join(f"--check {q(engine)} {len(argv)} {' '.join(q(a) for a in argv)}" for engine, argv in checks)
    opts = "".join(f"{o} " for o in options or [])
    return (f"docker run --rm -i --network none --entrypoint python3 {opts}{q(image)} "
            f"- --node {q(node)} --rank {q(rank)} {runs}")
