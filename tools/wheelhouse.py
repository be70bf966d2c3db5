"""Build a wheelhouse for hosts without a package index (`pdkit provision --wheelhouse DIR`).

    python -m tools.wheelhouse --out wheelhouse --engine sglang
    python -m tools.wheelhouse --out wheelhouse --engine sglang --resolve-only
    python -m tools.wheelhouse --out wheelhouse --engine sim --from-installed

Default: `pip download` (on this control machine, which reaches the index) of every package the
hosts' venv needs, as binary wheels for the hosts' Python and platform (`--python-version`,
default 3.11; `--platform`, repeatable, default every x86_64 tag a host of glibc `--glibc`
(default 2.34) installs), plus pdkit itself as a wheel of this checkout. pip takes the
`--platform` tags literally (manylinux_2_34 does not bring the older tags with it), so the
default lists them all, manylinux_2_34 down to manylinux1 as pip on such a host would:
SGLang 0.5.23 itself is one `cp311-cp311-manylinux_2_34_x86_64` wheel, PyPI's sglang-kernel
0.4.10 only `manylinux2014`, PyYAML `manylinux_2_17`; one tag alone resolves nothing.
`--resolve-only`: pip's resolver with the real metadata and no download (`pip install --dry-run
--report`); prints the resolved set.
`--from-installed`: no index at all; the wheels are packed from this environment
(kit.hosts.wheels), so the hosts must run this Python on this platform (engine sim, tests).

What the venv needs, per engine (the pdkit_python role installs the same list):
  sglang: sglang==<version>, the Mooncake build for the CUDA of the torch SGLang pins (13 for
          SGLang 0.5.23's torch 2.14.1: mooncake-transfer-engine-cuda13), pdkit, supervisor;
  sim:    pdkit with the non-CUDA Mooncake build (pdkit[sim]), supervisor.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from packaging.requirements import Requirement

from kit.hosts.wheels import (
    PDKIT_DISTRIBUTION,
    build_wheelhouse,
    pack_wheelhouse,
    pdkit_wheel,
    requirement_closure,
)

REPO = Path(__file__).resolve().parent.parent
PYTHON_DEFAULTS = REPO / "playbooks/roles/pdkit_python/defaults/main.yml"
TORCH_CUDA = 13
"""CUDA major version of the torch SGLang 0.5.23 pins (torch 2.14.1, cuda-toolkit 13.0)."""
PYTHON_VERSION = "3.11"
"""The hosts' Python (SGLang 0.5.23 needs 3.11+; the python role installs 3.11 where older)."""
GLIBC = "2.34"
"""The hosts' glibc floor: SGLang 0.5.23's only wheel is manylinux_2_34 (Ubuntu 22.04: 2.35)."""
LEGACY = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
"""The old manylinux names and the glibc 2.X they stand for (PEP 600)."""


def platforms(glibc: str, arch: str = "x86_64") -> list[str]:
    """Every platform tag pip accepts on a host of this glibc, newest first (as pip orders its
    own: manylinux_2_Y for Y from the glibc's minor down to 5, the legacy names at theirs)."""
    major, minor = (int(p) for p in glibc.split(".")[:2])
    if major != 2 or minor < 5:
        raise SystemExit(f"--glibc {glibc}: manylinux needs glibc 2.5 or newer")
    out = []
    for y in range(minor, 4, -1):
        out.append(f"manylinux_2_{y}_{arch}")
        out += [f"{name}_{arch}" for name, at in LEGACY.items() if at == y]
    return out


def role_defaults() -> dict:
    return yaml.safe_load(PYTHON_DEFAULTS.read_text())


def host_requirements(engine: str, cuda: int, sglang_version: str) -> list[str]:
    """The requirements of a host's venv besides pdkit itself."""
    defaults = role_defaults()
    mooncake = defaults["pdkit_python_mooncake_version"]
    supervisor = defaults["pdkit_python_supervisor_requirement"]
    if engine == "sim":
        return [f"mooncake-transfer-engine-non-cuda=={mooncake}", supervisor]
    package = "mooncake-transfer-engine-cuda13" if cuda >= 13 else "mooncake-transfer-engine"
    return [f"sglang=={sglang_version}", f"{package}=={mooncake}", supervisor]


def pdkit_dependencies() -> list[str]:
    """pdkit's own runtime requirements (its metadata, no extras)."""
    pdkit = next(
        d for d in requirement_closure([PDKIT_DISTRIBUTION]) if d.name == PDKIT_DISTRIBUTION
    )
    out = []
    for text in pdkit.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(str(req))
    return out


def resolve(target: list[str], requirements: list[str]) -> list[tuple[str, str, str]]:
    """(name, version, file) of every package pip's resolver picks for `requirements` on the
    hosts' `target` (python version, platforms), from the index's metadata only; exits with
    pip's message when nothing fits."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet"]
        command += ["--ignore-installed", "--report", str(report), "--target", folder, *target]
        done = subprocess.run(
            [*command, *requirements], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            raise SystemExit("\n".join(errors) or done.stderr)
        installs = json.loads(report.read_text())["install"]
    return sorted(
        (
            i["metadata"]["name"],
            i["metadata"]["version"],
            i["download_info"]["url"].rsplit("/", 1)[-1],
        )
        for i in installs
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=Path("wheelhouse"), help="Folder for the wheels."
    )
    parser.add_argument("--engine", choices=["sglang", "sim"], default="sglang")
    parser.add_argument(
        "--cuda",
        type=int,
        default=TORCH_CUDA,
        help="CUDA major version of the torch SGLang pins, which picks the Mooncake build "
        f"(default {TORCH_CUDA}: SGLang 0.5.23's torch 2.14.1; not the driver's)",
    )
    parser.add_argument("--sglang-version", default=role_defaults()["pdkit_python_sglang_version"])
    parser.add_argument(
        "--python-version",
        default=PYTHON_VERSION,
        help=f"Hosts' Python (default {PYTHON_VERSION}).",
    )
    parser.add_argument(
        "--glibc",
        default=GLIBC,
        help=f"Hosts' glibc, which picks the platform tags (default {GLIBC}: SGLang 0.5.23's "
        "wheel is manylinux_2_34).",
    )
    parser.add_argument(
        "--platform",
        action="append",
        help="Hosts' platform tag, repeatable; replaces the tags --glibc gives.",
    )
    parser.add_argument(
        "--extra",
        action="append",
        default=[],
        help="More requirements (pdkit_python_extra_packages).",
    )
    parser.add_argument(
        "--no-deps",
        action="store_true",
        help="Only the packages named, not their dependencies (topping up a wheelhouse).",
    )
    parser.add_argument(
        "--resolve-only",
        action="store_true",
        help="Resolve with the index's metadata and print the set; download nothing.",
    )
    parser.add_argument(
        "--from-installed",
        action="store_true",
        help="Pack this environment's packages instead of downloading (no index needed).",
    )
    parser.add_argument("--tar", type=Path, help="Also write the wheels as one tar archive.")
    args = parser.parse_args(argv)
    requirements = [*host_requirements(args.engine, args.cuda, args.sglang_version), *args.extra]
    target = ["--only-binary=:all:", "--implementation", "cp"]
    target += ["--no-deps"] if args.no_deps else []
    target += ["--python-version", args.python_version]
    for platform in args.platform or platforms(args.glibc):
        target += ["--platform", platform]
    if args.resolve_only:
        resolved = resolve(target, [*pdkit_dependencies(), *requirements])
        for name, version, _ in resolved:
            print(f"{name}=={version}")
        tags = sorted(
            {
                tag
                for _, _, f in resolved
                for tag in f.removesuffix(".whl").rsplit("-")[-1].split(".")
            }
        )
        print(f"# {len(resolved)} packages; their wheels' platform tags: {' '.join(tags)}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_installed:
        wheels = build_wheelhouse([PDKIT_DISTRIBUTION, *requirements], args.out)
    else:
        command = [sys.executable, "-m", "pip", "download", "-d", str(args.out), *target]
        subprocess.run([*command, *pdkit_dependencies(), *requirements], check=True)
        wheels = [pdkit_wheel(args.out), *sorted(args.out.glob("*.whl"))]
    print(f"{len(set(wheels))} wheels in {args.out}")
    if args.tar:
        print(f"archive: {pack_wheelhouse(args.out, args.tar)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
