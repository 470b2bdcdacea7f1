"""Who may reach what: one exposure plan per node, the stack's trust boundary (docs/exposure.md).

Every listener a stack starts on a node is listed here with its plane, the address it binds, who may reach it
and how it authenticates; the binds of the engines, the router, the gateway, the monitoring and the guard are
read from the functions below, and the node's fence (nftables: one table of the stack's own, `ruleset`) is
rendered from the list, so that what listens, where, and who gets through cannot drift apart.

Three planes per node (DESIGN.md, "Trust boundary"):
- loopback: what only the node itself uses;
- data: the group's own traffic (NCCL, the rendezvous, Ray, NFS, checkpoint copies) between its nodes, over the
  ConnectX-7 links (or the management network with `fabric.bootstrap: management`). None of it authenticates,
  so only the group's other nodes reach it;
- management (`host`): ssh from the operators, the endpoint from the clients, and the inner HTTP ports from the
  parts of the stack that use them (its router, gateway, guards, Prometheus).

A source is a named set of addresses (SOURCES): the fence lets a listener's port through from its sources only,
and everything else that arrives at the node is dropped, but loopback, replies to what the node itself opened,
and ICMP. An operator reaches an inner HTTP port through ssh (a tunnel), like `dspark` and the readiness probe.
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass, field
from typing import Optional

from . import fabric
from declared.cluster import ClusterConfig
from declared.stack import ANYWHERE, LOCAL, StackConfig

LOOPBACK = "127.0.0.1"
EVERY = "0.0.0.0"  # the software binds every interface and offers no narrower bind: the fence holds it
RSYNC_SEED_PORT = 8730  # planning.commands.SEED_PORT (the head's checkpoint seed for its workers' copies)
GATE_PORT = 18515  # programs/fabricgate.py: ib_write_bw's server, one port per rail from here
NFS_PORT = 2049  # NFSv4: the head's kernel nfsd (share.mode nfs)
RAY_RANGE = 100  # serving.rayPorts: how many ports from it Ray's processes take on every node
# The ConnectX-7's netdevs on every DGX Spark: both ports, both PCI-domain twins (enp1s0f1np1, enP2p1s0f1np1, ...).
# Each twin has an address of its own that only the node finds (at rank start), so the fence lets in what arrives
# on these, the data plane (direct cables or the group's own switch), rather than a list of the twins' addresses.
DATA_PLANE_IFNAMES = ("enp1s0f*", "enP2p1s0f*")

# who may reach a listener: the names the plan uses, and what each holds
SOURCES = {
    "node": "this node only (loopback, or its own address)",
    "peers": "the group's other nodes, on the planes the group uses",
    "stack": "the stack's nodes (its router, gateway, guards and Prometheus)",
    "monitoring": "the stack's Prometheus (monitoring.server) and firewall.scrapers",
    "operators": "firewall.operators",
    "clients": "firewall.clients",
}


@dataclass(frozen=True)
class Listener:
    what: str  # what listens, e.g. "engine API (SGLang rank 0)"
    owner: str  # the container (or process) that opens it
    ports: Optional[tuple[int, int]]  # first, last (inclusive); None: ephemeral ports (the peers' rule covers them)
    plane: str  # loopback | data | management
    bind: str  # the address it binds
    sources: tuple[str, ...]  # names of SOURCES; ("node",) is reachable from the node alone
    auth: str  # how it authenticates what reaches it
    transient: bool = False  # only while `up` runs a step (the bandwidth gate, the checkpoint seed)

    @property
    def port(self) -> str:
        if self.ports is None:
            return "ephemeral"
        first, last = self.ports
        return str(first) if first == last else f"{first}-{last}"


@dataclass(frozen=True)
class NodeExposure:
    """One node's listeners, its sources' addresses, the owner's own open ports, and its fence."""

    stack: str
    node: str
    host: str
    listeners: tuple[Listener, ...]
    sets: tuple[tuple[str, tuple[str, ...]], ...]  # source name -> addresses (IPv4, CIDR)
    opened: tuple[tuple[int, tuple[str, ...], str], ...] = ()  # firewall.open: (port, sources, why)
    enabled: bool = True  # firewall.enabled
    data_plane: tuple[str, ...] = ()  # interface names (nft wildcards) whose traffic is the group's peers'
    ruleset: str = field(default="", compare=False)  # the fence (render), set by build
    apply: str = ""  # where Pulumi runs: the fence onto the node, never locking the operator out (commands.fence)
    remove: str = ""  # ... and off it (destroy)

    @property
    def table(self) -> str:
        return table_name(self.stack)

    @property
    def digest(self) -> str:
        """What the fence on the node must hold (doctor compares it; a changed rule set is a new digest)."""
        return hashlib.sha256(self.ruleset.encode()).hexdigest()[:16]

    def addresses(self, source: str) -> tuple[str, ...]:
        return dict(self.sets).get(source, ())

    def reachable_from(self, address: str) -> list[Listener]:
        """The listeners a host at `address` (not one of the stack's nodes) reaches: what doctor prints."""
        import ipaddress

        ip = ipaddress.ip_address(address)
        inside = {name for name, nets in self.sets if any(ip in ipaddress.ip_network(n) for n in nets)}
        if not self.enabled:
            return [lst for lst in self.listeners if lst.plane != "loopback"]
        return [lst for lst in self.listeners if inside & set(lst.sources)]


def table_name(stack: str) -> str:
    """The stack's own nftables table (inet family): never the owner's, docker's or ufw's."""
    return "dspark_" + "".join(c if c.isalnum() else "_" for c in stack)


# ------------------------------------------------------------------------------------------------ binds ----
# The addresses the program's listeners bind: each the narrowest its software allows for who uses it.

def engine_bind(cfg: ClusterConfig, rank: int) -> str:
    """The engine's HTTP port (rank 0's API, a worker rank's health server): the node's management address, where
    its clients or its front (router, gateway, Prometheus, the guard) reach it."""
    return cfg.nodes[rank].host


def node_bind(cfg: ClusterConfig, rank: int) -> str:
    """A node's guard and node exporter: its management address (the leader's guard and Prometheus reach it)."""
    return cfg.nodes[rank].host


def ray_ports(cfg: ClusterConfig) -> dict[str, int]:
    """Ray's processes on every node pinned to serving.rayPorts (first) .. first + RAY_RANGE - 1."""
    first = cfg.serving.ray_ports
    return {"node-manager": first, "object-manager": first + 1, "runtime-env-agent": first + 2,
            "metrics-export": first + 3, "min-worker": first + 10, "max-worker": first + RAY_RANGE - 1}  # fmt: skip


# ------------------------------------------------------------------------------------------- listeners ----

def _engine_api_auth(cfg: ClusterConfig) -> str:
    if cfg.engine == "vllm":
        return ("API key on /v1, /v2, /inference and /cohere only (vLLM's middleware): /invocations, /tokenize, "
                "/metrics, /health and others answer without it")  # fmt: skip
    return "API key on every route but /health*, /ready* and /metrics* (SGLang's middleware)"


def _group_listeners(sc: StackConfig, cfg: ClusterConfig, plan_name: str, rank: int, fronted: bool,
                     local_router: bool) -> list[Listener]:  # fmt: skip
    """The group's listeners on its rank-`rank` node."""
    s, node = cfg.serving, cfg.nodes[rank]
    data = "management" if cfg.fabric.bootstrap == "management" else "data"
    rank_c = f"{plan_name}-rank{rank}"
    out = []
    api_sources = ("stack", "monitoring", *(("operators",) if local_router else ())) if fronted else \
        ("clients", "stack", "monitoring")
    if rank == 0:
        out.append(Listener(f"engine API ({cfg.engine} rank 0){'' if fronted else ': the endpoint'}", rank_c,
                            (s.port, s.port), "management", engine_bind(cfg, 0), api_sources, _engine_api_auth(cfg)))
    elif cfg.engine == "sglang":
        out.append(Listener("SGLang worker rank's health server (/health, /health_generate, /metrics)", rank_c,
                            (s.port, s.port), "management", engine_bind(cfg, rank), ("node",), "none"))
    rendezvous = cfg.engine == "sglang" or s.distributed_executor_backend == "mp"
    if rank == 0 and rendezvous:
        out.append(Listener("rendezvous (torch TCPStore)", rank_c, (s.dist_port, s.dist_port), data, EVERY,
                            ("peers",), "none (PyTorch: c10d has no authorization)"))
    if len(cfg.nodes) > 1:
        out.append(Listener("NCCL and Gloo bootstrap sockets", rank_c, None, data, fabric.bootstrap_ip(cfg, rank),
                            ("peers",), "none"))
    if cfg.engine == "vllm" and s.distributed_executor_backend == "ray":
        if rank == 0:
            out.append(Listener("Ray GCS", rank_c, (s.ray_port, s.ray_port), data, EVERY, ("peers",),
                                "none (the image's Ray has no token auth before 2.52)"))
        rp = ray_ports(cfg)
        out.append(Listener("Ray raylet, object manager, agents and workers", rank_c,
                            (rp["node-manager"], rp["max-worker"]), data, EVERY, ("peers",), "none"))
        out.append(Listener("vLLM's TCPStore and message queue (on Ray)", rank_c, None, data,
                            fabric.bootstrap_ip(cfg, rank), ("peers",), "none"))
    if s.self_heal.enabled:
        out.append(Listener("guard (/metrics, /status; signed /v1/act)", f"{plan_name}-guard",
                            (s.self_heal.port, s.self_heal.port), "management", node_bind(cfg, rank),
                            ("stack", "monitoring"), "HMAC-signed actions; /metrics and /status to its sources only"))
    if len(cfg.nodes) > 1 and cfg.fabric.bandwidth_gate:
        gates = max(len(fabric.addresses(n)) for n in cfg.nodes) * 2
        out.append(Listener("bandwidth gate (ib_write_bw servers)", "ib_write_bw", (GATE_PORT, GATE_PORT + gates - 1),
                            "data", EVERY, ("peers",), "none", transient=True))
    if rank == 0 and cfg.share.mode == "nfs" and len(cfg.nodes) > 1:
        out.append(Listener("NFSv4 (the checkpoint, read-only to the workers' link addresses)", "nfsd (the node's)",
                            (NFS_PORT, NFS_PORT), "data", EVERY, ("peers",), "export list (AUTH_SYS)"))
    if rank == 0 and cfg.model.source is not None and cfg.share.mode == "local" and len(cfg.nodes) > 1:
        out.append(Listener("checkpoint seed (rsync daemon)", "rsync", (RSYNC_SEED_PORT, RSYNC_SEED_PORT), "data",
                            EVERY, ("peers",), "hosts allow: the workers' link addresses (each its own head link)",
                            transient=True))
    return out


def _stack_listeners(sc: StackConfig, stack: str, node_name: str) -> list[Listener]:
    """The router's, the gateway's and the monitoring's listeners on `node_name`."""
    out = []
    mc = sc.monitoring
    if mc.node_exporter.enabled:
        port = mc.node_exporter.port
        host = next(n.host for e in sc.groups for n in e.cfg.nodes if n.name == node_name)
        out.append(Listener("node exporter", f"{stack}-node-exporter", (port, port), "management", host,
                            ("monitoring",), "none (node figures only)"))
    door = sc.front_door
    if door.enabled and door_node(sc) == node_name:
        out.append(Listener("front door (nginx, TLS): the endpoint", f"{stack}-frontdoor", (door.port, door.port),
                            "management", _host(sc, node_name), ("clients",), "TLS 1.2+ with the stack's certificate; "
                            "the OpenAI routes and /health only, the key checked behind it"))  # fmt: skip
    r = sc.router
    if r is not None and r.node == node_name:
        host = _host(sc, node_name)
        front = sc.gateway is None and not door.enabled
        out.append(Listener(f"router API{': the endpoint' if front else ''}", f"{stack}-router", (r.port, r.port),
                            "management", host, ("clients", "stack") if front else ("stack", "operators"),
                            "API key on its POST routes and /workers (sglang-router); GETs of model info answer "
                            "anyone it lets in"))  # fmt: skip
        out.append(Listener("router metrics", f"{stack}-router", (r.metrics_port, r.metrics_port), "management", host,
                            ("monitoring",), "none"))
    gw = sc.gateway
    if gw is not None and _gateway_node(sc) == node_name:
        host = _host(sc, node_name)
        out.append(Listener(f"team gateway (LiteLLM){'' if door.enabled else ': the endpoint'}", f"{stack}-gateway",
                            (gw.port, gw.port), "management", host,
                            ("stack", "monitoring") if door.enabled else ("clients", "monitoring"),
                            "a key per member (its /metrics: the metrics key)"))  # fmt: skip
        out.append(Listener("gateway database (PostgreSQL)", f"{stack}-gateway-db",
                            (gw.database_port, gw.database_port), "loopback", LOOPBACK, ("node",), "password"))
    s = mc.server
    if s is not None and _monitoring_node(sc) == node_name:
        out.append(Listener("Prometheus", f"{stack}-prometheus", (s.prometheus_port, s.prometheus_port), "loopback",
                            LOOPBACK, ("node",), "loopback only: operators through ssh"))
        out.append(Listener("Alertmanager", f"{stack}-alertmanager", (s.alertmanager_port, s.alertmanager_port),
                            "loopback", LOOPBACK, ("node",), "loopback only: Prometheus beside it, operators through "
                            "ssh"))  # fmt: skip
    return out


def _host(sc: StackConfig, node_name: str) -> str:
    return next(n.host for e in sc.groups for n in e.cfg.nodes if n.name == node_name)


def _gateway_node(sc: StackConfig) -> str:
    gw = sc.gateway
    return gw.node or (sc.router.node if sc.router and sc.router.node != LOCAL else sc.groups[0].cfg.nodes[0].name)


def door_node(sc: StackConfig) -> str:
    """Where the front door runs: on the endpoint's node (the gateway's, else the router's, else the head)."""
    if sc.gateway is not None:
        return _gateway_node(sc)
    if sc.router is not None and sc.router.node != LOCAL:
        return sc.router.node
    return sc.groups[0].cfg.nodes[0].name


def _monitoring_node(sc: StackConfig) -> str:
    s, router = sc.monitoring.server, sc.router.node if sc.router else None
    return s.node or (router if router and router != LOCAL else sc.groups[0].cfg.nodes[0].name)


def _peers(cfg: ClusterConfig, rank: int) -> tuple[str, ...]:
    """The addresses the group's other nodes use on its inner planes: their data-plane addresses, and their hosts
    where the group's bootstrap or checkpoint share runs on the management network."""
    management = cfg.fabric.bootstrap == "management" or any(
        fabric.nfs_link(cfg, r)[2] == "management" for r in range(1, len(cfg.nodes))) or _pinned_off_fabric(cfg)
    out = []
    for i, n in enumerate(cfg.nodes):
        if i != rank:
            out += [*fabric.addresses(n), *([n.host] if management else [])]
    return tuple(sorted(set(out)))


def _pinned_off_fabric(cfg: ClusterConfig) -> bool:
    """A pinned fabric.socketIfname outside the ConnectX-7 (e.g. the management NIC): the ranks' sockets then run
    between the nodes' hosts."""
    pinned = [name.strip() for name in (cfg.fabric.socket_ifname or "").split(",") if name.strip()]
    return any(not any(fnmatch.fnmatchcase(name, pat) for pat in DATA_PLANE_IFNAMES) for name in pinned)


def _data_plane(cfg: ClusterConfig) -> tuple[str, ...]:
    """The interfaces let in whole: the ConnectX-7's twins only. A pinned fabric.socketIfname is not one of them: it
    may name the management NIC (bootstrap over it), and letting that in whole would open every port to the office
    LAN; peers reach such a plane through @peers (their configured addresses) like any other."""
    return DATA_PLANE_IFNAMES if len(cfg.nodes) > 1 else ()


def build(sc: StackConfig, stack: str) -> tuple[NodeExposure, ...]:
    """Every node's exposure, group by group, in rank order."""
    fw = sc.firewall
    hosts = tuple(sorted({n.host for e in sc.groups for n in e.cfg.nodes}))
    monitoring = ((_host(sc, _monitoring_node(sc)),) if sc.monitoring.server else ()) + tuple(fw.scrapers)
    fronted = sc.router is not None or sc.gateway is not None or sc.front_door.enabled
    local_router = sc.router is not None and sc.router.node == LOCAL
    out = []
    for e in sc.groups:
        cfg, plan_name = e.cfg, e.plan_name(stack)
        for rank, n in enumerate(cfg.nodes):
            listeners = [Listener("ssh", "sshd (the node's)", (n.ssh_port, n.ssh_port), "management", "the owner's "
                                  "sshd_config", ("operators",), "ssh keys")]  # fmt: skip
            listeners += _group_listeners(sc, cfg, plan_name, rank, fronted, local_router)
            listeners += _stack_listeners(sc, stack, n.name)
            sets = (("operators", tuple(fw.operators)), ("clients", tuple(fw.clients)), ("peers", _peers(cfg, rank)),
                    ("stack", hosts), ("monitoring", tuple(sorted(set(monitoring)))))  # fmt: skip
            ne = NodeExposure(stack, n.name, n.host, tuple(listeners), sets,
                              tuple((o.port, tuple(o.sources), o.why) for o in fw.open), fw.enabled,
                              _data_plane(cfg))
            out.append(_with_ruleset(ne))
    return tuple(out)


def _with_ruleset(ne: NodeExposure) -> NodeExposure:
    from dataclasses import replace

    return replace(ne, ruleset=render(ne))


# ----------------------------------------------------------------------------------------------- fence ----

def _elements(addresses: tuple[str, ...]) -> str:
    return ", ".join(addresses)


def _ports(listeners: list[Listener]) -> str:
    ports = sorted({lst.ports for lst in listeners if lst.ports})
    one = [str(a) if a == b else f"{a}-{b}" for a, b in ports]
    return one[0] if len(one) == 1 else "{ " + ", ".join(one) + " }"


def render(ne: NodeExposure) -> str:
    """The node's fence, for `nft -f`: our table removed and defined again in one transaction (the create makes
    the delete valid when it is absent), its input chain dropping whatever no rule lets in. Nothing outside the
    table is touched: the owner's tables, docker's and ufw's stay as they are (their drops still apply; an accept
    here never overrides them)."""
    t = ne.table
    lines = [f"# deepseek-spark: the fence of stack {ne.stack} on {ne.node} (planning/exposure.py; docs/exposure.md)",
             f"table inet {t} {{}}", f"delete table inet {t}", f"table inet {t} {{"]
    for name, addresses in ne.sets:
        if addresses:
            lines.append(f"  set {name} {{ type ipv4_addr; flags interval; elements = {{ {_elements(addresses)} }} }}")
    lines += ["  chain input {", "    type filter hook input priority filter; policy drop;",
              '    iifname "lo" accept', "    ct state established,related accept", "    ct state invalid drop",
              "    meta l4proto { icmp, ipv6-icmp } accept"]  # fmt: skip
    by_source: dict[str, list[Listener]] = {}
    for lst in ne.listeners:
        if lst.plane == "loopback":
            continue
        for source in lst.sources:
            if source != "node" and ne.addresses(source):
                by_source.setdefault(source, []).append(lst)
    for source in SOURCES:
        listeners = by_source.get(source, [])
        if source == "peers" and listeners:  # the group's inner planes: every port (NCCL's and Ray's ephemeral ones)
            lines.append(f"    ip saddr @peers accept comment \"{_comment(listeners)}\"")
            lines += [f"    iifname \"{name}\" accept comment \"the data plane (every rail and its twin)\""
                      for name in ne.data_plane]
            continue
        if not listeners or not any(lst.ports for lst in listeners):
            continue
        lines.append(f"    tcp dport {_ports(listeners)} ip saddr @{source} accept comment \"{_comment(listeners)}\"")
        if ANYWHERE in ne.addresses(source):  # anywhere: IPv6 too
            lines.append(f"    meta nfproto ipv6 tcp dport {_ports(listeners)} accept")
    for port, sources, why in ne.opened:
        lines.append(f"    tcp dport {port} ip saddr {{ {_elements(sources)} }} accept comment \"{_quote(why)}\"")
    lines += ["  }", "}", ""]
    return "\n".join(lines)


def _comment(listeners: list[Listener]) -> str:
    return _quote(", ".join(dict.fromkeys(lst.what.split(" (")[0].split(":")[0] for lst in listeners)))[:120]


def _quote(text: str) -> str:
    return text.replace('"', "'").replace("\\", "/")


# ------------------------------------------------------------------------------------------- reading it ----

ROW = ("port", "listener", "plane", "binds", "reachable from", "authenticates")


def rows(ne: NodeExposure) -> list[tuple[str, ...]]:
    """The node's listeners as table rows (ROW), the owner's open ports last."""
    out = [(lst.port, lst.what + (" (while `up` runs it)" if lst.transient else ""), lst.plane, lst.bind,
            ", ".join(lst.sources), lst.auth) for lst in ne.listeners]  # fmt: skip
    out += [(str(port), f"firewall.open: {why}", "management", "(the owner's)", ", ".join(sources), "(the owner's)")
            for port, sources, why in ne.opened]  # fmt: skip
    return out


def summary(nodes: tuple[NodeExposure, ...]) -> str:
    """One line per node for the preview: what it lets in, from whom (the full table: `dspark plan`)."""
    if not nodes:
        return "exposure: no nodes"
    if not nodes[0].enabled:
        return ("exposure: firewall.enabled is false: no fence, every listener answers whoever reaches it "
                "(docs/exposure.md)")  # fmt: skip
    lines = [f"exposure (docs/exposure.md): the fence of table inet {nodes[0].table} on every node lets in"]
    for ne in nodes:
        open_to: dict[str, list[str]] = {}
        for lst in ne.listeners:
            if lst.plane != "loopback" and lst.ports:
                for source in lst.sources:
                    if source not in ("node", "peers") and ne.addresses(source):
                        open_to.setdefault(source, []).append(lst.port)
        parts = [f"{source} -> {', '.join(dict.fromkeys(ports))}" for source, ports in open_to.items()]
        parts.append("the group's peers and the data plane -> every port" if ne.addresses("peers") else "")
        lines.append(f"  {ne.node} ({ne.host}): " + "; ".join(p for p in parts if p) + f"; fence {ne.digest}")
    return "\n".join(lines)


def to_output(nodes: tuple[NodeExposure, ...]) -> dict:
    """The `exposure` stack output: per node, the fence's table and digest, and who may reach which port."""
    return {ne.node: {"host": ne.host, "fence": {"table": ne.table, "digest": ne.digest} if ne.enabled else None,
                      "listeners": [dict(zip(("port", "listener", "plane", "binds", "from", "auth"), r))
                                    for r in rows(ne)]}
            for ne in nodes}  # fmt: skip
