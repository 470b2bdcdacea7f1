"""A stack as dspark sees it: the validated config from `Pulumi.<stack>.yaml`, and the stack's
outputs, read only when a command needs them (dspark.clients.read_outputs: `--outputs-file`,
or `pulumi stack output --json --show-secrets --stack <stack>` run in the project directory)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import yaml

from dspark import clients
from planning import clusterplan, plan, rules, stackplan
from programs import probe
from declared.cluster import CLUSTER_KEY, PROJECT, ClusterConfig, ConfigError
from declared.stack import StackConfig, parse_stack

if TYPE_CHECKING:
    from planning.exposure import NodeExposure
    from planning.gateway import GatewayPlan

CONFIG_KEY = f"{PROJECT}:{CLUSTER_KEY}"


class DsparkError(Exception):
    """dspark cannot run (arguments, config, outputs); the message says what to do."""


def short_name(stack: str) -> str:
    """`org/project/stack` -> `stack`: what the program names containers and the stack file after."""
    return stack.rsplit("/", 1)[-1]


def read_stack(project_dir: Path, stack: str) -> StackConfig:
    path = project_dir / f"Pulumi.{short_name(stack)}.yaml"
    if not path.is_file():
        raise DsparkError(f"{path} not found: run dspark in the project directory or pass --project-dir")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise DsparkError(f"{path} is not valid YAML: {exc}") from None
    cfg = doc.get("config") if isinstance(doc, dict) else None
    cfg = cfg if isinstance(cfg, dict) else {}
    raw = cfg.get(CONFIG_KEY, cfg.get(CLUSTER_KEY))
    try:
        return parse_stack(raw)
    except ConfigError as exc:
        raise DsparkError(f"{path}: {exc}") from None


@dataclass
class Stack:
    name: str  # as given to --stack (may be org/project/stack)
    project_dir: Path
    cfg: ClusterConfig  # the group's config (the stack's, for a stack without `groups`)
    outputs_file: Optional[str] = None
    group: Optional[str] = None  # --group, in a stack with `groups`
    routed: bool = False  # a router is in front of the group(s)
    config: Optional[StackConfig] = None  # the whole stack (groups, router, gateway)
    read_outputs: Callable[[Optional[str], Optional[str]], dict] = clients.read_outputs
    _outputs: Optional[dict] = field(default=None, repr=False)
    _outputs_error: Optional[str] = field(default=None, repr=False)

    @property
    def short(self) -> str:
        return short_name(self.name)

    @property
    def fronted(self) -> bool:
        """A router or the team gateway fronts the group: its own API is an inner port (planning/exposure.py), which
        the fence lets only the stack's parts reach, so dspark reaches it through ssh."""
        return self.routed or (self.config is not None and self.config.gateway is not None)

    @property
    def plan_name(self) -> str:
        """What the program names the group's containers, volumes and files after (`<stack>[-<group>]`)."""
        return self.short if self.group is None else f"{self.short}-{self.group}"

    # ------------------------------------------------------------------ outputs

    def outputs(self) -> dict:
        """The stack outputs; raises DsparkError saying how to get them."""
        data, error = self.try_outputs()
        if data is None:
            raise DsparkError(error or "no stack outputs")
        return data

    def try_outputs(self) -> tuple[Optional[dict], Optional[str]]:
        if self._outputs is None and self._outputs_error is None:
            try:
                if self.outputs_file:
                    self._outputs = self.read_outputs(self.name, self.outputs_file)
                else:
                    with contextlib.chdir(self.project_dir):
                        self._outputs = self.read_outputs(self.name, None)
            except clients.ClientConfigError as exc:
                self._outputs_error = f"stack outputs unavailable: {exc}"
            except OSError as exc:
                self._outputs_error = f"stack outputs unavailable: {exc}"
            door = (self._outputs or {}).get("front_door")
            if isinstance(door, dict) and isinstance(door.get("ca_pem"), str):
                probe.trust(door["ca_pem"])  # the endpoint is the front door: verify it with the stack's CA
        return self._outputs, self._outputs_error

    def api_key(self) -> Optional[str]:
        """The API key from the outputs (`api_key`, or `client_config.api_key` / `admin_config.api_key`), None if not
        there."""
        data, _ = self.try_outputs()
        if not data:
            return None
        configs = [data.get(k) for k in ("client_config", "admin_config") if isinstance(data.get(k), dict)]
        for value in (data.get("api_key"), *(c.get("api_key") for c in configs)):
            if isinstance(value, str) and value.strip() and value != clients.SECRET_PLACEHOLDER:
                return value
        return None

    def require_key(self, why: str) -> str:
        key = self.api_key()
        if key:
            return key
        _, error = self.try_outputs()
        raise DsparkError(
            f"the API key is needed {why}, and {error or 'the stack outputs hold none (shown as [secret]?)'}; "
            f"save them with `pulumi stack output --json --show-secrets --stack {self.name} > outputs.json` "
            "and pass --outputs-file outputs.json"
        )

    def output(self, name: str) -> Any:
        data, _ = self.try_outputs()
        return (data or {}).get(name)

    # ------------------------------------------------------------------ derived

    def group_plan(self) -> clusterplan.StackPlan:
        """The group's plan as the program builds it: within the whole stack, whose router and gateway share
        its nodes' memory budgets (and so the ranks' limits). A stack whose config breaks a stack rule
        (which `plan` reports) is planned as the group alone."""
        sc = self.config
        if sc is None or rules.check_stack(sc, self.short)[0]:
            return stackplan.build(self.cfg, self.plan_name)
        return next(g for g in stackplan.build_stack(sc, self.short).groups if g.stack == self.plan_name)

    def exposure(self) -> dict[str, "NodeExposure"]:
        """Node name -> its exposure as the program plans it (planning/exposure.py): its listeners, its fence."""
        sc = self.config
        if sc is None or rules.check_stack(sc, self.short)[0]:
            return {}
        return {ne.node: ne for ne in stackplan.build_stack(sc, self.short).exposure}

    def planned_revision(self) -> str:
        """The group revision the config plans (what the next `up` would label every rank with)."""
        return self.group_plan().revision

    def _group_output(self) -> dict:
        for entry in self.output("groups") or []:
            if isinstance(entry, dict) and entry.get("name") == (self.group or self.short):
                return entry
        return {}

    def gateway_plan(self) -> Optional["GatewayPlan"]:
        """The team gateway's plan, the one the program builds it from; None without a gateway (or while the
        stack's config has errors, which `plan` reports)."""
        sc = self.config
        if sc is None or sc.gateway is None or rules.check_stack(sc, self.short)[0]:
            return None
        return stackplan.build_stack(sc, self.short).gateway

    def expected_revision(self) -> tuple[str, str]:
        """(revision the ranks should carry, where it came from: "outputs" or "config")."""
        value = self.output("group_revision") if self.group is None else self._group_output().get("revision")
        if isinstance(value, str) and value:
            return value, "outputs"
        return self.planned_revision(), "config"

    def endpoint(self) -> str:
        """The group's own endpoint (rank 0): health and status are about the group, not the router nor
        the gateway (whose `endpoint` output is the gateway's: its `upstream` is the group's)."""
        if self.routed:
            value = self._group_output().get("endpoint")
        else:
            gateway = self.output("gateway")
            value = (gateway.get("upstream") if isinstance(gateway, dict) else None) or self.output("endpoint")
        return value if isinstance(value, str) and value else plan.endpoint(self.cfg)


def group_names(name: str, project_dir: str | Path = ".") -> list[Optional[str]]:
    """The stack's groups by name ([None] for a stack without `groups`)."""
    sc = read_stack(Path(project_dir).resolve(), name)
    return [None] if sc.single is not None else [e.name for e in sc.groups]


def load(name: str, project_dir: str | Path = ".", outputs_file: Optional[str] = None,
         group: Optional[str] = None) -> Stack:  # fmt: skip
    """The stack, and for a stack with `groups` the one named by `group` (required there)."""
    directory = Path(project_dir).resolve()
    sc = read_stack(directory, name)
    names = [e.name for e in sc.groups if e.name]
    if sc.single is not None and group is None:
        return Stack(name=name, project_dir=directory, cfg=sc.single, outputs_file=outputs_file,
                     routed=sc.router is not None, config=sc)  # fmt: skip
    entry = next((e for e in sc.groups if e.name and e.name == group), None)
    if entry is None:
        have = f"its groups are {', '.join(names)}" if names else "it has no groups"
        raise DsparkError(f"stack {short_name(name)}: {'pass --group' if group is None else f'no group {group!r}'}; "
                          f"{have}")  # fmt: skip
    return Stack(name=name, project_dir=directory, cfg=entry.cfg, outputs_file=outputs_file, group=entry.name,
                 routed=sc.router is not None, config=sc)  # fmt: skip
