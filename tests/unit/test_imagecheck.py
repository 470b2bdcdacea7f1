"""programs/imagecheck.py: every node's image IDs, read over ssh (a fake here), must agree."""

import json
import subprocess

from programs import imagecheck

NODES = [{"name": f"spark{i}", "target": f"zurih@10.0.0.{i}", "port": 22} for i in (1, 2, 3)]


def check(ids: dict[str, tuple[int, str]], capsys, refs=("img:1",)):
    calls = []

    def run(target, port, ssh_opts, remote):
        calls.append((target, port, tuple(ssh_opts), remote))
        return ids[target]

    spec = {"group": "tp3", "refs": list(refs), "nodes": NODES}
    code = imagecheck.main(["--spec", json.dumps(spec), "--ssh-opt=-o", "--ssh-opt=BatchMode=yes"], run=run)
    out = capsys.readouterr()
    return code, out.out, out.err, calls


def test_the_same_id_everywhere_prints_the_identity(capsys):
    same = (0, "img:1 sha256:aaa\n")
    code, out, _, calls = check({n["target"]: same for n in NODES}, capsys)
    assert code == 0 and out == "img:1=sha256:aaa\n"
    assert {c[0] for c in calls} == {n["target"] for n in NODES} and calls[0][2] == ("-o", "BatchMode=yes")


def test_a_node_with_another_id_is_refused_naming_nodes_and_ids(capsys):
    ids = {"zurih@10.0.0.1": (0, "img:1 sha256:aaa\n"), "zurih@10.0.0.2": (0, "img:1 sha256:bbb\n"),
           "zurih@10.0.0.3": (0, "img:1 sha256:aaa\n")}
    code, out, err, _ = check(ids, capsys)
    assert code == 1 and out == ""
    assert "image tp3: FAIL the group's nodes do not hold the same image: img:1 differs: sha256:aaa on spark1, " \
           "spark3; sha256:bbb on spark2. Fix:" in err
    assert "docker save IMAGE | ssh NODE docker load" in err and "nothing was stopped" in err


def test_a_node_without_the_image_or_unreachable_is_named(capsys):
    ids = {"zurih@10.0.0.1": (0, "img:1 sha256:aaa\n"), "zurih@10.0.0.2": (0, "img:1 missing\n"),
           "zurih@10.0.0.3": (0, "img:1 sha256:aaa\n")}
    code, _, err, _ = check(ids, capsys)
    assert code == 1 and "img:1 is missing on spark2" in err and "differs" not in err
    ids["zurih@10.0.0.2"] = (255, "ssh: connect to host 10.0.0.2 port 22: No route to host\n")
    code, _, err, _ = check(ids, capsys)
    assert code == 1 and "cannot read the image IDs on spark2 (ssh: connect to host 10.0.0.2 port 22: No route" in err


def test_the_node_command_prints_each_ref_and_its_id(tmp_path):
    """inspect_cmd under sh with a fake docker: one `ref id` line per ref, `missing` for an absent one."""
    (tmp_path / "docker").write_text('#!/bin/sh\n[ "$5" = present:1 ] && echo sha256:abc && exit 0\n'
                                     'echo "Error: No such image: $5" >&2; exit 1\n')
    (tmp_path / "docker").chmod(0o755)
    out = subprocess.run(["sh", "-c", imagecheck.inspect_cmd(["present:1", "gone:2"])], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=True).stdout  # fmt: skip
    assert imagecheck.parse(out) == {"present:1": "sha256:abc", "gone:2": "missing"}
