"""pdkit's Ansible playbooks and roles, shipped as the package data of ``kit.playbooks``.

This file only makes the folder a Python package, so that ``importlib.resources`` finds it in
an editable install too (pyproject.toml maps ``kit.playbooks`` to this folder).
"""
