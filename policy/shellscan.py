"""Shell scripts read statically (shlex), for the guardrails: the simple commands a script runs (through
sudo/env/nohup wrappers, pipelines and `sh -c` bodies), the paths a command deletes, and how a path
relates to a protected one. What cannot be read from the script is reported as unknown (None), so
a check refuses it rather than guessing."""

from __future__ import annotations

import fnmatch
import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

_PUNCT = "();<>|&\n"
_KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "case", "esac", "{", "}", "!"}
SHELLS = {"sh", "bash", "dash", "ash", "zsh"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass
class SimpleCommand:
    argv: list[str]  # words after assignments and wrappers (sudo, env, nohup, ...) are stripped
    writes: list[str] = field(default_factory=list)  # `>` / `>>` targets
    stdin_from: Optional["SimpleCommand"] = None  # previous stage of a pipeline
    text: str = ""
    assignments: list[str] = field(default_factory=list)  # `NAME=value` words of a command-less line


def _tokens(script: str) -> Optional[list[str]]:
    lex = shlex.shlex(script, posix=True, punctuation_chars=_PUNCT)
    lex.whitespace = " \t\r"
    lex.commenters = ""
    lex.wordchars += "$:@%+,{}[]!^#*?~=."
    try:
        return list(lex)
    except ValueError:
        return None


def _strip_wrappers(argv: list[str]) -> list[str]:
    """`sudo -n rm x` -> `rm x`; also env, nohup, exec, command, nice, timeout, doas."""
    changed = True
    while argv and changed:
        changed = False
        word = posixpath.basename(argv[0])
        if word in ("sudo", "doas"):
            argv = argv[1:]
            while argv and argv[0].startswith("-"):
                opt = argv.pop(0)
                if opt in ("-u", "-g", "-C", "-h", "-p", "-U", "-r", "-t") and argv:
                    argv.pop(0)
            changed = True
        elif word == "env":
            argv = argv[1:]
            while argv and (argv[0].startswith("-") or _ASSIGNMENT.match(argv[0])):
                argv.pop(0)
            changed = True
        elif word in ("nohup", "exec", "builtin") or (word == "command" and argv[1:2] not in (["-v"], ["-V"])):
            argv = argv[1:]
            changed = True
        elif word in ("nice", "ionice", "timeout", "stdbuf"):
            argv = argv[1:]
            while argv and (argv[0].startswith("-") or (word == "timeout" and argv[0][:1].isdigit())):
                argv.pop(0)
            changed = True
    return argv


# Programs of this repository a script may feed to an interpreter on stdin (a quoted heredoc): read
# here, so a body that differs from them by one byte is not trusted. Each only reads the node.
TRUSTED_PROGRAMS = {
    (Path(__file__).resolve().parents[1] / "programs" / name).read_text(): name for name in ("rails.py",)
}
_HEREDOC = re.compile(r"<<-?\s*(['\"])([A-Za-z_][A-Za-z0-9_]*)\1")
INTERPRETERS = {"python3", "python"}


def split_heredocs(script: str) -> Optional[tuple[str, list[tuple[str, str]]]]:
    """(the script without its quoted heredoc bodies, [(the line that reads one, its body)]). A quoted
    heredoc is data (no expansion); what reads it decides what it is. None: one without its
    delimiter line."""
    lines, out, bodies, i = script.split("\n"), [], [], 0
    while i < len(lines):
        line = lines[i]
        m = _HEREDOC.search(line)
        if m is None:  # (an unquoted heredoc stays in the script: the checks read it as they can)
            out.append(line)
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == m.group(2)), None)
        if end is None:
            return None
        bodies.append((line, "\n".join(lines[i + 1:end]) + "\n"))
        out.append(line[:m.start()] + line[m.end():])
        i = end + 1
    return "\n".join(out), bodies


def heredoc_reader(line: str) -> Optional[str]:
    """What reads a heredoc on `line`: "shell", "python" or None (anything else). A shell given its script with
    `-c` does not read stdin as a script: what that script runs reads it (`sh -c 'cat > "$1"' sh f <<'X'`: data)."""
    try:
        argv = shlex.split(line)
    except ValueError:
        argv = None
    if argv:
        for i, word in enumerate(argv):
            if posixpath.basename(word) in SHELLS and i + 2 < len(argv) and argv[i + 1] == "-c":
                return heredoc_reader(argv[i + 2])
    words = [posixpath.basename(w) for w in re.split(r"[\s;|&()$]+", line)]
    runs = [w for w in words if w in SHELLS | INTERPRETERS]
    return None if not runs else ("python" if runs[0] in INTERPRETERS else "shell")


def parse_script(script: str) -> Optional[list[SimpleCommand]]:
    """The simple commands of a POSIX sh script, in order; None when it cannot be tokenized. A quoted
    heredoc fed to a shell is read as part of the script; one fed to Python must be one of
    TRUSTED_PROGRAMS (else None: the policy cannot account for it); anything else reads it as data."""
    split = split_heredocs(script)
    if split is None:
        return None
    text = split[0]
    for line, body in split[1]:
        reader = heredoc_reader(line)
        if reader == "shell":
            text += "\n" + body
        elif reader == "python" and body not in TRUSTED_PROGRAMS:
            return None  # (anything else reads it as data: `cat > file` and the like)
    tokens = _tokens(text)
    if tokens is None:
        return None
    commands: list[SimpleCommand] = []
    words: list[str] = []
    writes: list[str] = []
    piped_from: Optional[SimpleCommand] = None

    def flush(sep: str) -> None:
        nonlocal words, writes, piped_from
        argv = list(words)
        while argv and argv[0] in _KEYWORDS:
            argv.pop(0)
        assignments = []
        while argv and _ASSIGNMENT.match(argv[0]):
            assignments.append(argv.pop(0))
        cmd = SimpleCommand(_strip_wrappers(argv), list(writes), piped_from, " ".join(words))
        if cmd.argv or assignments:
            if not cmd.argv:  # only assignments: they set shell variables for the lines after
                cmd.assignments = assignments
            commands.append(cmd)
            piped_from = cmd if sep == "|" else None
        else:
            piped_from = None
        words, writes = [], []

    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok and set(tok) <= set(_PUNCT):
            if "<" in tok or ">" in tok:
                target = tokens[i + 1] if i + 1 < len(tokens) else ""
                if ">" in tok and "&" not in tok and target:
                    writes.append(target)
                elif tok in (">&", "&>") and target and not target.isdigit():
                    writes.append(target)
                if words and words[-1].isdigit():  # `2>` : the fd number belongs to the redirection
                    words.pop()
                i += 2
                continue
            flush("|" if tok == "|" else tok)
            i += 1
            continue
        words.append(tok)
        i += 1
    flush("")
    return commands


def expand(word: str, env: Mapping[str, str]) -> Optional[str]:
    """Substitute literal `$NAME`/`${NAME}` from earlier assignments; None if anything stays dynamic."""
    out = _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), "\0"), word)
    if "\0" in out or "$" in out or "`" in out:
        return None
    return out


def _assignments(cmd: SimpleCommand) -> list[tuple[str, str]]:
    return [(a.split("=", 1)[0], a.split("=", 1)[1]) for a in cmd.assignments]


def operands(args: list[str], takes_value: tuple[str, ...] = ()) -> list[str]:
    out, i, options_done = [], 0, False
    while i < len(args):
        arg = args[i]
        if not options_done and arg == "--":
            options_done = True
        elif not options_done and arg.startswith("-") and arg != "-":
            if arg in takes_value:
                i += 1
        else:
            out.append(arg)
        i += 1
    return out


def deleted_paths(cmd: SimpleCommand) -> list[str]:
    """Paths a simple command deletes or moves away (as written, before expansion); [] for none.
    `"<dynamic>"` stands for paths that come from elsewhere (xargs)."""
    if not cmd.argv:
        return []
    name, args = posixpath.basename(cmd.argv[0]), cmd.argv[1:]
    if name in ("rm", "rmdir", "unlink", "shred"):
        return operands(args)
    if name == "mv":
        return operands(args, ("-t", "-S"))[:-1]
    if name == "truncate":
        return operands(args, ("-s", "-r", "--size", "--reference"))
    if name == "find":
        deleting = "-delete" in args or any(
            a in ("-exec", "-execdir", "-ok") and i + 1 < len(args)
            and posixpath.basename(args[i + 1]) in ("rm", "rmdir", "shred", "unlink", "mv")
            for i, a in enumerate(args)
        )  # fmt: skip
        roots = []
        for a in args:
            if a.startswith("-") or a in ("(", "!", ")"):
                break
            roots.append(a)
        return (roots or ["."]) if deleting else []
    if name == "rsync":
        ops = operands(args)
        paths = []
        if any(a.startswith("--delete") for a in args) and ops:
            paths.append(ops[-1])
        if "--remove-source-files" in args:
            paths += ops[:-1]
        return paths
    if name == "dd":
        return [a[3:] for a in args if a.startswith("of=")]
    if name == "xargs":
        inner = _strip_wrappers([a for a in args if not a.startswith("-")])
        if inner and posixpath.basename(inner[0]) in ("rm", "rmdir", "unlink", "shred", "mv", "truncate"):
            return ["<dynamic>"]
    return []


def _inner_scripts(cmd: SimpleCommand) -> list[str]:
    """`sh -c 'script'` nested in a command."""
    if cmd.argv and posixpath.basename(cmd.argv[0]) in SHELLS and "-c" in cmd.argv[1:-1]:
        return [cmd.argv[cmd.argv.index("-c") + 1]]
    return []


def walk_script(script: str, depth: int = 0) -> Optional[list[tuple[SimpleCommand, dict[str, str]]]]:
    """Every simple command with the literal variables known at that point (nested `sh -c` included)."""
    commands = parse_script(script)
    if commands is None:
        return None
    env: dict[str, str] = {}
    out = []
    for cmd in commands:
        for key, value in _assignments(cmd):
            expanded = expand(value, env)
            if expanded is None:
                env.pop(key, None)
            else:
                env[key] = expanded
        out.append((cmd, dict(env)))
        if depth < 3:
            for inner in _inner_scripts(cmd):
                nested = walk_script(inner, depth + 1)
                if nested is None:
                    return None
                out += nested
    return out


def overlaps(path: str, protected: str) -> Optional[str]:
    """How deleting `path` affects `protected`: "is", "contains", "inside", or None."""
    p = posixpath.normpath(path)
    if any(c in p for c in "*?["):
        head = re.split(r"[*?\[]", p, 1)[0]
        ancestors = [protected]
        d = protected
        while d not in ("/", ""):
            d = posixpath.dirname(d)
            ancestors.append(d)
        if any(fnmatch.fnmatchcase(a, p) for a in ancestors) or protected.startswith(head):
            return "contains"
        if head.startswith(protected.rstrip("/") + "/"):
            return "inside"
        return None
    if p == protected:
        return "is"
    if protected.startswith(p.rstrip("/") + "/"):
        return "contains"
    if p.startswith(protected.rstrip("/") + "/"):
        return "inside"
    return None
