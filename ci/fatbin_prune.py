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
import os
import struct
import sys
from pathlib import Path

MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2
SECTION = b".nv_fatbin"
FLAG_ZSTD = 0x8000  # entry flags: the payload is one zstd frame
FLAG_LZ4 = 0x2000  # entry flags: LZ4-compressed (older toolkits): refused, a zeroed one would not decompress
_ZSTD_BLOCK = 128 << 10  # the largest zstd block


def zstd_zeros(n: int) -> bytes:
    """One zstd frame whose content is ``n`` zero bytes (RFC 8878: content size in the header, a
    128 KiB window, RLE blocks of at most 128 KiB): what a pruned zstd entry holds, so that its
    header's sizes stay true and tools that decompress every image still can."""
    # magic; descriptor 0xC0: 8-byte content size, not single-segment; window 2^(10+7) = 128 KiB
    out = bytearray(b"\x28\xb5\x2f\xfd\xc0\x38") + struct.pack("<Q", n)
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
    if shoff == 0:
        return None
    if shnum == 0 or shstrndx == 0xFFFF:
        raise FatbinError("extended ELF section numbering is not read here")
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
    """Every fatbin entry in data[off:off+size]: dicts with kind, arch, header and payload offsets,
    payload size and container offset. Containers start 8-byte aligned from the section start."""
    pos, end, out = off, off + size, []
    while pos < end:
        pos = off + (pos - off + 7) // 8 * 8  # padding after a container of odd size
        if pos + 16 > end:
            if any(data[pos:end]):
                raise FatbinError(f"stray bytes at the section end {pos:#x}")
            break
        if struct.unpack_from("<I", data, pos)[0] != MAGIC:
            if any(data[pos:pos + 8]):
                raise FatbinError(f"no fatbin magic at offset {pos:#x}")
            pos += 8  # alignment padding between containers
            continue
        _, _, hsize, fat_size = struct.unpack_from("<IHHQ", data, pos)
        e, c_end = pos + hsize, pos + hsize + fat_size
        if hsize < 16 or c_end > end:
            raise FatbinError(f"container at {pos:#x}: header {hsize} / entries {fat_size} outside its section")
        while e < c_end:
            if e + 64 > c_end:
                raise FatbinError(f"entry at {e:#x}: header runs past its container")
            kind, _, ehsize, psize = struct.unpack_from("<HHIQ", data, e)
            arch, = struct.unpack_from("<I", data, e + 28)
            flags, = struct.unpack_from("<Q", data, e + 40)
            if ehsize < 64 or e + ehsize + psize > c_end:
                raise FatbinError(f"entry at {e:#x}: header {ehsize} / payload {psize} outside its container")
            out.append({"kind": kind, "arch": arch, "flags": flags, "header": e, "payload": e + ehsize,
                        "bytes": psize, "container": pos})
            e += ehsize + psize
        pos = c_end
    return out


def cubin_runs(arch: int, keep_arch: int) -> bool:
    """A cubin for ``arch`` runs on a GPU of ``keep_arch`` (both compute capability x 10): same
    major, minor not above the GPU's (binary compatibility within a major)."""
    return arch // 10 == keep_arch // 10 and arch <= keep_arch


def unusable(entry: dict, keep_arch: int, has_cubin: bool) -> bool:
    """True for what a GPU of ``keep_arch`` (e.g. 90) never loads: a cubin it cannot run
    (:func:`cubin_runs`), PTX newer than it, and any PTX of a container (one compiled module)
    that holds a cubin it runs (``has_cubin``: the driver loads a compatible cubin before it would
    JIT-compile PTX). Anything else (unknown kinds) is kept."""
    if entry["kind"] == KIND_ELF:
        return not cubin_runs(entry["arch"], keep_arch)
    if entry["kind"] == KIND_PTX:
        return entry["arch"] > keep_arch or has_cubin
    return False


def prune(data: bytearray, keep_arch: int) -> dict:
    """Zero the unusable payloads of ``data`` (a whole ELF file) in place; returns counts and the
    sha256 of the kept payloads before and after (equal, or this raises)."""
    sec = _section(data, SECTION)
    if sec is None:
        return {"entries": 0, "zeroed": 0, "zeroed_bytes": 0}
    if sec[0] + sec[1] > len(data):
        raise FatbinError(f"{SECTION.decode()} runs past the end of the file")
    ents = entries(data, *sec)
    with_cubin = {e["container"] for e in ents if e["kind"] == KIND_ELF and cubin_runs(e["arch"], keep_arch)}
    drop = [unusable(e, keep_arch, e["container"] in with_cubin) for e in ents]
    kept = [e for e, d in zip(ents, drop) if not d]
    zeroed = [e for e, d in zip(ents, drop) if d]

    def kept_hash() -> str:
        h = hashlib.sha256()
        for e in kept:
            h.update(data[e["payload"]:e["payload"] + e["bytes"]])
        return h.hexdigest()

    # Every replacement is decided before any byte changes: a refusal leaves ``data`` as it was.
    frames = {}
    for e in zeroed:
        if e["flags"] & FLAG_LZ4:
            raise FatbinError(f"entry at {e['header']:#x} is LZ4-compressed: not pruned here")
        if e["flags"] & FLAG_ZSTD:
            frames[e["header"]] = zstd_zeros(struct.unpack_from("<Q", data, e["header"] + 56)[0])
            if len(frames[e["header"]]) > e["bytes"]:
                raise FatbinError(f"entry at {e['header']:#x}: a zero frame of its content size does not fit "
                                  f"its {e['bytes']}-byte payload")
    before = kept_hash()
    for e in zeroed:
        data[e["payload"]:e["payload"] + e["bytes"]] = bytes(e["bytes"])
        frame = frames.get(e["header"])
        if frame is not None:
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
    failed = 0
    for f in a.files:
        path = Path(f)
        data = bytearray(path.read_bytes())
        if data[:4] != b"\x7fELF":
            print(json.dumps({"file": f, "skipped": "not an ELF file"}))
            continue
        try:
            rec = prune(data, a.keep_arch)
        except (FatbinError, struct.error, ValueError) as e:
            print(f"fatbin_prune: {f}: {type(e).__name__}: {e} (file left as it was)", file=sys.stderr)
            failed += 1
            continue
        if rec["zeroed"]:
            tmp = path.with_name(path.name + ".fatbin_prune.tmp")
            tmp.write_bytes(data)
            os.chmod(tmp, path.stat().st_mode)
            os.replace(tmp, path)  # never a half-written library
        print(json.dumps({"file": f, **rec}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
