"""The pdkit_process role's file module (library/pdkit_files.py), run as Ansible runs it (a
script given its arguments as JSON): which files it says changed, and which it created, so
that the role hands pdkit's router over when its service definition changed but starts it when
that definition is new."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

MODULE = REPO / "playbooks" / "roles" / "pdkit_process" / "library" / "pdkit_files.py"


def _run(tmp_path, content: str) -> dict:
    target = tmp_path / "router.conf"
    spec = {"path": str(target), "content": content, "mode": "0600", "process": "router"}
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"files": [spec]}}))
    done = subprocess.run(
        [sys.executable, str(MODULE), str(args)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def test_a_new_file_is_created_and_a_changed_one_only_changed(tmp_path):
    first = _run(tmp_path, "[program:router]\n")
    assert first["created_paths"] == first["changed_paths"] == [str(tmp_path / "router.conf")]
    assert first["changed_processes"] == ["router"]
    changed = _run(tmp_path, "[program:router]\nstartsecs=2\n")
    assert changed["changed_paths"] == [str(tmp_path / "router.conf")]
    assert changed["created_paths"] == []
    same = _run(tmp_path, "[program:router]\nstartsecs=2\n")
    assert not same["changed"] and same["changed_paths"] == same["created_paths"] == []
