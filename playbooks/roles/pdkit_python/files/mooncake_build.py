"""Print the Mooncake transfer engine package that matches the torch of this interpreter's
environment: the build must load the same CUDA runtime as torch (torch.version.cuda), which
is not the driver's (a 580 driver reports CUDA 13.0 and runs CUDA 12 builds as well).

Run with the venv's python after SGLang (and so torch) is installed; read-only. Prints one
line: mooncake-transfer-engine-cuda13 (CUDA 13 and later), mooncake-transfer-engine (CUDA 12),
or mooncake-transfer-engine-non-cuda (a CPU torch, or none). With the argument `nixl`: NIXL's
build for torch's CUDA instead, nixl-cu13 or nixl-cu12 (transfer.backend nixl).
"""

from __future__ import annotations

import sys


def package_for(cuda: str | None) -> str:
    """The Mooncake package for torch's CUDA version (`torch.version.cuda`, None for CPU)."""
    if not cuda:
        return "mooncake-transfer-engine-non-cuda"
    major = int(cuda.split(".")[0])
    if major >= 13:
        return "mooncake-transfer-engine-cuda13"
    if major == 12:
        return "mooncake-transfer-engine"
    raise SystemExit(f"torch is built for CUDA {cuda}: no Mooncake build for it (12 or 13 needed)")


def nixl_for(cuda: str | None) -> str:
    """NIXL's package for torch's CUDA version (NIXL has CUDA builds only)."""
    major = int(cuda.split(".")[0]) if cuda else 0
    if major not in (12, 13):
        raise SystemExit(f"torch is built for CUDA {cuda or 'none'}: NIXL has builds for 12 and 13")
    return f"nixl-cu{major}"


def main() -> int:
    try:
        import torch.version

        cuda = torch.version.cuda
    except ImportError:
        cuda = None
    print(nixl_for(cuda) if sys.argv[1:] == ["nixl"] else package_for(cuda))
    return 0


if __name__ == "__main__":
    sys.exit(main())
