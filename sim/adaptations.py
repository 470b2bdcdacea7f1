"""Every place where the simulated cluster differs from real DGX Sparks, in one list.

The e2e tier prints this list in pytest's summary, so a green e2e run always states what it did
*not* exercise. Keep it short, factual, and in sync with sim/, sim/providers and Pulumi.sim.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Adaptation:
    what: str
    why: str
    where: str


ADAPTATIONS: list[Adaptation] = [
    Adaptation("the Pulumi CLI is real (v3.274.1, built from the Go module proxy), but its docker resource plugin "
               "is the pulumi-resource-docker TEST DOUBLE: Container, Volume, RemoteImage and Image on the nodes' "
               "real docker engines (docker SDK over the system ssh with the provider's sshOpts), with "
               "pulumi-docker's diff and read rules",
               "pulumi-docker's plugin is a Terraform-bridge build of a patched submodule: no Go module builds it",
               "sim/providers/docker.py"),
    Adaptation("the command resource plugin is the pulumi-resource-command TEST DOUBLE (remote.Command over "
               "paramiko with the real provider's auth and host-key rules, local.Command, its diff rules)",
               "the Go module proxy refuses github.com/pulumi/pulumi-command/provider (403, every pseudo-version)",
               "sim/providers/command.py"),
    Adaptation("the command double's ssh connection follows pulumi-command 1.2.1 (connection.go: agent socket "
               "dialled first and fatal, the auth order, every dial failure retried 100 ms x1.5 up to 5 s with "
               "`Dial n/limit failed: retrying`, `after N failed attempts: ...`, perDialTimeout on the TCP connect "
               "only) but over paramiko, not x/crypto/ssh: publickey auth is sent signed without x/crypto's unsigned "
               "query first; the algorithm lists are paramiko's; handshake errors other than EOF, connection reset, "
               "host key mismatch, `unable to authenticate` and the agent's are in paramiko's words; paramiko's "
               "banner and key exchange timers are 300 s where x/crypto has none; a host's addresses are tried in "
               "order under one perDialTimeout (Go splits it); a hostKey pin must be a `<type> <base64>` line; "
               "connection.proxy is refused, not implemented",
               "the real provider is Go and cannot be built here; paramiko is the ssh client at hand",
               "sim/providers/command.py"),
    Adaptation("the command double sends every line of a command's stdout/stderr to the engine as the real "
               "provider does (an ephemeral info message on the resource, unless `logging` says otherwise), but "
               "once the command ended (stdout's lines, then stderr's) instead of as they come",
               "a simpler double: the e2e asserts read the lines, not their timing", "sim/providers/command.py"),
    Adaptation("customTimeouts: the command double kills a *local* command past its step's deadline (a bare "
               "`signal: killed`, as pulumi-command does) and ends a remote command's dial retries with `context deadline "
               "exceeded`, but lets a remote command that started run to its end (the real cancel middleware also "
               "truncates the timeout to whole seconds)",
               "a remote command runs in a paramiko session the double does not tear down mid-command",
               "sim/providers/command.py"),
    Adaptation("the docker double's Read re-reads from `docker inspect` only the container fields this program sets "
               "(name, image, command, entrypoints, restart, networkMode, ipcMode, memory, mounts, capabilities, "
               "ulimits, devices, gpus) and a few computed ones (shmSize, logDriver, privileged); the real Read sets "
               "about 40 (hostname, dns, healthcheck, ports, network data, ...). Detailed diffs name nested paths as "
               "the bridge's MakeDetailedDiffV2 does, but set elements are matched by their JSON, not TF's set "
               "hash, the diff is of inputs, not of TF's planned state, and replacement is decided by the "
               "top-level key, not the schema at each path; a half-created container (start failed) carries the planned "
               "inputs as its partial state, where the bridge's also holds the schema's computed defaults; a step "
               "past its deadline (customTimeouts, else the bridged 20 minutes for containers and images) fails with "
               "`context deadline exceeded` but the docker call is left to finish instead of being cancelled",
               "a smaller double; `python -m sim.grpctrace diff` against a real plugin's trace shows each difference "
               "(README)", "sim/providers/docker.py, sim/providers/docker_schema.py, sim/providers/base.py"),
    Adaptation("the Python language host the CLI starts is the pulumi-language-python TEST DOUBLE (a gRPC "
               "LanguageRuntime in Python, linked next to the CLI by .ci/engine-setup): it runs __main__.py with the "
               "REAL pulumi-language-python-exec of the sdk/v3 v3.274.1 module in the project's virtualenv, and policy "
               "packs through RunPlugin behind v3.274.1's policy proxy, following main.go (v3.260, the newest the "
               "source mirror holds) and the v3.274.1 toolchain. It differs: the pip toolchain only (uv, poetry and "
               "pyenv are refused with a message); no debugpy; GenerateProgram/Project/Package, Pack and Link are "
               "Unimplemented (Go codegen in the real host); no trace spans of its own; it finds the exec script in "
               "the Go module cache, not next to its binary; Cancel interrupts only the programs running then; an "
               "error of its own shows as a Python traceback",
               "the Go module proxy refuses github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3 (403); "
               "its Python half ships in the sdk/v3 module the CLI build downloads", "sim/languagehost"),
    Adaptation("checkpoint shared as a local bind on every node (share.mode: local), not NFS",
               "the test machine's kernel has no NFS client or server", "Pulumi.sim.yaml"),
    Adaptation("rank containers keep memlock=-1 and nofile=1048576 in their inputs, but each node's engine "
               "runs them through the sim-runc runtime wrapper, which lowers every rlimit to the machine's hard "
               "limit (memlock 8 MiB, nofile 20000 here)",
               "rlimits cannot be raised on the test machine (no CAP_SYS_RESOURCE)", "sim/assets/node/sim-runc"),
    Adaptation("engine is the sglang-sim TEST DOUBLE (image sglang-sim:test-double): same flags, rank "
               "rendezvous at --dist-init-addr, /health, /v1/models, /v1/chat/completions; no model: a fixed answer, streamed "
               "at 100 tokens/s (max_tokens of filler with ignore_eos/min_tokens), so bench figures are the double's; "
               "/metrics (sglang: with --enable-metrics; vllm: always) serves a subset of the real engines' families "
               "(sim/testdouble/metric_families.py: names, types, labels and buckets checked against the packages by "
               "tests/conformance/test_real_metrics.py) with the double's own figures: waiting is always 0 (the doubles "
               "never queue), a non-streamed answer comes whole (no inter-token gaps), no `_created` samples",
               "no GPU and no 476 GiB checkpoint", "sim/testdouble"),
    Adaptation("the doubles' parsers are built from the REAL parsers' option tables (sglang 0.5.23, vllm 0.31.0: "
               "declared/options, dumped from the PyPI packages; tests/conformance keeps them equal), with "
               "allow_abbrev on, the real dests, aliases, --no- forms, int/float types and choices; not reproduced: "
               "custom type parsers (a value a real custom parser refuses, e.g. bad JSON for --cuda-graph-config or "
               "`--max-model-len lots`, is accepted as text) and the engines' post-parse resolution (ServerArgs "
               "resolve_once, vLLM's config validation). The image carries TEST DOUBLE modules at the real import "
               "paths argcheck uses (sglang.srt.server_args, vllm.entrypoints.cli.serve, "
               "vllm.utils.argparse_utils); Ray's and the router's parsers in the image are the real ones",
               "no GPU and no engine build for the simulated nodes; the real parsers run in the conformance tier",
               "sim/testdouble/flags.py, sim/testdouble/parsers.py"),
    Adaptation("the conformance tier runs the real parsers in plain venvs, not in the engine images: argcheck's "
               "image checks (DSPARK draft weights, the /opt/dsv41 adapter, Ray importable) run only in the sim's "
               "image in e2e; nothing is stubbed in the venvs (full installs with torch)",
               "the real images cannot be pulled here", "tests/conformance"),
    Adaptation("engine vllm runs REAL Ray (PyPI wheel ray==2.49.2, x86_64, installed in image vllm-sim:test-double) "
               "with the vllm-sim TEST DOUBLE as `vllm serve`: it checks the real cluster's alive nodes and GPUs "
               "(ray.nodes()/cluster_resources()) like vLLM, then serves the same fake API; distributedExecutorBackend mp "
               "forms its group over TCP at --master-addr:--master-port (the SGLang double's rendezvous), headless "
               "nodes serve nothing; no Ray actors and no placement group (each non-driver rank's NCCL init check "
               "runs as one Ray task pinned to its node); GPUs are only Ray's `--num-gpus 1` declaration; object "
               "store capped at 256 MiB by image env",
               "no GPU and no vLLM build for the simulated nodes", "sim/testdouble/vllm_serve.py, sim/images.py"),
    Adaptation("tiny fake checkpoint (4 shards + a small engram table) and memory profile sim-test-double",
               "no real checkpoint", "sim/, planning/memoryplan.py PROFILES"),
    Adaptation("nvidia-smi, ethtool, ibdev2netdev, ib_write_bw and /dev/infiniband are stand-ins on each node "
               "(uverbs0/uverbs1/rdma_cm are char devices with /dev/null's numbers); --gpus all is accepted "
               "through a stand-in nvidia-container-runtime-hook, which refuses with a set fault's text "
               "(`python -m sim gpu-fault NODE`: a CUDA requirement error) the way the real hook fails a start",
               "no GB10 GPU or ConnectX-7 in a container", "sim/assets/node"),
    Adaptation("the fence is the REAL nft (Debian's nftables) in each node's own network namespace, but a node has no "
               "systemd: `systemctl` is a stand-in that enables and disables units under /etc/systemd/system as "
               "systemd does (WantedBy links), and the node's init (sim-entrypoint) runs the ExecStart= of every "
               "enabled unit ordered Before=docker.service before it starts the node's docker engine, where a Spark's "
               "systemd orders them in its boot transaction (After=nftables.service, network-pre.target and "
               "Conflicts= are not modelled)",
               "a container has no systemd as PID 1", "sim/assets/node/systemctl, sim/assets/node/sim-entrypoint"),
    Adaptation("the office network is the cluster's management network, and the host outside every stack is a "
               "short-lived container there (the node image's Debian nmap for the scan, the engine image's Ray and "
               "Python for `ray start` and requests); a node's data-plane rails are internal docker networks that "
               "no such host joins, where an office host could route to a Spark's ConnectX-7 addresses through "
               "its management address (the fence drops that too: only the group's peers' addresses get in). "
               "The engine image's Ray is 2.49.2, which has no token auth (2.52 and later): on the sim only the "
               "fence keeps a host out of the Ray cluster",
               "no office network or second site here", "sim/outsider.py, sim/rootfs.py"),
    Adaptation("the ConnectX-7 twins are veths on two docker bridge networks per cluster (rail A 10.X.1.0/24, "
               "rail B 10.X.2.0/24, MTU 9000, internal) and the 10 GbE NIC a veth on the management network; "
               "the nodes rename them enP7s7/enp1s0f1np1/enP2p1s0f1np1 at boot. Link state and MTU are real "
               "(ip link: pings really fail), but there is no RDMA and no RoCE traffic: the link speed is the "
               "model's (fabric.json speed_mbps, shown by the ethtool stand-in and sysfs rate), what a twin "
               "carries is the model's gbps (ib_write_bw stand-in), and TCP between nodes runs at whatever the "
               "host's bridge gives",
               "no ConnectX-7 or 200G link in a container; docker veths report 10000Mb/s",
               "sim/cluster.py, sim/fabric.py"),
    Adaptation("ib_write_bw is a stand-in ported from perftest 4.5-0.17 (options, value checks, messages and "
               "exit codes as Debian's binary, compared in tests/conformance/test_perftest.py): no RDMA moves; its "
               "BW average is min(client, server rail gbps) from the link model, without noise; rails in different "
               "subnets, or a GID other than the rail's IPv4 RoCE v2 one, fail as an unreachable RC QP does (the "
               "real pair might connect over RoCE v1 or link-local GIDs); the transfer sleeps at most 0.3 s; the "
               "two sides exchange JSON lines instead of perftest's wire format; rdma_cm, UC/XRC/DC, AES-XTS and "
               "counters are parsed and checked, not modelled (the full list: the stand-in's docstring)",
               "no RDMA device on the test machine", "sim/assets/node/ib_write_bw"),
    Adaptation("the rank's memory limit (memory = memorySwap from the memory plan) is a real cgroup limit on the "
               "node, but the doubles allocate almost nothing: the test of a rank killed at its limit lowers the "
               "limit to 256 MiB (docker update) and makes the double allocate without bound (SIGUSR1, a "
               "test-double fault); the kill, OOMKilled and what status says are real",
               "the engine doubles hold no model and the test machine cannot hold ~120 GiB per rank",
               "sim/testdouble/server.py, tests/e2e/test_engine_sim.py"),
    Adaptation("a node's /proc/meminfo is a file rendered from a model (sim-meminfo, bind-mounted over the real one "
               "at boot): 121.7 GiB, 2.4 GiB for the OS; page cache = files under /srv and in docker volumes written "
               "since the last drop, x2**18 (the 1.9 MB fake checkpoint stands for ~460 GiB), capped by what is "
               "free; MemAvailable = free + 90% of the cache; `sysctl -w vm.drop_caches=N` is a stand-in that empties "
               "the modelled cache (root only, as procps; any other key goes to /proc/sys); held memory "
               "(`python -m sim hold-memory`) is a real process named sim-memory-hold touching 128 MiB, counted as "
               "the size asked; the ranks' own use, dirty pages, the kernel's watermarks and CUDA's view of free "
               "memory are not modelled",
               "a sim node is a container on a machine with far less memory than a Spark, sharing its kernel",
               "sim/meminfo.py, sim/assets/node/sysctl"),
    Adaptation("the doubles' compile cache is one file (~/.cache/flashinfer/dspark-sim-autotune.json) written at "
               "the first boot on an empty cache and reported as reused after; nothing is compiled",
               "the engine doubles have no kernels", "sim/testdouble/server.py compile_cache"),
    Adaptation("the RoCE devices exist only in a simulated sysfs (sim-fabric: a tmpfs of bind mounts of the real "
               "entries plus fake files, rbind-mounted over /sys/class, /sys/devices and /sys/bus): only the cabled "
               "port's twins (rocep1s0f1, roceP2p1s0f1; the second QSFP port's rocep1s0f0/roceP2p1s0f0 are absent); "
               "the RDMA->netdev direction exists (<hca>/device/net/<netdev> -> the live veth dir) but "
               "/sys/class/net/<rail>/device does not (veths); unset GID slots have no gid_attrs/types|ndevs file "
               "(the kernel has one that reads EINVAL); a DOWN rail keeps its link-local GIDs and loses the IPv4 "
               "ones; fw_ver, board_id, node_guid (from the MAC) and rate labels are fixed values; classes created "
               "after boot do not appear under the node's /sys/class",
               "sysfs refuses mkdir and the test machine has no RDMA device", "sim/fabric.py, sim/fabric_node.py"),
    Adaptation("a rank container given /dev/infiniband sees the node's /sys/class, /sys/devices and /sys/bus "
               "(read-only rbinds added by the sim-runc runtime to its OCI spec), not a sysfs of its own; a "
               "container without the device keeps its own sysfs (no /sys/class/infiniband)",
               "the simulated RoCE devices live only in the node's mount namespace", "sim/assets/node/sim-runc"),
    Adaptation("ethtool models only `ethtool <netdev>` and `ethtool -i <netdev>` for the rails and enP7s7 (ethtool's "
               "netlink output format, values from the model: supported/advertised modes, FEC, port type and "
               "lanes are fixed); any other interface or option runs the real ethtool (Debian's 6.1) on the veth "
               "(e.g. -S shows veth counters); ibdev2netdev runs the mlnx-tools script's logic without its check for "
               "a Mellanox (0x15b3) netdev",
               "veths have no ConnectX-7 driver behind them", "sim/assets/node/ethtool, sim/assets/node/ibdev2netdev, "
               "sim/fabric.py"),
    Adaptation("NCCL is the nccl.py TEST DOUBLE in both engine doubles: NCCL 2.30.7's init rules (socket "
               "interface selection, NCCL_NET, NCCL_IB_HCA, ACTIVE ports, GID selection, log lines) run on the "
               "node's interfaces and simulated sysfs, then no data moves. Stricter/simpler than NCCL: a used GID "
               "that is not RoCE v2 fails (real kit: v1 works when every peer uses v1 on one L2 segment); peers' "
               "addresses and GIDs are not exchanged (remote GID/peer print N/A), so a GID is checked on the local "
               "device only; channels are a ring over the used NICs (no topology search, no GDR); the Gloo check "
               "only needs an address on GLOO_SOCKET_IFNAME; torch's DistBackendError text omits the C++ source "
               "path and line; NCCL_DEBUG_FILE and external net plugins are not modelled",
               "no GPU, no RDMA and no NCCL build for the simulated nodes",
               "sim/testdouble/nccl.py, nccl_debug.py, nccl_socket.py"),
    Adaptation("the engine image is loaded into each node's engine by the sim; a RemoteImage or a container "
               "whose image is missing tries to pull it (as the real provider does) and fails, and the sim "
               "stack's overlay (sim/overlay) builds FROM it for the machine's platform, not linux/arm64",
               "no registry is reachable; the test machine is not aarch64", "sim/images.py, Pulumi.sim.yaml"),
    Adaptation("nodes run as root", "the simulated nodes are containers with root sshd", "sim/cluster.py"),
    Adaptation("the gateway image deepseek-spark-gateway:litellm-1.110.2 (REAL LiteLLM 1.110.2 and PostgreSQL 15) "
               "is built by the sim and loaded into each node's engine at create, not built on the node from "
               "programs/gateway/Dockerfile: the same Debian packages except python3-pip, on a debootstrap bookworm "
               "minbase (not debian:bookworm-slim), the same pins (programs/gateway/requirements.txt) as x86_64 "
               "wheels installed with the host's pip (not linux/arm64 ones with the image's pip); image env and "
               "CMD as the Dockerfile's",
               "no registry is reachable: debian:bookworm-slim cannot be pulled; the test machine is not aarch64",
               "sim/images.py, sim/nodeimages.py"),
    Adaptation("the monitoring image deepseek-spark-monitoring:bookworm (REAL Prometheus 2.42, Alertmanager 0.25 and "
               "node exporter 1.5, Debian bookworm's packages) is built by the sim on a debootstrap minbase and loaded "
               "into each node's engine at create, labelled with programs/monitoring/Dockerfile's digest as the "
               "program's build on a node labels it: the program's build step finds it current and builds nothing, so "
               "its `docker build` from the Dockerfile on stdin (debian:bookworm-slim, apt) never runs in the sim",
               "no registry is reachable: debian:bookworm-slim cannot be pulled; the test machine is not aarch64",
               "sim/images.py, planning/prometheus.py"),
    Adaptation("the node exporter on a sim node reads the node's /proc/meminfo (the memory model, through the node's "
               "/ mounted at /host) but every other collector reads the test machine's shared kernel (CPU, disks, "
               "network); Alertmanager's webhook is a receiver on the test machine (the e2e's alertWebhook)",
               "a sim node is a container sharing the test machine's kernel", "sim/meminfo.py, tests/e2e/observing.py"),
    Adaptation("the router in front of sim-x2's groups is the REAL sglang-router 0.3.2 (PyPI wheel), started from "
               "the engine test-double image (the groups' image) instead of the SGLang image; the groups it routes "
               "to and drains are test doubles (their /metrics: the subset of the real families above)",
               "no registry is reachable: the SGLang image cannot be pulled", "Pulumi.sim-x2.yaml, sim/images.py"),
    Adaptation("a privileged container (the guard) gets every capability the node itself holds, not all of them: "
               "the sim-runc runtime drops what the node's bounding set lacks (CAP_SYS_RESOURCE) and logs it",
               "the simulation host runs the nodes without CAP_SYS_RESOURCE; runc would refuse the start "
               "(`unable to apply caps: operation not permitted`)", "sim/assets/node/sim-runc"),
    Adaptation("the guard's start gates (nsenter into PID 1's namespaces, then the host's python3) run in the node "
               "container's namespaces: /proc/meminfo is the node's memory model, the cache drop is the sysctl "
               "stand-in's, the rails are the simulated sysfs; PID 1 is the node's tini, not systemd",
               "a sim node is a container sharing the test machine's kernel", "sim/meminfo.py, sim/assets/node"),
    Adaptation("a power cut is the node container SIGKILLed (every process at once, nothing shut down) and started "
               "again: its disk is the container's, so nothing written is lost or torn; /run and the page cache "
               "start empty; docker then finds the containers it ran exited (code 255) and restarts those with a "
               "restart policy; the nodes share the test machine's clock and kernel (no boot ID of their own)",
               "a container cannot lose power", "sim/faults.py"),
    Adaptation("a rank that dies at every boot (crash-at-boot): the node's runtime shim puts the fault's text in the "
               "rank container's process environment (not its docker config), and the engine TEST DOUBLE dies with "
               "it after `Load weight begin.`; the vLLM Ray workers' containers (ray start) do not read it",
               "a fault the simulated nodes can inject without touching what Pulumi created",
               "sim/assets/node/sim-runc, sim/testdouble/server.py, sim/testdouble/vllm_serve.py"),
    Adaptation("when the head hangs (SIGSTOP), the engine TEST DOUBLE's workers lose its heartbeat and exit within "
               "10 s, where real NCCL ranks would block in a collective until their watchdog (1800 s): the sim "
               "stacks' selfHeal.hangSeconds (5) makes the guard see the hang first",
               "the double's rank group is a TCP heartbeat, not NCCL", "sim/testdouble/server.py, Pulumi.sim.yaml"),
]


def describe() -> str:
    lines = ["simulated cluster adaptations (what the e2e run does not exercise):"]
    lines += [f"  - {a.what} [{a.where}]: {a.why}" for a in ADAPTATIONS]
    return "\n".join(lines)
