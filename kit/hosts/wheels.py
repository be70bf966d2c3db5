"""Wheels for the hosts, made from the control machine's own Python environment.

`pdkit provision` pushes pdkit itself as a wheel to every host, so that the hosts run exactly
the control machine's pdkit; with `--wheelhouse` it pushes every other package too (hosts with
no package index). Both come from what is installed here, without an index or a build backend:
an installed distribution is packed back into a wheel from its RECORD (an editable pdkit from
its source tree). The hosts must then run the same Python version on the same platform as the
control machine; for other hosts build the wheelhouse with `pip download` (docs/provisioning.md).

Wheels are reproducible: same files, same bytes (fixed timestamps, sorted entries), so the
copy to a host reports no change when nothing changed.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import tarfile
import zipfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path, PurePosixPath

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kit.errors import DeployError

PDKIT_DISTRIBUTION = "sglang-pdkit"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_SKIP_IN_DIST_INFO = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def _distribution(name: str) -> metadata.Distribution:
    """The installed distribution `name`: one installed from a wheel (a dist-info with a WHEEL
    file), not a stray *.egg-info a source checkout on sys.path may hold."""
    for dist in metadata.distributions(name=name):
        if dist.read_text("WHEEL") is not None:
            return dist
    raise DeployError(
        f"{name} is not installed on the control machine, so it cannot go into the "
        f"wheelhouse. To fix: pip install {name}, or build the wheelhouse with pip download."
    )


def requirement_closure(requirements: Iterable[str]) -> list[metadata.Distribution]:
    """The installed distributions that `requirements` need, with their dependencies (markers
    evaluated for this interpreter), each once, in name order."""
    found: dict[str, metadata.Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in requirements]
    base_env = {k: str(v) for k, v in default_environment().items()}
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        dist = found.get(key[0]) or _distribution(req.name)
        found[key[0]] = dist
        for text in dist.requires or []:
            sub = Requirement(text)
            extras = req.extras or {""}
            if sub.marker is None or any(
                sub.marker.evaluate({**base_env, "extra": extra}) for extra in extras
            ):
                todo.append(sub)
    return [found[name] for name in sorted(found)]


def _editable_source(dist: metadata.Distribution) -> Path | None:
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    info = json.loads(text)
    if not info.get("dir_info", {}).get("editable"):
        return None
    url = str(info.get("url", ""))
    return Path(url.removeprefix("file://")) if url.startswith("file://") else None


def _dist_info_name(dist: metadata.Distribution) -> str:
    """The dist-info folder as installed (its spelling varies between installers)."""
    for entry in dist.files or []:
        if entry.name == "METADATA" and entry.parent.name.endswith(".dist-info"):
            return entry.parent.as_posix()
    return f"{wheel_name(dist.metadata['Name'])}-{dist.version}.dist-info"


def wheel_name(name: str) -> str:
    """A distribution name as spelled in wheel file names (sglang-pdkit -> sglang_pdkit)."""
    return re.sub(r"[-_.]+", "_", name)


def _tags(wheel_text: str) -> str:
    """'Tag:' lines of a WHEEL file -> the compressed tag of a wheel file name."""
    parts: list[list[str]] = [[], [], []]
    for line in wheel_text.splitlines():
        if line.startswith("Tag:"):
            for index, value in enumerate(line.split(":", 1)[1].strip().split("-")):
                if value not in parts[index]:
                    parts[index].append(value)
    if not parts[0]:
        return "py3-none-any"
    return "-".join(".".join(p) for p in parts)


def _payload(dist: metadata.Distribution) -> list[tuple[str, Path]]:
    """(path in the wheel, file on disk) of everything but the installer's bookkeeping."""
    dist_info = _dist_info_name(dist)
    out: list[tuple[str, Path]] = []
    source = _editable_source(dist)
    if source is not None:
        # An editable install holds no package files: take them from the source tree.
        for top in (dist.read_text("top_level.txt") or "").split():
            for file in sorted((source / top).rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts and file.suffix != ".pyc":
                    out.append((file.relative_to(source).as_posix(), file))
    for entry in dist.files or []:
        posix = entry.as_posix()
        if posix.startswith(f"{dist_info}/"):
            if entry.name not in _SKIP_IN_DIST_INFO:
                out.append((posix, Path(str(entry.locate()))))
        elif source is None and not (
            # console scripts are written anew by pip from entry_points.txt
            posix.startswith("../") or "__pycache__" in entry.parts or posix.endswith(".pyc")
        ):
            out.append((posix, Path(str(entry.locate()))))
    return sorted(out)


def wheel_from_installed(dist: metadata.Distribution, out_dir: Path) -> Path:
    """Pack an installed distribution back into a wheel in `out_dir`; returns its path."""
    dist_info = _dist_info_name(dist)
    wheel_text = dist.read_text("WHEEL") or ""
    tags = "py3-none-any" if _editable_source(dist) else _tags(wheel_text)
    name = f"{wheel_name(dist.metadata['Name'])}-{dist.version}-{tags}.whl"
    target = out_dir / name
    buffer = io.BytesIO()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for arcname, path in _payload(dist):
            if PurePosixPath(arcname).name == "WHEEL" and arcname.startswith(dist_info):
                data = _wheel_file(wheel_text, tags).encode()
            else:
                data = path.read_bytes()
            _add(archive, arcname, data, path.stat().st_mode)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            writer.writerow([arcname, f"sha256={digest.decode()}", len(data)])
        writer.writerow([f"{dist_info}/RECORD", "", ""])
        _add(archive, f"{dist_info}/RECORD", record.getvalue().encode(), 0o644)
    data = buffer.getvalue()
    if not (target.exists() and target.read_bytes() == data):
        out_dir.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return target


def _wheel_file(original: str, tags: str) -> str:
    if original:
        return original
    # An editable install's WHEEL describes the editable shim; pdkit is pure Python.
    return "Wheel-Version: 1.0\nGenerator: pdkit\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _add(archive: zipfile.ZipFile, arcname: str, data: bytes, mode: int) -> None:
    info = zipfile.ZipInfo(arcname, date_time=_ZIP_TIME)
    info.external_attr = ((mode & 0o777) | 0o100000) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data, compresslevel=1)


def pdkit_wheel(out_dir: Path) -> Path:
    """pdkit itself as a wheel (from the source tree when installed editable)."""
    return wheel_from_installed(_distribution(PDKIT_DISTRIBUTION), out_dir)


def build_wheelhouse(requirements: Iterable[str], out_dir: Path) -> list[Path]:
    """Wheels of every installed distribution `requirements` need (pdkit too, when asked for).
    Existing identical wheels are kept."""
    return [wheel_from_installed(dist, out_dir) for dist in requirement_closure(requirements)]


def pack_wheelhouse(folder: Path, archive: Path) -> Path:
    """The wheels in `folder` as one tar archive (what the pdkit_python role pushes): sorted,
    fixed owner and time, so the same wheels give the same bytes."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise DeployError(
            f"{folder} holds no wheels (*.whl). To fix: build the wheelhouse first "
            "(docs/provisioning.md: air-gapped hosts), or use --index."
        )
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".partial")
    with tarfile.open(partial, "w", format=tarfile.GNU_FORMAT) as tar:
        for wheel in wheels:
            info = tarfile.TarInfo(wheel.name)
            info.size = wheel.stat().st_size
            info.mode = 0o644
            with wheel.open("rb") as handle:
                tar.addfile(info, handle)
    if archive.exists() and archive.read_bytes() == partial.read_bytes():
        partial.unlink()
    else:
        partial.replace(archive)
    return archive
