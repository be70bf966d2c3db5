"""Where pdkit finds its playbooks: package data of kit.playbooks (the repository's playbooks/
folder, mapped in pyproject.toml), $PDKIT_PLAYBOOKS, or a copy when the package is zipped."""

from __future__ import annotations

import sys
import zipfile

import pytest

from kit.errors import DeployError
from kit.hosts.playbook import PLAYBOOKS_ENV, host_script, playbooks_dir
from kit.hosts.transfer_check import PROBE_ROLE
from tests.conftest import REPO


def test_the_playbooks_come_from_the_package_data_of_this_install(tmp_path, monkeypatch):
    monkeypatch.delenv(PLAYBOOKS_ENV, raising=False)
    found = playbooks_dir(tmp_path)
    # An editable install maps kit.playbooks to the repository's folder: nothing is copied.
    assert found.resolve() == (REPO / "playbooks").resolve()
    assert (found / "roles" / "pdkit_process" / "library" / "pdkit_files.py").is_file()
    assert not (tmp_path / "playbooks").exists()


def test_pdkit_playbooks_overrides_and_a_folder_without_deploy_yml_is_named(tmp_path, monkeypatch):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "deploy.yml").write_text("---\n")
    monkeypatch.setenv(PLAYBOOKS_ENV, str(tmp_path / "mine"))
    assert playbooks_dir(tmp_path) == tmp_path / "mine"

    monkeypatch.setenv(PLAYBOOKS_ENV, str(tmp_path))
    with pytest.raises(DeployError, match=f"{PLAYBOOKS_ENV}=.* has no deploy.yml. To fix"):
        playbooks_dir(tmp_path)


@pytest.mark.parametrize("probe", ["kvprobe.py", "poolprobe.py"])
def test_the_probes_sent_to_hosts_are_host_scripts_of_the_playbooks(probe, monkeypatch):
    monkeypatch.delenv(PLAYBOOKS_ENV, raising=False)
    shipped = REPO / "playbooks" / "roles" / PROBE_ROLE / "files" / probe
    assert host_script(PROBE_ROLE, probe) == shipped.read_text()
    compile(shipped.read_text(), probe, "exec")  # what the host's `python -` runs


def test_a_playbooks_folder_without_the_probe_names_the_script(tmp_path, monkeypatch):
    (tmp_path / "deploy.yml").write_text("---\n")
    monkeypatch.setenv(PLAYBOOKS_ENV, str(tmp_path))
    with pytest.raises(DeployError, match=r"roles/pdkit_check/files/kvprobe.py cannot be read"):
        host_script(PROBE_ROLE, "kvprobe.py")


def test_zipped_playbooks_are_copied_to_a_real_folder_replacing_an_older_copy(
    tmp_path, monkeypatch
):
    files = {
        "zipped_playbooks/__init__.py": b"",
        "zipped_playbooks/deploy.yml": b"---\n",
        "zipped_playbooks/roles/r/library/mod.py": b"print('module')\n",
        "zipped_playbooks/roles/r/templates/unit.j2": b"{{ x }}\n",
    }
    archive = tmp_path / "pdkit.zip"
    with zipfile.ZipFile(archive, "w") as out:
        for name, data in files.items():
            out.writestr(name, data)
    monkeypatch.syspath_prepend(str(archive))
    monkeypatch.setattr("kit.hosts.playbook.PLAYBOOKS_PACKAGE", "zipped_playbooks")
    monkeypatch.delenv(PLAYBOOKS_ENV, raising=False)
    scratch = tmp_path / "state"
    (scratch / "playbooks" / "roles" / "gone").mkdir(parents=True)
    try:
        found = playbooks_dir(scratch)
    finally:
        sys.modules.pop("zipped_playbooks", None)

    assert found == scratch / "playbooks"
    copied = {
        f"zipped_playbooks/{p.relative_to(found).as_posix()}": p.read_bytes()
        for p in found.rglob("*")
        if p.is_file()
    }
    assert copied == files
    assert not (found / "roles" / "gone").exists()


def test_a_missing_playbooks_package_says_how_to_reinstall(tmp_path, monkeypatch):
    monkeypatch.setattr("kit.hosts.playbook.PLAYBOOKS_PACKAGE", "kit.no_such_playbooks")
    monkeypatch.delenv(PLAYBOOKS_ENV, raising=False)
    with pytest.raises(DeployError, match=r"not installed with it\. To fix: reinstall pdkit"):
        playbooks_dir(tmp_path)
