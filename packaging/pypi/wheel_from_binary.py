"""Packs an already-built ``leasehold`` binary into the wheel that maturin's
``bindings = "bin"`` builds from packaging/pypi/pyproject.toml, so CI tests
the wheel without compiling the server a second time::

    python packaging/pypi/wheel_from_binary.py BINARY OUTDIR [--no-strip]

prints the wheel's path. The layout is maturin's: the binary as
``<name>-<v>.data/scripts/leasehold`` (mode 755, which pip puts in the
venv's ``bin``) and ``<name>-<v>.dist-info/{METADATA,WHEEL,RECORD}``. The
metadata comes from pyproject.toml (one source; a ``[project]`` key this
script does not render is refused rather than dropped). The platform tag
is ``manylinux_2_X_<arch>`` for the highest ``GLIBC_2.X`` symbol version
the binary needs (read from its ELF version-needs section), or
``linux_<arch>`` for a binary that needs no glibc. Unlike maturin it reads
only the glibc versions (no auditwheel check of the other libraries) and
adds no SBOM (maturin's ``dist-info/sboms/``). The binary is stripped
(``strip``, on a copy) unless ``--no-strip``, as ``strip = true`` has
maturin do. Needs Python 3.11+ (tomllib).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import shutil
import struct
import subprocess
import tempfile
import tomllib
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYPROJECT = HERE / "pyproject.toml"
SCRIPT = "leasehold"
GENERATOR = "leasehold wheel_from_binary.py"
# [project] keys rendered into METADATA, in maturin's order of fields.
RENDERED = ("name", "version", "description", "license", "requires-python")
# Aliases maturin adds to a manylinux_2_X tag (PEP 600's legacy names).
LEGACY = {(2, 5): "manylinux1", (2, 12): "manylinux2010", (2, 17): "manylinux2014"}
MACHINES = {62: "x86_64", 183: "aarch64"}
SHT_GNU_VERNEED = 0x6FFFFFFE


def glibc_needs(elf: bytes) -> tuple[str, tuple[int, int] | None]:
    """The ELF's architecture and the highest ``GLIBC_x.y`` it needs (None: no glibc)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise SystemExit("wheel_from_binary.py: not a 64-bit little-endian ELF binary")
    (machine,) = struct.unpack_from("<H", elf, 18)
    if machine not in MACHINES:
        raise SystemExit(f"wheel_from_binary.py: ELF machine {machine} has no wheel tag here")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    best: tuple[int, int] | None = None
    for _name, kind, _flags, _addr, offset, _size, link, info, _align, _entsize in sections:
        if kind != SHT_GNU_VERNEED:
            continue
        strtab = sections[link][4]
        entry = offset
        for _ in range(info):  # Verneed entries
            _version, count, _file, aux, following = struct.unpack_from("<HHIII", elf, entry)
            at = entry + aux
            for _ in range(count):  # Vernaux entries
                _hash, _vflags, _other, name_at, step = struct.unpack_from("<IHHII", elf, at)
                end = elf.index(b"\0", strtab + name_at)
                found = re.fullmatch(rb"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", elf[strtab + name_at : end])
                if found:
                    version = (int(found[1]), int(found[2]))
                    best = version if best is None else max(best, version)
                at += step
            entry += following
    return MACHINES[machine], best


def platform_tags(arch: str, glibc: tuple[int, int] | None) -> list[str]:
    if glibc is None:
        return [f"linux_{arch}"]
    tags = [f"manylinux_{glibc[0]}_{glibc[1]}_{arch}"]
    if glibc in LEGACY:
        tags.append(f"{LEGACY[glibc]}_{arch}")
    return tags


def metadata(project: dict[str, object]) -> str:
    unknown = sorted(set(project) - set(RENDERED))
    if unknown:
        raise SystemExit(
            f"wheel_from_binary.py: pyproject.toml [project] has {', '.join(unknown)}, which "
            "this script does not render: teach it (test.sh compares with maturin's output)"
        )
    license_ = project.get("license")
    if license_ is not None and not isinstance(license_, str):
        raise SystemExit("wheel_from_binary.py: [project].license must be an SPDX expression")
    lines = ["Metadata-Version: 2.4", f"Name: {project['name']}", f"Version: {project['version']}"]
    if "description" in project:
        lines.append(f"Summary: {project['description']}")
    if license_ is not None:
        lines.append(f"License-Expression: {license_}")
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    return "\n".join(lines) + "\n"


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}\n"


def build(binary: Path, out: Path, strip: bool) -> Path:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    with tempfile.TemporaryDirectory() as stage:
        staged = Path(stage) / SCRIPT
        if strip:
            subprocess.run(["strip", "-o", str(staged), str(binary)], check=True)
        else:
            shutil.copyfile(binary, staged)
        program = staged.read_bytes()
    arch, glibc = glibc_needs(program)
    tags = platform_tags(arch, glibc)
    dist = re.sub(r"[-_.]+", "_", str(project["name"])).lower()
    version = str(project["version"])
    info = f"{dist}-{version}.dist-info"
    wheel_text = f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: false\n"
    wheel_text += "".join(f"Tag: py3-none-{tag}\n" for tag in tags)
    files = [
        (f"{dist}-{version}.data/scripts/{SCRIPT}", program, 0o755),
        (f"{info}/METADATA", metadata(project).encode(), 0o644),
        (f"{info}/WHEEL", wheel_text.encode(), 0o644),
    ]
    record = "".join(record_line(path, data) for path, data, _ in files) + f"{info}/RECORD,,\n"
    files.append((f"{info}/RECORD", record.encode(), 0o644))
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{dist}-{version}-py3-none-{'.'.join(tags)}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data, mode in files:
            entry = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            entry.external_attr = (0o100000 | mode) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary", type=Path, help="the built leasehold binary")
    parser.add_argument("outdir", type=Path, help="where to write the wheel")
    parser.add_argument("--no-strip", action="store_true", help="keep the symbols")
    args = parser.parse_args()
    if not args.binary.is_file():
        parser.error(f"{args.binary} is not a file")
    print(build(args.binary, args.outdir, strip=not args.no_strip))


if __name__ == "__main__":
    main()
