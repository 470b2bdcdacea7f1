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
    Adaptation("the Pulumi CLI (v3.274.1) and its docker resource plugin are real, both built from the Go module "
               "proxy: the plugin is pulumi-terraform-bridge v3.120.0 (pulumi-docker 5.2.0 is built on a later "
               "bridge) over the one commit of kreuzwerker/terraform-provider-docker the proxy serves (not "
               "necessarily the one 5.2.0 pinned), with Pulumi's terraform-plugin-sdk fork plus a one-method stub, "
               "and a mapping of our own onto the 5.2.0 SDK's names (tests/conformance/test_docker_provider_schema.py "
               "holds every token, property and required-ness to the SDK); it has no docker.Image (pulumi-docker's own "
               "buildkit resource: its Go code is not served), so `imageBuild` runs `docker build` on each node",
               "pulumi-docker's own Go module is not on the proxy; its parts are",
               ".ci/docker-provider, .ci/docker-provider-setup"),
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
               "rendezvous at --dist-init-addr, the real engines' routes and key rules (next entry); no model: a "
               "fixed answer, streamed "
               "at 100 tokens/s (max_tokens of filler with ignore_eos/min_tokens), so bench figures are the double's; "
               "/metrics (sglang: with --enable-metrics; vllm: always) serves a subset of the real engines' families "
               "(sim/testdouble/metric_families.py: names, types, labels and buckets checked against the packages by "
               "tests/conformance/test_real_metrics.py) with the double's own figures: waiting is always 0 (the doubles "
               "never queue), a non-streamed answer comes whole (no inter-token gaps), no `_created` samples",
               "no GPU and no 476 GiB checkpoint", "sim/testdouble"),
    Adaptation("the engine doubles' HTTP routes and API-key rules are the real ones' where the project or a caller "
               "reaches them (tests/conformance/test_double_routes.py holds them against the packages' own apps: vllm "
               "0.31.0/0.33.0 build_app, sglang 0.5.23's app, decide_request_auth and dummy health server): vLLM needs "
               "the key (every --api-key, else $VLLM_API_KEY; `Bearer` in any case) only under /v1, /v2, /inference "
               "and /cohere, 401 before routing, so /invocations (a chat completion or a completion, by the body), "
               "/tokenize, /detokenize, /generative_scoring, /scale_elastic_ep, /is_scaling_elastic_ep, /version, "
               "/load, /kv_event_sources, /ping, /health, /metrics and the docs are open, and with "
               "VLLM_SERVER_DEV_MODE=1 so are /pause, /resume, /is_paused, /abort_requests, /sleep, /wake_up, "
               "/is_sleeping, /reset_prefix_cache, /reset_mm_cache, /reset_encoder_cache and /server_info (standing in "
               "for 0.33.0, DSPARK_SIM_VLLM_VERSION, the scale-out routes answer its 403 while off and "
               "/is_scaling_elastic_ep its extra status fields); SGLang "
               "guards all but /health*, /ready*, /metrics* (OPTIONS passes), its admin routes (/flush_cache, "
               "/update_weights_from_disk) take --admin-api-key when set, /health and /health_generate generate one "
               "token, /get_server_info reports the keys among its args as the real one does, and worker ranks serve "
               "the unguarded dummy health server (/ping, /health, /health_generate, /metrics, the docs). Still "
               "different: the doubles serve only those routes (a key holder finds 404 on the rest: vLLM's "
               "/v1/responses, /v1/messages, LoRA, profiler, pooling and its other dev routes such as /collective_rpc "
               "and /update_weights, the scale-out routes with --enable-scale-out; SGLang's ~60 others, e.g. "
               "/start_profile, /release_memory_occupation, /load_lora_adapter, /encode, /v1/embeddings, /api/*); no Content-Type check or request schema "
               "validation beyond the fields a double reads; no CORS middleware (a preflight gets 405/404); vLLM's "
               "--root-path is not stripped before the prefix check; JSON is written with Python's ', '/': ' "
               "separators where the engines write compact JSON (same values); answers come from the doubles' models: "
               "a byte-level tokenizer (256 ids), uniform generative scores, /pause and /sleep hold new requests until "
               "/resume and /wake_up but abort or freeze nothing in flight, /server_info and /get_server_info list the "
               "double's parsed flags (not VllmConfig / ServerArgs.resolved_dict()), /update_weights_from_disk "
               "accepts any existing directory, /kv_event_sources is always {}, /scale_elastic_ep only knows data "
               "parallel size 1 (or --data-parallel-size) and never scales (so vLLM's 503 while scaling never "
               "happens), a health generation is one token's sleep (no 20 s timeout); an SGLang rank 0 answers 503 "
               "on every other route until its group is ready and a worker's dummy server listens from the start, "
               "where the real ones listen only once their engine is up",
               "no GPU and no engine build for the simulated nodes; the routes a caller can reach are what the "
               "double must not hide", "sim/testdouble/openai_api.py, sim/testdouble/vllm_serve.py, "
               "sim/testdouble/server.py"),
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
    Adaptation("nodes run as root, so no step takes the sudo path: preflight's sudo checks (the memory gate's drop "
               "rule, the head's NFS/key-file sudo) are left out of the script, and the memory gate, the fence and "
               "the key files never run `sudo -n`; their refusals are tested against stub tools only "
               "(tests/unit/test_commands.py)", "the simulated nodes are containers with root sshd", "sim/cluster.py"),
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
    Adaptation("the front door image deepseek-spark-frontdoor:nginx-1.22 (REAL nginx 1.22.1, Debian bookworm's "
               "package) is built by the sim on a debootstrap minbase and loaded into each node's engine at create, "
               "labelled with programs/frontdoor/Dockerfile's digest, so the program's build step builds nothing; its "
               "STOPSIGNAL (SIGQUIT) is not in the sim's image (docker commit takes no STOPSIGNAL): the program sets "
               "the container's stop signal itself",
               "no registry is reachable: debian:bookworm-slim cannot be pulled; the test machine is not aarch64",
               "sim/images.py, planning/frontdoor.py"),
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
