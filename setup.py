"""The package list, which pyproject.toml cannot state: kit's packages as found on disk, plus
kit.playbooks (pyproject.toml maps it to playbooks/). All other configuration is in pyproject."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["kit", "kit.*"]), "kit.playbooks"])
