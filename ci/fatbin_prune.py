"""Zero the device code a given GPU architecture can never load, in place, in ELF shared libraries.

CUDA libraries carry one cubin per architecture they were built for (vLLM 0.26's
``_C_stable_libtorch.abi3.so``: sm_75 to sm_120, 421 cubins, 56 MB of its 84 MB bundle after xz)
plus PTX. On an sm_90 GPU the driver loads an sm_90 / sm_90a cubin, or JIT-compiles PTX of
compute capability <= 9.0; cubins of any other major architecture and newer PTX are never read.
This tool overwrites those payloads with zeros (a zstd-compressed one with a zstd frame of as
many zeros as it held, its entry's compressed size set to match) and leaves every other byte as it was
(ELF layout, containers, entry kinds, architectures, padded sizes, offsets), so the library loads
and registers its kernels exactly as before, the kept images are byte-identical, and the zeros
cost nothing once the bundle is compressed. A library whose fatbin does not parse is refused, not touched.

    python ci/fatbin_prune.py --keep-arch 90 SITE/vllm/*.so ...   # prints one JSON line per file

Fatbin layout read here (the ``.nv_fatbin`` section, a sequence of containers, 8-byte aligned):
container header = u32 magic 0xBA55ED50, u16 version, u16 header size, u64 size of its entries;
entry header = u16 kind (1 PTX, 2 ELF cubin), u16, u32 header size, u64 payload size (padded),
u32 compressed size, u32, u16 minor, u16 major, u32 architecture (90 for sm_90 and sm_90a), u32,
u32, u64 flags, u64, u64 decompressed size; the payload follows the entry header. One container is one compiled module (translation unit).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from pathlib import Path

MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2
SECTION = b".nv_fatbin"
FLAG_ZSTD = 0x8000  # entry flags: the payload is one zstd frame
_ZSTD_BLOCK = 128 << 10  # the largest zstd block


def zstd_zeros(n: int) -> bytes:
    """One zstd frame whose content is ``n`` zero bytes (content size in the header, RLE blocks):
    what a pruned zstd entry holds, so that its header's sizes stay true and tools that decompress
    every image (cuobjdump) still read the file."""
    out = bytearray(b"\x28\xb5\x2f\xfd\xe0") + struct.pack("<Q", n)  # magic; single segment, 8-byte size
    left = n
    while True:
        size = min(left, _ZSTD_BLOCK)
        left -= size
        out += (1 << 1 | size << 3 | (left == 0)).to_bytes(3, "little") + b"\0"  # RLE block of zeros
        if left == 0:
            return bytes(out)


class FatbinError(ValueError):
    pass


def _section(data: bytes | bytearray, name: bytes) -> tuple[int, int] | None:
    """(file offset, size) of the ELF64 little-endian section ``name``, or None if absent."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise FatbinError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shnum == 0:
        return None
    str_off, = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 24)
    for i in range(shnum):
        base = shoff + i * shentsize
        name_idx, = struct.unpack_from("<I", data, base)
        end = data.index(b"\0", str_off + name_idx)
        if bytes(data[str_off + name_idx:end]) == name:
            off, size = struct.unpack_from("<QQ", data, base + 24)
            return off, size
    return None


def entries(data: bytes | bytearray, off: int, size: int):
    """Every fatbin entry in data[off:off+size]: dicts with kind, arch, payload offset and size."""
    pos, end, out = off, off + size, []
    while pos < end:
        if struct.unpack_from("<I", data, pos)[0] != MAGIC:
            if any(data[pos:min(pos + 8, end)]):
                raise FatbinError(f"no fatbin magic at offset {pos:#x}")
            pos += 8  # alignment padding between containers
            continue
        _, _, hsize, fat_size = struct.unpack_from("<IHHQ", data, pos)
        e, c_end = pos + hsize, pos + hsize + fat_size
        if c_end > end:
            raise FatbinError(f"container at {pos:#x} runs past its section")
        while e < c_end:
            kind, _, ehsize, psize = struct.unpack_from("<HHIQ", data, e)
            arch, = struct.unpack_from("<I", data, e + 28)
            if ehsize < 64 or e + ehsize + psize > c_end:
                raise FatbinError(f"entry at {e:#x}: header {ehsize} / payload {psize} outside its container")
            out.append({"kind": kind, "arch": arch, "header": e, "payload": e + ehsize, "bytes": psize,
                        "container": pos})
            e += ehsize + psize
        pos = c_end
    return out


def unusable(entry: dict, keep_arch: int, has_cubin: bool) -> bool:
    """True for what a GPU of ``keep_arch`` (e.g. 90) never loads: a cubin of another architecture
    (a cubin runs only on its own major architecture, from its minor up, and sm_90 is the only
    member of its major), PTX newer than it, and any PTX of a container (one compiled module)
    that holds a cubin for ``keep_arch`` (``has_cubin``: the driver loads a compatible cubin
    before it would JIT-compile PTX). Anything else (unknown kinds) is kept."""
    if entry["kind"] == KIND_ELF:
        return entry["arch"] != keep_arch
    if entry["kind"] == KIND_PTX:
        return entry["arch"] > keep_arch or has_cubin
    return False


def prune(data: bytearray, keep_arch: int) -> dict:
    """Zero the unusable payloads of ``data`` (a whole ELF file) in place; returns counts and the
    sha256 of the kept payloads before and after (equal, or this raises)."""
    sec = _section(data, SECTION)
    if sec is None:
        return {"entries": 0, "zeroed": 0, "zeroed_bytes": 0}
    ents = entries(data, *sec)
    with_cubin = {e["container"] for e in ents if e["kind"] == KIND_ELF and e["arch"] == keep_arch}
    drop = [unusable(e, keep_arch, e["container"] in with_cubin) for e in ents]
    kept = [e for e, d in zip(ents, drop) if not d]
    zeroed = [e for e, d in zip(ents, drop) if d]

    def kept_hash() -> str:
        h = hashlib.sha256()
        for e in kept:
            h.update(data[e["payload"]:e["payload"] + e["bytes"]])
        return h.hexdigest()

    before = kept_hash()
    for e in zeroed:
        data[e["payload"]:e["payload"] + e["bytes"]] = bytes(e["bytes"])
        flags, = struct.unpack_from("<Q", data, e["header"] + 40)
        full, = struct.unpack_from("<Q", data, e["header"] + 56)
        frame = zstd_zeros(full)
        if flags & FLAG_ZSTD and len(frame) <= e["bytes"]:
            data[e["payload"]:e["payload"] + len(frame)] = frame
            struct.pack_into("<I", data, e["header"] + 16, len(frame))  # compressed size
    if entries(data, *sec) != ents or kept_hash() != before:
        raise FatbinError("pruning changed the fatbin's structure or a kept image")
    return {"entries": len(ents), "kept": len(kept), "zeroed": len(zeroed),
            "zeroed_bytes": sum(e["bytes"] for e in zeroed), "kept_sha256": before,
            "kept_archs": sorted({(e["kind"], e["arch"]) for e in kept})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep-arch", type=int, required=True, help="compute capability x 10, e.g. 90")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    for f in a.files:
        data = bytearray(Path(f).read_bytes())
        try:
            rec = prune(data, a.keep_arch)
        except FatbinError as e:
            print(f"fatbin_prune: {f}: {e}", file=sys.stderr)
            return 1
        if rec["zeroed"]:
            Path(f).write_bytes(data)
        print(json.dumps({"file": f, **rec}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
