#!/usr/bin/python
# Copyright: pdkit contributors. Apache-2.0.
"""pdkit_files: many small files in one module run.

ansible.builtin.template costs two module runs per file (stat, then copy or file). A pdkit host
gets three files per process plus directories; on a small control machine that is most of the
time `pdkit up` takes. This module takes the rendered contents (templated on the controller with
lookup('ansible.builtin.template')) and ensures directories, files and modes in one run, and
says which processes' files changed, so handlers restart only those.
"""

import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: pdkit_files
short_description: Ensure directories and files with given contents in one run
description:
  - Ensures each directory exists with its mode, each file has exactly the given content and
    mode (written atomically), and removes files of a directory that are no longer wanted.
  - Reports the changed paths and the processes whose files changed.
  - File contents are not logged (they may hold secrets such as an API key).
options:
  directories:
    description: Directories to create (with parents) and their mode.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      mode: {description: Octal mode as a string, e.g. "0755"., type: str, required: true}
  files:
    description: Files and their wanted content.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path; its directory must exist or be listed., type: path, required: true}
      content: {description: The whole content., type: str, required: true, no_log: true}
      mode: {description: Octal mode as a string., type: str, required: true}
      process: {description: Process the file belongs to (reported when it changes)., type: str}
  prune:
    description:
      - Remove the files of a directory whose name matches pattern and whose first group is not in keep.
    type: list
    elements: dict
    default: []
    suboptions:
      directory: {description: Directory to clean., type: path, required: true}
      pattern: {description: 'Regular expression over file names; group 1 is the name, e.g. ^(.+)\.conf$.', type: str, required: true}
      keep: {description: Names to keep., type: list, elements: str, required: true}
author: pdkit
"""

EXAMPLES = r"""
- name: Ensure the process files are current
  pdkit_files:
    directories:
      - {path: /etc/pdkit/local, mode: "0700"}
    files:
      - {path: /etc/pdkit/local/decode-0.env, content: "A=1\n", mode: "0600", process: decode-0}
"""

RETURN = r"""
changed_paths:
  description: Files and directories created or changed.
  type: list
  elements: str
  returned: always
changed_processes:
  description: Processes (the files' process field) with a changed file, in first-seen order.
  type: list
  elements: str
  returned: always
created_paths:
  description: Files among changed_paths that did not exist before.
  type: list
  elements: str
  returned: always
removed_paths:
  description: Files removed by prune.
  type: list
  elements: str
  returned: always
"""


def _ensure_directory(module, path, mode, changed_paths):
    if not os.path.isdir(path):
        if not module.check_mode:
            os.makedirs(path)
        changed_paths.append(path)
        if module.check_mode:
            return
    if module.set_mode_if_different(path, mode, False) and path not in changed_paths:
        changed_paths.append(path)


def _ensure_file(module, path, content, mode):
    """True when the file was (or in check mode would be) written or its mode changed."""
    data = content.encode("utf-8")
    try:
        with open(path, "rb") as handle:
            same = handle.read() == data
    except FileNotFoundError:
        same = False
    if not same:
        if module.check_mode:
            return True
        directory = os.path.dirname(path)
        fd, temp = tempfile.mkstemp(dir=directory, prefix=".pdkit-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(temp, int(mode, 8))
            os.replace(temp, path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise
        return True
    return module.set_mode_if_different(path, mode, False)


def main():
    module = AnsibleModule(
        argument_spec={
            "directories": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "path": {"type": "path", "required": True},
                    "mode": {"type": "str", "required": True},
                },
            },
            "files": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "path": {"type": "path", "required": True},
                    "content": {"type": "str", "required": True, "no_log": True},
                    "mode": {"type": "str", "required": True},
                    "process": {"type": "str"},
                },
            },
            "prune": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "directory": {"type": "path", "required": True},
                    "pattern": {"type": "str", "required": True},
                    "keep": {"type": "list", "elements": "str", "required": True},
                },
            },
        },
        supports_check_mode=True,
    )
    changed_paths = []
    changed_processes = []
    created_paths = []
    removed_paths = []
    try:
        for directory in module.params["directories"]:
            _ensure_directory(module, directory["path"], directory["mode"], changed_paths)
        for spec in module.params["files"]:
            existed = os.path.exists(spec["path"])
            if _ensure_file(module, spec["path"], spec["content"], spec["mode"]):
                changed_paths.append(spec["path"])
                if not existed:
                    created_paths.append(spec["path"])
                process = spec.get("process")
                if process and process not in changed_processes:
                    changed_processes.append(process)
        for spec in module.params["prune"]:
            if not os.path.isdir(spec["directory"]):
                continue
            pattern = re.compile(spec["pattern"])
            for name in sorted(os.listdir(spec["directory"])):
                match = pattern.match(name)
                if match is None or match.group(1) in spec["keep"]:
                    continue
                path = os.path.join(spec["directory"], name)
                if not module.check_mode:
                    os.unlink(path)
                removed_paths.append(path)
    except OSError as exc:
        module.fail_json(msg="cannot write {}: {}".format(exc.filename, exc.strerror),
                         changed_paths=changed_paths)
    module.exit_json(
        changed=bool(changed_paths or removed_paths),
        changed_paths=changed_paths,
        changed_processes=changed_processes,
        created_paths=created_paths,
        removed_paths=removed_paths,
    )


if __name__ == "__main__":
    main()
