"""Client configs from a stack's outputs: an OpenAI SDK env file, a LiteLLM proxy config, a curl example.

    python -m dspark.clients --stack tp4 --format openai-env --out tp4.env
    python -m dspark.clients --outputs-file saved.json --format litellm --out litellm.yaml
    python -m dspark.clients --stack tp4 --format curl
    python -m dspark.clients --stack sim-team --member alice --format openai-env --out alice.env  # her own key
    python -m dspark.clients --stack tp4x2 --format prometheus --out scrape.yml   # no key in it
    python -m dspark.clients --stack tp4x2 --format prometheus-rules --out deepseek-spark.rules.yml  # alert rules
    python -m dspark.clients --stack tp4x2 --format grafana --out dashboard.json  # import in Grafana

Outputs come from `pulumi stack output --json --show-secrets --stack X` (when the CLI is on PATH)
or from a file saved with that command. Rendering is pure (`render`); files are written 0600 from
the moment they exist (a temp file made 0600, then renamed over the target), since they hold the
API key. Runs without the Pulumi SDK.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from planning.clientconfig import Client, litellm_config

FORMATS = ("openai-env", "litellm", "curl", "prometheus", "prometheus-rules", "grafana")
SECRET_PLACEHOLDER = "[secret]"  # what `pulumi stack output --json` prints without --show-secrets
PROMPT = "What is 19 + 23?"


class ClientConfigError(Exception):
    """The outputs cannot produce a working client config; the message says what to do."""


# ------------------------------------------------------------------------------------------ outputs


def client_from_outputs(outputs: Mapping[str, Any], stack: str = "", member: Optional[str] = None,
                        admin: bool = False) -> Client:
    """Stack outputs -> Client. Prefers `client_config`; falls back to endpoint/model/api_key. On a stack with the
    gateway there is no client config: `member` picks that team member's own (`member_configs`), `admin` the
    admin's (`admin_config`, LiteLLM's master key), and neither is an error naming both."""
    cc = outputs.get("client_config")
    gateway = "member_configs" in outputs or "admin_config" in outputs
    if admin:
        if "admin_config" not in outputs:
            raise ClientConfigError("--admin: this stack has no gateway, so no admin config; omit --admin")
        cc = outputs["admin_config"]
    elif member is None and gateway and cc is None:
        configs = outputs.get("member_configs")
        known = ", ".join(sorted(configs)) if isinstance(configs, Mapping) else "see `pulumi stack output member_configs`"
        raise ClientConfigError(f"this stack serves its team through the gateway: pass --member NAME for a member's "
                                f"own key (members: {known or 'none'}), or --admin for the admin's (LiteLLM's master "
                                "key: for operators, never a client's)")  # fmt: skip
    if member is not None:
        configs = outputs.get("member_configs")
        if configs == SECRET_PLACEHOLDER:
            raise ClientConfigError("member_configs is shown as [secret]: save the outputs with "
                                    "`pulumi stack output --json --show-secrets --stack <stack>`")  # fmt: skip
        if not isinstance(configs, Mapping) or member not in configs:
            known = sorted(configs) if isinstance(configs, Mapping) else []
            raise ClientConfigError(f"no member {member!r} in the stack outputs (members: {', '.join(known) or 'none'}; "
                                    "add them under cluster.gateway.members and run `pulumi up`)")  # fmt: skip
        cc = configs[member]
    ca_pem = None
    if isinstance(cc, Mapping):
        base_url, api_key, model, ca_pem = cc.get("base_url"), cc.get("api_key"), cc.get("model"), cc.get("ca_pem")
    else:
        base_url, api_key, model = outputs.get("endpoint"), outputs.get("api_key"), outputs.get("model")
    missing = [n for n, v in (("base_url/endpoint", base_url), ("model", model)) if not isinstance(v, str) or not v]
    if missing:
        raise ClientConfigError(
            f"the stack outputs have no {', '.join(missing)}; run `pulumi up` first (outputs: {sorted(outputs)})"
        )
    if api_key == SECRET_PLACEHOLDER:
        raise ClientConfigError(
            "the API key is shown as [secret]: save the outputs with "
            "`pulumi stack output --json --show-secrets --stack <stack>`"
        )
    if not isinstance(api_key, str) or not api_key.strip():
        raise ClientConfigError("the stack outputs have no api_key; the endpoint requires one")
    if not re.match(r"^https?://[^/\s]+(/\S*)?$", base_url):
        raise ClientConfigError(f"endpoint {base_url!r} is not an http(s) URL")
    return Client(base_url=base_url.rstrip("/"), api_key=api_key, model=model, stack=stack,
                  ca_pem=ca_pem if isinstance(ca_pem, str) and ca_pem.strip() else None)


def operator_client(outputs: Mapping[str, Any], stack: str = "") -> Client:
    """What the operator's tools (smoke, bench) call with: the client config, or on a gateway stack the admin's."""
    return client_from_outputs(outputs, stack=stack, admin="client_config" not in outputs and "admin_config" in outputs)


def read_outputs(stack: Optional[str], outputs_file: Optional[str], pulumi: Optional[str] = None) -> dict:
    """Outputs from a saved JSON file ("-" for stdin), or from the Pulumi CLI."""
    if outputs_file:
        text = sys.stdin.read() if outputs_file == "-" else Path(outputs_file).read_text()
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ClientConfigError(
                f"{outputs_file} is not JSON ({exc}); save it with `pulumi stack output --json --show-secrets`"
            ) from None
        if not isinstance(data, dict):
            raise ClientConfigError(f"{outputs_file} holds {type(data).__name__}, expected the outputs object")
        return data
    if not stack:
        raise ClientConfigError("give --stack (read with the Pulumi CLI) or --outputs-file")
    exe = pulumi or shutil.which("pulumi")
    if not exe:
        raise ClientConfigError(
            "the Pulumi CLI is not on PATH: save the outputs where it is with "
            f"`pulumi stack output --json --show-secrets --stack {stack} > {stack}.outputs.json` "
            "and pass --outputs-file"
        )
    proc = subprocess.run(
        [exe, "stack", "output", "--json", "--show-secrets", "--stack", stack],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise ClientConfigError(f"`pulumi stack output` failed for stack {stack}: {proc.stderr.strip()}")
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ClientConfigError(f"`pulumi stack output --json` printed no outputs object for stack {stack}")
    return data


# ------------------------------------------------------------------------------------------ render

_ENV_SAFE = re.compile(r"^[A-Za-z0-9_./:@%+,=-]*$")


def _env_value(value: str) -> str:
    """Unquoted when safe (valid for sh, python-dotenv and `docker --env-file` alike), else single-quoted."""
    if "\n" in value:
        raise ClientConfigError("a value with a newline cannot go into an env file")
    return value if _ENV_SAFE.match(value) else shlex.quote(value)


def render_openai_env(c: Client, ca_file: Optional[str] = None) -> str:
    """Env file for the OpenAI SDKs (they read OPENAI_BASE_URL and OPENAI_API_KEY) and most tools; with the front
    door's CA, SSL_CERT_FILE (httpx, so the OpenAI SDKs, requests and curl read it)."""
    title = f" {c.stack}" if c.stack else ""
    return (
        f"# deepseek-spark{title}: OpenAI-compatible endpoint. Holds the API key (mode 600).\n"
        "# sh: set -a; . ./this.env; set +a   docker: --env-file this.env   python: dotenv.load_dotenv\n"
        f"OPENAI_BASE_URL={_env_value(c.base_url)}\n"
        f"OPENAI_API_KEY={_env_value(c.api_key)}\n"
        f"OPENAI_MODEL={_env_value(c.model)}\n"
        + (f"SSL_CERT_FILE={_env_value(ca_file)}\n" if ca_file else "")
    )


def _yaml_scalar(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid YAML double-quoted scalar


def render_litellm(c: Client, key_env: Optional[str] = None, ca_file: Optional[str] = None) -> str:
    cfg = litellm_config(c, key_env)
    entry = cfg["model_list"][0]
    p = entry["litellm_params"]
    title = f" {c.stack}" if c.stack else ""
    where = f"read from ${key_env}" if key_env else "holds the API key (mode 600)"
    return (
        f"# deepseek-spark{title}: LiteLLM proxy config (`litellm --config this.yaml`); {where}.\n"
        "model_list:\n"
        f"  - model_name: {_yaml_scalar(entry['model_name'])}\n"
        "    litellm_params:\n"
        f"      model: {_yaml_scalar(p['model'])}\n"
        f"      api_base: {_yaml_scalar(p['api_base'])}\n"
        f"      api_key: {_yaml_scalar(p['api_key'])}\n"
        + (f"      ssl_verify: {_yaml_scalar(ca_file)}\n" if ca_file else "")
    )


def render_curl(c: Client, key_env: Optional[str] = None, prompt: str = PROMPT, ca_file: Optional[str] = None) -> str:
    """A sh script: one chat completion. The key goes to curl on stdin (`-H @-`), never in argv."""
    body = json.dumps({"model": c.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 64})
    key_line = (
        f'key="${{{key_env}:?set {key_env} to the API key}}"' if key_env else f"key={shlex.quote(c.api_key)}"
    )
    title = f" {c.stack}" if c.stack else ""
    return (
        "#!/bin/sh\n"
        f"# deepseek-spark{title}: one chat completion against the endpoint"
        f"{'' if key_env else ' (holds the API key, mode 600)'}.\n"
        "set -eu\n"
        f"{key_line}\n"
        "printf 'Authorization: Bearer %s\\n' \"$key\" |\n"
        f"  curl -sS --fail-with-body {'--cacert ' + shlex.quote(ca_file) + ' ' if ca_file else ''}"
        f"{shlex.quote(c.chat_completions_url)} \\\n"
        "    -H @- -H 'Content-Type: application/json' \\\n"
        f"    -d {shlex.quote(body)}\n"
    )


def render(c: Client, fmt: str, key_env: Optional[str] = None, ca_file: Optional[str] = None) -> str:
    """`ca_file`: where the endpoint's CA (c.ca_pem) is written; each format points its client at it."""
    if fmt == "openai-env":
        return render_openai_env(c, ca_file)
    if fmt == "litellm":
        return render_litellm(c, key_env, ca_file)
    if fmt == "curl":
        return render_curl(c, key_env, ca_file=ca_file)
    raise ClientConfigError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def _scrape_configs(outputs: Mapping[str, Any]) -> list:
    prom = outputs.get("prometheus")
    configs = prom.get("scrape_configs") if isinstance(prom, Mapping) else None
    if not isinstance(configs, list):
        raise ClientConfigError("the outputs have no `prometheus` (a stack from before it existed): run `pulumi up` once")
    if not configs:
        raise ClientConfigError("nothing to scrape: no router, and no group serves /metrics (SGLang needs "
                                "--enable-metrics in serving.extraArgs)")  # fmt: skip
    return configs


def render_prometheus(outputs: Mapping[str, Any], stack: str = "") -> str:
    """The stack's `prometheus` output as a `scrape_configs:` block for prometheus.yml (no secret)."""
    import yaml

    configs = _scrape_configs(outputs)
    title = f" {stack}" if stack else ""
    return (f"# deepseek-spark{title}: Prometheus scrape configs; merge under `scrape_configs:` of prometheus.yml.\n"
            + yaml.safe_dump({"scrape_configs": configs}, sort_keys=False))  # fmt: skip


def render_rules(outputs: Mapping[str, Any], stack: str = "") -> str:
    """The stack's `alert_rules` output as a rules file for Prometheus's `rule_files:` (no secret)."""
    from planning import alerts

    rules = outputs.get("alert_rules")
    if not isinstance(rules, Mapping) or not isinstance(rules.get("groups"), list):
        raise ClientConfigError("the outputs have no `alert_rules` (a stack from before they existed): run `pulumi up` once")
    return alerts.render(dict(rules), stack)


def render_grafana(outputs: Mapping[str, Any], stack: str) -> str:
    """A Grafana dashboard over what `--format prometheus` scrapes (its queries select stack=<stack>)."""
    from dspark import dashboard

    configs = _scrape_configs(outputs)
    labels = [sc.get("labels", {}).get("stack") for c in configs for sc in c.get("static_configs", [])]
    return json.dumps(dashboard.dashboard(configs, stack or next((s for s in labels if s), "")), indent=2) + "\n"


# ------------------------------------------------------------------------------------------- write


def write_private(path: str | os.PathLike, text: str, mode: int = 0o600) -> Path:
    """Write `text` to `path` so that it is never readable by others, not even for a moment: a new
    temp file (created 0600 by mkstemp) in the same directory, then an atomic rename over `path`.
    An existing file (whatever its mode) or symlink at `path` is replaced, never written through."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


# --------------------------------------------------------------------------------------------- cli


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dspark.clients",
        description="Write a client config for a deepseek-spark stack from its outputs.",
    )
    parser.add_argument("--stack", help="stack to read with `pulumi stack output` (tp3, tp4, ...)")
    parser.add_argument("--outputs-file", help="outputs saved with `pulumi stack output --json --show-secrets` ('-': stdin)")
    parser.add_argument("--format", required=True, choices=FORMATS)
    parser.add_argument("--out", help="file to write (mode 600); stdout when omitted")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--member", metavar="NAME", help="a team member's own config (stacks with the gateway)")
    who.add_argument("--admin", action="store_true", help="the gateway admin's config (LiteLLM's master key)")
    parser.add_argument("--ca-out", metavar="FILE", help="where to write the endpoint's CA (front door with the stack's "
                        "CA; mode 600; default: beside --out as <name>.ca.pem, else ./<stack>.ca.pem)")
    parser.add_argument("--key-env", metavar="NAME",
                        help="litellm/curl: read the key from env var NAME instead of writing it into the file")  # fmt: skip
    args = parser.parse_args(argv)
    if args.key_env and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", args.key_env):
        parser.error(f"--key-env {args.key_env!r} is not an environment variable name")
    try:
        outputs = read_outputs(args.stack, args.outputs_file)
        if args.format == "prometheus":
            text = render_prometheus(outputs, args.stack or "")
        elif args.format == "prometheus-rules":
            text = render_rules(outputs, args.stack or "")
        elif args.format == "grafana":
            text = render_grafana(outputs, args.stack or "")
        else:
            client = client_from_outputs(outputs, stack=args.stack or "", member=args.member, admin=args.admin)
            ca_file = None
            if client.ca_pem:
                ca_file = str(Path(args.ca_out or (Path(args.out).with_suffix(".ca.pem") if args.out else
                                                   f"{args.stack or 'deepseek-spark'}.ca.pem")).resolve())  # fmt: skip
                write_private(ca_file, client.ca_pem)
                print(f"wrote {ca_file} (the endpoint's CA, mode 600)", file=sys.stderr)
            text = render(client, args.format, args.key_env, ca_file)
    except ClientConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.out:
        write_private(args.out, text)
        print(f"wrote {args.out} ({args.format}, mode 600)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
