"""The front door's plan (pure): nginx (Debian's package) on the endpoint's node, the stack's one HTTPS port, in
front of whatever answers there today: the gateway, the router, or the one group's head (docs/front-door.md).

- TLS 1.2 and 1.3 only, with the certificate the config names (frontDoor.certificate): the stack's own CA's (made
  where Pulumi runs, planning/tls.py) or the owner's. No plain HTTP listener: a plain request to the port gets
  nginx's 400 and goes nowhere.
- An allowlist of routes (method and path): the OpenAI routes the stack serves and /health; anything else is 404
  (another method 403) at the door, so the engines' unguarded routes (vLLM's /invocations, /tokenize, /pause;
  SGLang's /flush_cache, /server_info, /update_weights_from_disk) and the gateway's admin API never reach a client.
- Streaming without buffering (proxy_buffering off); the bearer key passes through to what checks it (the door
  holds no key).
- A new certificate or config is written on the node and a SIGHUP has nginx read it: new workers take new
  connections, the old ones finish what they serve (a streamed answer too), no restart, no rank touched.

Why nginx and not Caddy (the issue's first choice): Debian's Caddy (2.6.2, bookworm) aborts every stream in flight
when it reloads ("aborting with incomplete response", measured: docs/front-door.md), so each renewal would cut
members' answers; nginx's reload drains them.

On the node, under `<stateDir>/<stack>-frontdoor/`: `etc/nginx.conf`, and `tls/tls.pem` (0600: the chain, then the
key), both mounted read-only at /etc/dspark-frontdoor.
"""

from __future__ import annotations

import datetime as dt
import shlex
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

from declared.stack import FRONTDOOR_IMAGE, FrontDoorConfig
from pathlib import Path

from . import imagebuild, prometheus
from .commands import secret_file_create, secret_file_delete
from .gateway import ContainerPlan, files_digest, files_write
from .nodeplan import NodePlan
from .tls import Schedule

q = shlex.quote

DOCKERFILE = Path(__file__).resolve().parents[1] / "programs" / "frontdoor" / "Dockerfile"
BUILT_FROM = prometheus.BUILT_FROM  # the image's label: the digest of the Dockerfile it was built from
imagebuild_digest = prometheus.dockerfile_digest  # the same digest as the monitoring image's

ETC = "/etc/dspark-frontdoor"  # in its container: etc/ and tls/ of its directory on the node
MAX_BODY = "64m"  # a request body (a long prompt is a few MiB of JSON; nginx's default, 1m, refuses them)
CA_ENV = "DSPARK_CA_PEM"  # the readiness probe's CA (PEM) comes through its environment
# What clients may call: the OpenAI routes the stack serves (every engine, router and gateway serves these four) and
# /health. Method and path both: a GET of /v1/chat/completions is no route of the API either.
ROUTES = (("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"),
          ("GET", "/v1/models/*"))  # fmt: skip
HEALTH = "/health"


@dataclass(frozen=True)
class FrontDoorPlan:
    stack: str
    node: NodePlan  # where it runs (its docker provider and ssh connection)
    image: str
    dockerfile: str  # programs/frontdoor/Dockerfile: the default image is built on the node from it
    build: Optional[str]  # the node's script (the Dockerfile on stdin); None: another image, pulled
    digest: str  # of the Dockerfile: a new one is a new image
    url: str  # https://name:port: what clients reach (no /v1)
    upstream: str  # http://host:port of what it fronts
    names: tuple[str, ...]  # on its certificate: the first is what clients are given
    directory: str
    files: dict[str, str]  # etc/: nginx.conf
    files_write: str  # writes etc/ and reloads a running door
    files_delete: str
    tls_path: str  # on the node: the chain and the key (0600)
    tls_write: str  # stdin: the PEM; reloads a running door
    tls_delete: str
    container: ContainerPlan
    source: str  # stack-ca | own
    schedule: Schedule
    period: int  # stack-ca: the server certificate's period (its trigger)
    own_certificate: Optional[str]  # source own: the chain (PEM)
    own_ca: Optional[str]
    readiness: str  # the probe through the door (the key and the CA in its environment)
    readiness_timeout_minutes: int

    @property
    def endpoint(self) -> str:
        return self.url + "/v1"

    @property
    def files_digest(self) -> str:
        return files_digest(self.files)

    def renewal(self) -> dict:
        """stack-ca: when the certificate of today's period expires and the first day an `up` renews it."""
        return {"expires": self.schedule.not_after(self.period).strftime("%Y-%m-%d"),
                "renewed_from": self.schedule.renew_on(self.period).isoformat()}  # fmt: skip


def nginx_conf(host: str, port: int, upstream: str, health_path: str, request_timeout_seconds: int) -> str:
    """The door's whole config (nginx 1.22)."""
    up = urlsplit(upstream)
    routes = "\n".join(f"        location {'^~ ' + p[:-1] if p.endswith('*') else '= ' + p} {{ limit_except {m} {{ "
                       f"deny all; }} proxy_pass http://endpoint; }}" for m, p in ROUTES)  # fmt: skip
    return f"""# written by deepseek-spark (planning/frontdoor.py); changes are overwritten
daemon off;
worker_processes 2;
pid /run/dspark-frontdoor.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    server_tokens off;
    client_body_temp_path /tmp/door-body; proxy_temp_path /tmp/door-proxy; fastcgi_temp_path /tmp/door-fastcgi;
    uwsgi_temp_path /tmp/door-uwsgi; scgi_temp_path /tmp/door-scgi;
    upstream endpoint {{ server {up.hostname}:{up.port or 80}; keepalive 32; }}
    server {{
        listen {host}:{port} ssl http2;
        ssl_certificate {ETC}/tls/tls.pem;
        ssl_certificate_key {ETC}/tls/tls.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:door:4m;
        client_max_body_size {MAX_BODY};
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header X-Forwarded-For $remote_addr;
        proxy_set_header X-Forwarded-Proto https;
        proxy_buffering off;
        proxy_request_buffering off;
        proxy_read_timeout {request_timeout_seconds}s;
        proxy_send_timeout {request_timeout_seconds}s;
{routes}
        location = {HEALTH} {{ limit_except GET {{ deny all; }} proxy_pass http://endpoint{health_path}; }}
        location / {{ return 404; }}
    }}
}}
"""


def reload(container: str) -> str:
    """Shell: have a running door read its files again (SIGHUP: new workers for new connections, the old ones finish
    theirs); nothing when it is not running yet (its start reads them)."""
    c = q(container)
    return (f"if [ \"$(docker inspect -f '{{{{.State.Running}}}}' {c} 2>/dev/null)\" = true ]; then "
            f"docker kill -s HUP {c} >/dev/null; fi\n")  # fmt: skip


def container_name(stack: str) -> str:
    return f"{stack}-frontdoor"


def cert_names(fd: FrontDoorConfig, node: NodePlan) -> tuple[str, ...]:
    """What the certificate names: frontDoor.names first (what clients are given), then the node's address and
    name."""
    return tuple(dict.fromkeys([*fd.names, node.host, node.name]))


def build(fd: FrontDoorConfig, stack: str, node: NodePlan, state_dir: str, sudo: str, upstream: str, health_path: str,
          request_timeout_seconds: int, readiness: str, readiness_timeout_minutes: int,
          today: dt.date) -> FrontDoorPlan:  # fmt: skip
    """The door on `node`, in front of `upstream` (http://host:port[/v1]); `today`: the certificate's period."""
    name = container_name(stack)
    directory = f"{state_dir}/{name}"
    names = cert_names(fd, node)
    files = {"nginx.conf": nginx_conf(node.host, fd.port, upstream, health_path, request_timeout_seconds)}
    tls_path = f"{directory}/tls/tls.pem"
    schedule = Schedule(fd.certificate.validity_days, fd.certificate.renew_before_days)
    text = DOCKERFILE.read_text()
    digest = imagebuild_digest(text)
    build = imagebuild.unless_built(fd.image, BUILT_FROM, digest, f"docker build --label "
                                    f"{q(f'{BUILT_FROM}={digest}')} -t {q(fd.image)} -")  # fmt: skip
    return FrontDoorPlan(
        stack=stack,
        node=node,
        image=fd.image,
        dockerfile=text,
        build=build if fd.image == FRONTDOOR_IMAGE else None,
        digest=digest,
        url=f"https://{names[0]}" + ("" if fd.port == 443 else f":{fd.port}"),
        upstream=upstream.removesuffix("/v1"),
        names=names,
        directory=directory,
        files=files,
        files_write=files_write(f"{directory}/etc", files, sudo) + reload(name),
        files_delete=f"{sudo}rm -rf {q(directory + '/etc')}\n",
        tls_path=tls_path,
        tls_write=secret_file_create(tls_path, sudo) + reload(name),
        tls_delete=secret_file_delete(tls_path, sudo),
        container=ContainerPlan(name, ("nginx", "-c", f"{ETC}/etc/nginx.conf"),
                                ((f"{ETC}/etc", f"{directory}/etc", "bind", True),
                                 (f"{ETC}/tls", f"{directory}/tls", "bind", True)), fd.memory_mib),  # fmt: skip
        source=fd.certificate.source,
        schedule=schedule,
        period=schedule.period(today),
        own_certificate=fd.certificate.certificate,
        own_ca=fd.certificate.ca,
        readiness=readiness,
        readiness_timeout_minutes=readiness_timeout_minutes,
    )


def server_command(fp: FrontDoorPlan) -> str:
    """Local command: the server certificate of the plan's period from the stack's CA (its JSON on stdin)."""
    c = fp.schedule
    return " ".join(["python3 -m planning.tls server", *(f"--name {q(n)}" for n in fp.names),
                     f"--period {fp.period}", f"--validity-days {c.validity_days}",
                     f"--renew-before-days {c.renew_before_days}"])  # fmt: skip


def ca_command(stack: str) -> str:
    """Local command: a new CA of the stack's own (JSON {cert, key} on stdout)."""
    return f"python3 -m planning.tls ca --name {q(stack)}"


def summary(fp: FrontDoorPlan) -> str:
    """One line for the preview: the endpoint, the certificate's source and names, and its renewal."""
    line = f"front door: {fp.endpoint} on {fp.node.name} (nginx, TLS 1.2+), certificate for {', '.join(fp.names)}"
    if fp.source == "own":
        return line + " (the owner's: frontDoor.certificate)"
    r = fp.renewal()
    return line + f" from the stack's CA, valid to {r['expires']}; the first `up` from {r['renewed_from']} renews it"
