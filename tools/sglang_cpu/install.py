#!/usr/bin/env python3
"""Build a venv that runs the real SGLang 0.5.23 server on a CPU-only machine.

    python3 tools/sglang_cpu/install.py [--venv .venv-sglang-cpu] [--torch 2.13.0|2.14.1]

Run with any Python 3.11; it creates the venv, so it needs nothing but the standard library.
What it does, in order (each step fails loudly; the stamp file is written only at the end):

1. Debian packages the Mooncake transfer engine links (libibverbs1 librdmacm1 libnuma1):
   apt-get when root, else the command to run and exit 1.
2. torch (+ torchvision) of the chosen line, from a constraints file that every later pip call
   also gets, so nothing can pull another torch (timm -> torchvision -> CUDA torch otherwise).
3. sglang==0.5.23 with --no-deps, then its own Requires-Dist read from the installed metadata,
   minus CUDA_ONLY below (each with its reason), plus EXTRA (each with its reason).
4. The two source patches in patches/ (idempotent: skipped when already applied, an error
   when neither applied nor applicable) and the sgl_kernel stand-in in compat/ (a .pth file).
5. An import check, then <venv>/.stamp.

pip runs under `nice -n 19` (the machine is shared).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SGLANG_VERSION = "0.5.23"
MOONCAKE = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
APT_PACKAGES = ("libibverbs1", "librdmacm1", "libnuma1")

# torch line -> (constraints, patches applied on top of the common ones, extra requirements)
TORCH_CHOICES = {
    # The CPU wheel of torch 2.13.0 lies on this machine's disk (pip's find-links). PyPI has no
    # CPU torchvision for it: torchvision 0.28.0 is a CUDA build whose C++ ops cannot register
    # beside CPU torch, hence the torchvision patch. CPU torch does not depend on triton, which
    # SGLang imports at module level (sglang/kernels/ops/kvcache/cache_move.py:2), hence EXTRA.
    "2.13.0": (
        ["torch==2.13.0", "torchvision==0.28.0"],
        ["torchvision-0.28.0-skip-op-registrations.diff"],
        ["triton"],
    ),
    # SGLang 0.5.23's own pin (Requires-Dist torch==2.14.1). A CUDA build that runs on the CPU;
    # its torchvision 0.29.1 loads as it is, and it brings triton itself.
    "2.14.1": (["torch==2.14.1", "torchvision==0.29.1"], [], []),
}
COMMON_PATCHES = ["sglang-0.5.23-prefill-host-indices.diff"]

# SGLang's Requires-Dist entries left out, and why. All are GPU kernels/runtimes (or pull one)
# that the CPU engine (SGLANG_USE_CPU_ENGINE=1, --device cpu) never imports.
CUDA_ONLY = {
    "torch": "installed first, at the chosen line (step 2); SGLang's ==2.14.1 fights 2.13.0",
    "torchaudio": "torchaudio 2.11.0 pins torch 2.11 (a third torch); audio models only",
    "torchcodec": "video decoding for multimodal models; links FFmpeg and a matching torch",
    "sglang-kernel": "CUDA-only wheel; compat/sgl_kernel stands in for its CPU build",
    "cuda-python": "CUDA driver bindings",
    "flash-attn-4": "CUDA attention kernels",
    "flashinfer-python": "CUDA attention/sampling kernels (and a CUDA 13 toolkit via [cu13])",
    "humming-kernels": "CUDA kernels ([cu13])",
    "nvidia-cutlass-dsl": "CUDA kernel DSL ([cu13])",
    "nvidia-mathdx": "CUDA math library",
    "nvshmem4py-cu13": "CUDA NVSHMEM",
    "quack-kernels": "CUDA kernels",
    "sgl-deep-ep": "CUDA expert-parallel all-to-all",
    "sgl-deep-gemm": "CUDA FP8 GEMM",
    "sgl-flash-mla": "CUDA MLA attention",
    "tilelang": "GPU kernel compiler (bundles its own TVM and CUDA pieces)",
    "torch-memory-saver": "CUDA memory hooks (cudaMalloc interposer)",
}
# Not in SGLang's Requires-Dist but needed here, and why.
EXTRA = {
    MOONCAKE: "PD's KV transfer (--disaggregation-transfer-backend mooncake) over TCP, no CUDA",
}


def log(msg: str) -> None:
    print(f"[sglang-cpu] {msg}", flush=True)


def run(cmd: list[str], **kw) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kw)


def ensure_os_packages() -> None:
    if not shutil.which("dpkg-query"):
        log("not a Debian-like system: make sure libibverbs, librdmacm and libnuma are installed")
        return
    missing = [
        p
        for p in APT_PACKAGES
        if "install ok installed"
        not in subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", p], check=False, capture_output=True, text=True
        ).stdout
    ]
    if not missing:
        return
    if os.geteuid() != 0:
        sys.exit(
            f"[sglang-cpu] missing OS packages; run: sudo apt-get install -y {' '.join(missing)}"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env)


def pip(venv: Path, *args: str) -> None:
    run(["nice", "-n", "19", str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args])


def sglang_requirements(venv: Path) -> list[str]:
    """SGLang's Requires-Dist for this platform, CUDA_ONLY removed, EXTRA added."""
    probe = r"""
import json, re
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
out = []
for line in requires("sglang"):
    r = Requirement(line)
    if r.marker and not r.marker.evaluate({"extra": ""}):
        continue
    out.append([re.sub(r"[-_.]+", "-", r.name).lower(), line.split(";")[0].strip()])
print(json.dumps(out))
"""
    pairs = json.loads(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", probe], check=True, capture_output=True, text=True
        ).stdout
    )
    kept = [spec for name, spec in pairs if name not in CUDA_ONLY]
    unknown_skips = set(CUDA_ONLY) - {name for name, _ in pairs}
    if unknown_skips:  # SGLang's metadata changed under us: the lists above need a look
        sys.exit(
            f"[sglang-cpu] CUDA_ONLY names not in sglang's Requires-Dist: {sorted(unknown_skips)}"
        )
    return kept + list(EXTRA)


def apply_patch(site: Path, patch: Path) -> None:
    """Apply a -p1 patch against site-packages; a no-op when already applied, fatal otherwise."""
    base = ["patch", "-p1", "-d", str(site), "--batch", "--silent", "-i", str(patch)]
    if (
        subprocess.run(
            [*base, "--dry-run", "-R", "-f"], check=False, capture_output=True
        ).returncode
        == 0
    ):
        log(f"patch already applied: {patch.name}")
        return
    dry = subprocess.run([*base, "--dry-run", "-N"], check=False, capture_output=True, text=True)
    if dry.returncode != 0:
        sys.exit(f"[sglang-cpu] patch {patch.name} does not apply:\n{dry.stdout}{dry.stderr}")
    run([*base, "-N"])


def inputs_digest(torch: str) -> str:
    """sha256 of what decides the venv's content: this installer, its patches, the compat
    layer and the torch line (not smoke.py or cpu_profile.py, which only run in it). The stamp
    records it: an unchanged digest is a venv that is up to date, whatever the files' mtimes (a
    fresh clone reuses a venv cached outside it)."""
    digest = hashlib.sha256(torch.encode())
    inputs = [Path(__file__).resolve(), *(HERE / "patches").glob("*.diff")]
    inputs += (HERE / "compat").rglob("*.py")
    for path in sorted(inputs):
        if "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(HERE)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def up_to_date(venv: Path, digest: str) -> bool:
    try:
        stamp = json.loads((venv / ".stamp").read_text())
    except (OSError, ValueError):
        return False
    return bool(stamp.get("inputs") == digest and (venv / "bin" / "python").exists())


def verify(venv: Path, site: Path) -> None:
    compat = str(site / "sgl_kernel")
    check = f"""
import inspect
import torch, torchvision, torchvision.transforms, sglang, sgl_kernel, mooncake.engine
import sglang.srt.disaggregation.prefill as prefill
assert "kv_indices.is_cuda and" in inspect.getsource(prefill), "prefill patch missing"
assert sgl_kernel.__file__.startswith({compat!r}), sgl_kernel.__file__
print("ok: torch", torch.__version__, "torchvision", torchvision.__version__,
      "sglang", sglang.__version__)
"""
    run([str(venv / "bin" / "python"), "-c", check])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default=".venv-sglang-cpu", type=Path)
    ap.add_argument("--torch", default="2.13.0", choices=sorted(TORCH_CHOICES))
    ap.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter for the venv (3.11: SGLang's wheel is cp311)",
    )
    args = ap.parse_args()
    venv: Path = args.venv.resolve()
    digest = inputs_digest(args.torch)
    if up_to_date(venv, digest):
        log(f"up to date: {venv}")
        return
    stamp = venv / ".stamp"
    stamp.unlink(missing_ok=True)
    constraints, extra_patches, extra_reqs = TORCH_CHOICES[args.torch]
    t0 = time.monotonic()

    ensure_os_packages()
    cfile = venv / "constraints-sglang-cpu.txt"
    if cfile.exists() and cfile.read_text().split() != constraints:  # another torch line
        log(f"{venv} was built for {cfile.read_text().split()}; rebuilding it from nothing")
        shutil.rmtree(venv)
    if not (venv / "bin" / "python").exists():
        run([args.python, "-m", "venv", str(venv)])
    cfile.write_text("\n".join(constraints) + "\n")

    pip(venv, "-c", str(cfile), "torch", "torchvision")
    pip(venv, "--no-deps", f"sglang=={SGLANG_VERSION}")
    reqs = sglang_requirements(venv) + extra_reqs
    (venv / "requirements-sglang-cpu.txt").write_text("\n".join(reqs) + "\n")
    pip(venv, "-c", str(cfile), *reqs)

    site = Path(
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for name in COMMON_PATCHES + extra_patches:
        apply_patch(site, HERE / "patches" / name)
    # Copied in, not linked by a .pth: the venv may be cached outside this checkout and
    # outlive it (make keeps it under ~/.cache/pdkit).
    (site / "pdkit_sglang_cpu_compat.pth").unlink(missing_ok=True)
    shutil.rmtree(site / "sgl_kernel", ignore_errors=True)
    shutil.copytree(
        HERE / "compat" / "sgl_kernel",
        site / "sgl_kernel",
        ignore=shutil.ignore_patterns("__pycache__"),
    )

    verify(venv, site)
    stamp.write_text(
        json.dumps(
            {
                "sglang": SGLANG_VERSION,
                "torch": args.torch,
                "inputs": digest,
                "seconds": round(time.monotonic() - t0),
            }
        )
        + "\n"
    )
    log(f"done in {time.monotonic() - t0:.0f} s: {venv}")


if __name__ == "__main__":
    main()
