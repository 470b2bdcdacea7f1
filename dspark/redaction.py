"""Redaction by value, for what dspark writes to be shared (`dspark diagnose`).

A `Redactor` is given every secret value the stack knows, each with its kind (`api-key`, `member-key`,
`gateway-db-password`, ...): from the stack outputs (`outputs_secrets`), the stack config as
`pulumi config --show-secrets --json` prints it (`config_secrets`), the state as
`pulumi stack export --show-secrets` prints it (`state_secrets`: every value Pulumi keeps encrypted, the
gateway's database password among them) and this machine (`local_secrets`: the ssh identity file, the
passphrase). `redact(text)` replaces, wherever it occurs in the text:

- each value as is, and as it reads base64-encoded (standard and URL-safe alphabets, at each of the three
  alignments, so inside a longer blob too), URL-encoded and JSON-escaped (once and twice);
- each line of a multi-line value (an ssh private key printed line by line);
- any run of GRAM or more characters of a credential-shaped value (a partial print: a key's middle, its
  first 16 characters); shorter prefixes (`sk-…`) stay;

with `[redacted <kind>]`, and then what looks like a secret by name or shape even when the stack did not
know its value (`password=...`, `Authorization: Bearer ...`, a PEM private key, `sk-...`/`hf_...` tokens,
a URL's user:password). It counts what it replaced per kind; values are never part of its report.
"""

from __future__ import annotations

import base64
import json
import os
import re
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Optional

GRAM = 12  # a run this long shared with a credential is a (partial) print of it
MIN_LEN = 8  # shorter secret values are not redacted by value (they would erase ports, flags): counted only
_TOKEN = re.compile(r"[A-Za-z0-9_\-+/=.~]{16,}")  # credential-shaped: the gram alphabet, at least 16 long
_RUN = re.compile(r"[A-Za-z0-9_\-+/=.~]{%d,}" % GRAM)
_ATOMIC = re.compile(r"\S{%d,4096}" % MIN_LEN)
SIG_KEY, SIG_VALUE = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"  # Pulumi's secret marker
PLACEHOLDER = "[secret]"  # what `pulumi stack output --json` prints for a secret without --show-secrets
# a field whose value is a secret, wherever it is (outputs, config maps)
SECRET_FIELD = re.compile(r"(?i)(^|_)(api_?key|admin_?key|metrics_?key|master_?key|private_?key|token|password|passwd|"
                          r"secret|webhook(_?url)?)$")  # fmt: skip
CONFIG_KINDS = {"apiKey": "api-key", "sshPrivateKey": "ssh-private-key", "hfToken": "hf-token",
                "alertWebhook": "alert-webhook", "memberKeys": "member-key"}  # fmt: skip
LOCAL_ENV = {"PULUMI_CONFIG_PASSPHRASE": "pulumi-passphrase", "PULUMI_ACCESS_TOKEN": "pulumi-access-token",
             "HF_TOKEN": "hf-token", "HUGGING_FACE_HUB_TOKEN": "hf-token", "AWS_SECRET_ACCESS_KEY": "cloud-credential",
             "AZURE_STORAGE_KEY": "cloud-credential", "OPENAI_API_KEY": "local-api-key"}  # fmt: skip
_NAME = (r"(?:password|passwd|secret|token|api[_-]?key|apikey|admin[_-]?key|master[_-]?key|metrics[_-]?key|"
         r"private[_-]?key|access[_-]?key|webhook(?:[_-]?url)?|credentials?)")  # fmt: skip
# (pattern, group to replace): what reads as a secret by name or shape, for values the stack did not know
NAMED: tuple[tuple[re.Pattern, int], ...] = (
    (re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----|"
                r"(?:(?:\\n|\s)*[A-Za-z0-9+/=]{16,})*)", re.S), 0),  # fmt: skip
    (re.compile(r"(?i)(?:\bbearer|authorization:\s*basic)\s+([A-Za-z0-9._~+/=-]{8,})"), 1),
    (re.compile(r"://[^/\s:@\"']+:([^/\s@\"']{3,})@"), 1),
    (re.compile(r"(?i)" + _NAME + r"[\"']?\s*[:=]\s*\\?[\"']?([^\s\"',;}\]\[\\]{6,})"), 1),
    (re.compile(r"(?i)--(?:api-key|admin-key|token|password|hf-token)[ =]+['\"]?([^\s'\"\\]{6,})"), 1),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}|\bhf_[A-Za-z0-9]{30,}\b"), 0),
    (re.compile(r"https://hooks\.slack\.com/services/[^\s\"'\\]+"), 0),
)
_NOT_A_VALUE = re.compile(r"^(?:os\.environ/|\$|\*+$|(?:null|none|true|false|redacted)$)", re.I)


def label(kind: str) -> str:
    return f"[redacted {kind}]"


def _b64_cores(raw: bytes) -> Iterator[str]:
    """The characters of base64(...raw...) that only `raw` determines, at each alignment in a longer blob."""
    n = len(raw)
    for offset in range(3):
        start, end = -(-8 * offset // 6), (8 * (offset + n)) // 6
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            core = encode(b"\0" * offset + raw).decode()[start:end]
            if len(core) >= MIN_LEN:
                yield core


def forms(value: str) -> set[str]:
    """`value` as it can read in a text: as is, base64, URL-encoded, JSON-escaped (once, twice)."""
    out = {value}
    for quoted in (urllib.parse.quote(value, safe=""), urllib.parse.quote(value), urllib.parse.quote_plus(value)):
        out |= {quoted, re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), quoted)}
    once, ascii_once = json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]
    out |= {once, ascii_once, json.dumps(once)[1:-1], json.dumps(ascii_once)[1:-1]}
    out |= set(_b64_cores(value.encode()))
    return {f for f in out if len(f) >= MIN_LEN}


class Redactor:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}  # value -> kind (the first kind it was added with)
        self.short: Counter = Counter()  # kind -> secret values too short to redact by value
        self.counts: Counter = Counter()  # kind -> occurrences replaced
        self._compiled: Optional[tuple[list[tuple[str, str]], dict[str, str]]] = None

    def add(self, value: Any, kind: str) -> None:
        if not isinstance(value, str) or value.strip() in ("", PLACEHOLDER):
            return
        if len(value.strip()) < MIN_LEN:
            self.short[kind] += 1
            return
        for v in {value, value.strip()}:
            self.values.setdefault(v, kind)
        self._compiled = None

    def add_fields(self, value: Any, kind: str, all_leaves: bool = False) -> None:
        """The string leaves of `value` (all, or those under a secret-named field)."""
        for leaf, secret in _leaves(value, all_leaves):
            if secret:
                self.add(leaf, kind)

    def has(self, kind: str) -> bool:
        return kind in self.values.values()

    def kinds(self) -> Counter:
        """kind -> distinct secret values known."""
        return Counter(kind for _, kind in {(v.strip(), k) for v, k in self.values.items()})

    def _compile(self) -> tuple[list[tuple[str, str]], dict[str, str]]:
        if self._compiled is None:
            needles: dict[str, str] = {}
            grams: dict[str, str] = {}
            for value, kind in sorted(self.values.items(), key=lambda kv: -len(kv[0])):
                parts = {value}
                if "\n" in value.strip():
                    parts |= {line.strip() for line in value.splitlines() if len(line.strip()) >= 16}
                for part in parts:
                    for f in forms(part):
                        needles.setdefault(f, kind)
                tokens = [value] if _TOKEN.fullmatch(value) else []
                if "://" in value:  # a URL (a webhook): its long path segments are the credential
                    tokens += [s for s in re.split(r"[/?&=#]", urllib.parse.urlsplit(value).path + "/" +
                                                    urllib.parse.urlsplit(value).query) if _TOKEN.fullmatch(s)]  # fmt: skip
                for token in tokens:
                    for i in range(len(token) - GRAM + 1):
                        grams.setdefault(token[i:i + GRAM], kind)
            self._compiled = (sorted(needles.items(), key=lambda kv: -len(kv[0])), grams)
        return self._compiled

    def redact(self, text: str) -> str:
        needles, grams = self._compile()
        spans: list[tuple[int, int, str]] = []
        for needle, kind in needles:
            i = text.find(needle)
            while i != -1:
                spans.append((i, i + len(needle), kind))
                i = text.find(needle, i + 1)
        if grams:
            for m in _RUN.finditer(text):
                run, base = m.group(), m.start()
                for j in range(len(run) - GRAM + 1):
                    kind = grams.get(run[j:j + GRAM])
                    if kind:
                        spans.append((base + j, base + j + GRAM, kind))
        text = self._replace(text, spans)
        for pattern, group in NAMED:
            text = pattern.sub(lambda m: self._named(m, group), text)
        return text

    def _replace(self, text: str, spans: list[tuple[int, int, str]]) -> str:
        if not spans:
            return text
        spans.sort(key=lambda s: (s[0], -(s[1] - s[0])))
        out, pos, merged = [], 0, []  # merged: [start, end, kind of the longest match in it, its length]
        for start, end, kind in spans:
            if merged and start < merged[-1][1]:
                last = merged[-1]
                last[1] = max(last[1], end)
                if end - start > last[3]:
                    last[2], last[3] = kind, end - start
            else:
                merged.append([start, end, kind, end - start])
        for start, end, kind, _ in merged:
            out += [text[pos:start], label(kind)]
            self.counts[kind] += 1
            pos = end
        return "".join(out) + text[pos:]

    def _named(self, m: re.Match, group: int) -> str:
        value = m.group(group)
        if group and _NOT_A_VALUE.match(value):
            return m.group(0)
        self.counts["by-name-or-shape"] += 1
        if not group:
            return label("by-name-or-shape")
        s, e = m.span(group)
        return m.group(0)[: s - m.start()] + label("by-name-or-shape") + m.group(0)[e - m.start():]

    def report(self) -> dict:
        """What was redacted, by kind: how many values the stack made known, how many occurrences replaced."""
        known = self.kinds()
        kinds = sorted(set(known) | set(self.counts) | set(self.short))
        return {k: {"values_known": known.get(k, 0), "occurrences_redacted": self.counts.get(k, 0),
                    "values_too_short": self.short.get(k, 0)} for k in kinds}  # fmt: skip


def _leaves(value: Any, all_leaves: bool, secret: bool = False) -> Iterator[tuple[str, bool]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, all_leaves, secret or bool(SECRET_FIELD.search(str(k))))
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v, all_leaves, secret)
    elif isinstance(value, str):
        yield value, secret or all_leaves


# ---------------------------------------------------------------------------------------------- sources


def outputs_secrets(red: Redactor, outputs: Optional[dict], plain: Optional[dict] = None) -> None:
    """The stack outputs (`--show-secrets`): the keys they hold by name, and every value `plain` (the same
    outputs without --show-secrets) shows as [secret]."""
    if not outputs:
        return
    gateway = outputs.get("gateway") if isinstance(outputs.get("gateway"), dict) else {}
    red.add(gateway.get("admin_key"), "gateway-admin-key")
    red.add(gateway.get("metrics_key"), "gateway-metrics-key")
    red.add(outputs.get("api_key"), "api-key")
    red.add_fields(outputs.get("member_configs"), "member-key")
    red.add_fields(outputs.get("client_config"), "api-key")
    red.add_fields(outputs.get("admin_config"), "gateway-admin-key")
    red.add_fields(outputs, "output-secret")
    for path, value in _masked(outputs, plain):
        red.add(value, "output-secret")


def _masked(full: Any, plain: Any) -> Iterator[tuple[str, str]]:
    """(path, value) of the string values `plain` shows as [secret]; a structure masked whole is left to its
    secret-named fields (its endpoint and model names are not secrets)."""
    if plain == PLACEHOLDER and isinstance(full, str):
        yield "", full
    elif isinstance(full, dict) and isinstance(plain, dict):
        for k, v in full.items():
            yield from _masked(v, plain.get(k))
    elif isinstance(full, list) and isinstance(plain, list):
        for v, p in zip(full, plain):
            yield from _masked(v, p)


def config_secrets(red: Redactor, doc: Optional[dict]) -> None:
    """`pulumi config --show-secrets --json`: every entry marked secret, whole or leaf by leaf."""
    for name, entry in (doc or {}).items():
        if not isinstance(entry, dict) or not entry.get("secret"):
            continue
        kind = CONFIG_KINDS.get(name.split(":", 1)[-1].split(".")[0], "config-secret")
        value = entry.get("objectValue", entry.get("value"))
        if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
            try:
                value = json.loads(value)
            except ValueError:
                pass
        red.add_fields(value, kind, all_leaves=True)


def _state_kind(urn: str) -> str:
    name = urn.rsplit("::", 1)[-1]
    for suffix, kind in (("-db-password", "gateway-db-password"), ("-admin-key", "gateway-admin-key"),
                         ("-metrics-key", "gateway-metrics-key")):  # fmt: skip
        if name.endswith(suffix):
            return kind
    return "member-key" if re.search(r"-gateway-key-.+$", name) else "state-secret"


def state_secrets(red: Redactor, export: Optional[dict]) -> int:
    """`pulumi stack export --show-secrets`: every value the state keeps encrypted that is one credential (a
    key, a password, a private key; not a script or a file that embeds one, whose parts are there alone
    too). Returns how many secret values it looked at."""
    seen = 0

    def take(value: Any, urn: str) -> None:
        if isinstance(value, str):
            s = value.strip()
            if "PRIVATE KEY-----" in s:
                red.add(value, "ssh-private-key")
            elif _ATOMIC.fullmatch(s):
                red.add(s, _state_kind(urn))
        else:  # a secret structure (a client config): its secret-named fields
            red.add_fields(value, _state_kind(urn))

    def walk(node: Any, urn: str) -> None:
        nonlocal seen
        if isinstance(node, dict):
            if node.get(SIG_KEY) == SIG_VALUE:
                seen += 1
                text = node.get("plaintext")
                try:
                    take(json.loads(text) if isinstance(text, str) else None, urn)
                except ValueError:
                    take(text, urn)
                return
            urn = node.get("urn") if isinstance(node.get("urn"), str) else urn
            for v in node.values():
                walk(v, urn)
        elif isinstance(node, list):
            for v in node:
                walk(v, urn)

    walk(export, "")
    return seen


def local_secrets(red: Redactor, identity_file: Optional[str], env: Optional[dict] = None) -> list[str]:
    """This machine's: the stack's ssh identity file, the Pulumi passphrase, tokens in the environment.
    Returns where they came from (names, never values)."""
    env = dict(os.environ) if env is None else env
    found = []
    if identity_file:
        try:
            text = Path(os.path.expanduser(identity_file)).read_text()[:65536]
        except (OSError, UnicodeDecodeError):
            text = ""
        if "PRIVATE KEY" in text:
            red.add(text, "ssh-private-key")
            found.append("ssh.identityFile")
    for name, kind in LOCAL_ENV.items():
        if env.get(name):
            red.add(env[name], kind)
            found.append(f"${name}")
    path = env.get("PULUMI_CONFIG_PASSPHRASE_FILE")
    if path:
        try:
            red.add(Path(path).read_text().strip(), "pulumi-passphrase")
            found.append("$PULUMI_CONFIG_PASSPHRASE_FILE")
        except (OSError, UnicodeDecodeError):
            pass
    return found
