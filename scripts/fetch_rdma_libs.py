"""The RDMA user-space libraries Mooncake's transfer engine links against, for a machine without them.

SGLang's PD disaggregation moves KV between a prefill and a decode server with Mooncake. The registry's CPU build
(``mooncake-transfer-engine-non-cuda``) runs its TCP transport (``--disaggregation-transfer-backend mooncake_tcp``)
without an RDMA device, but its ``engine.so`` still links ``libibverbs.so.1`` (and through it libnl). Where the
system has none, this script fetches Debian's packages (pinned, checked by SHA-256) and unpacks their shared
libraries into one folder, which the PD servers get in ``LD_LIBRARY_PATH``. Nothing is installed system-wide.

    python scripts/fetch_rdma_libs.py DEST     # prints DEST; does nothing when DEST already holds them
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import io
import os
import sys
import tarfile
import urllib.request
from pathlib import Path

POOL = "https://deb.debian.org/debian/pool/main"
PACKAGES = {  # Debian 12 (bookworm), amd64
    f"{POOL}/r/rdma-core/libibverbs1_44.0-2_amd64.deb":
        "35054815259fee46173240254246d03b673a5cd5c528aaac96fd15ac428a8d59",
    f"{POOL}/libn/libnl3/libnl-3-200_3.7.0-0.2+b1_amd64.deb":
        "d1fc3e9eb8e79b4c96b0a64c3d8c9e068ae2f665cab71bd19f417ffd0453a890",
    f"{POOL}/libn/libnl3/libnl-route-3-200_3.7.0-0.2+b1_amd64.deb":
        "0fdcc425ae2982788c085c76a7cb0eda3e3db99d41bd1ce56082ee18e9f1e21f",
}  # fmt: skip
LIBRARY = "libibverbs.so.1"


def ar_members(data: bytes) -> dict[str, bytes]:
    """The members of an ``ar`` archive (a .deb is one)."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    members, offset = {}, 8
    while offset + 60 <= len(data):
        header = data[offset : offset + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = data[offset + 60 : offset + 60 + size]
        offset += 60 + size + (size % 2)
    return members


def shared_libraries(deb: bytes) -> dict[str, bytes]:
    """``{file name: bytes}`` of the ``.so`` files a .deb installs (symbolic links resolved to their target)."""
    data = next(v for k, v in ar_members(deb).items() if k.startswith("data.tar"))
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {os.path.normpath(m.name): m for m in tar.getmembers()}
        for member in members.values():
            name = Path(member.name).name
            if ".so" not in name:
                continue
            target = member
            while target.issym():
                target = members[os.path.normpath(Path(target.name).parent / target.linkname)]
            if target.isfile():
                out[name] = tar.extractfile(target).read()
    return out


def system_has_library() -> bool:
    try:
        ctypes.CDLL(LIBRARY)
        return True
    except OSError:
        return False


def fetch(dest: Path) -> Path:
    if (dest / LIBRARY).is_file():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    for url, sha256 in PACKAGES.items():
        with urllib.request.urlopen(url, timeout=60) as response:
            deb = response.read()
        digest = hashlib.sha256(deb).hexdigest()
        if digest != sha256:
            raise SystemExit(f"{url}: SHA-256 {digest}, expected {sha256}: not the pinned package")
        for name, blob in shared_libraries(deb).items():
            (dest / name).write_bytes(blob)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="folder for the libraries (made if missing)")
    parser.add_argument("--even-if-installed", action="store_true", help="fetch them even when the system has them")
    args = parser.parse_args(argv)
    if system_has_library() and not args.even_if_installed:
        args.dest.mkdir(parents=True, exist_ok=True)
        print(f"{LIBRARY} is installed: nothing to fetch", file=sys.stderr)
    else:
        fetch(args.dest)
    print(args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
