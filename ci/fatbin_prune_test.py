"""ci/fatbin_prune.py on synthetic ELF files whose .nv_fatbin section is built here."""
import json
import shutil
import struct
import subprocess

import pytest

import fatbin_prune as fp


def _entry(kind: int, arch: int, payload: bytes, zstd_of: int = 0, header: int = 80, flags: int = 0) -> bytes:
    """An entry with a ``header``-byte header (real libraries have 64, 80 and 112; the bytes past
    64 are filled, as a name would); ``zstd_of`` > 0 marks the payload as a zstd frame of that
    many bytes."""
    flags |= fp.FLAG_ZSTD if zstd_of else 0
    head = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, header, len(payload), len(payload), 0, 0, 0, arch, 0, 0,
                       flags, 0, zstd_of)
    return head + b"\xee" * (header - 64) + payload


def _container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", fp.MAGIC, 1, 16, len(body)) + body


def _elf(fatbin: bytes | None) -> bytearray:
    """A minimal ELF64 file: header, the .nv_fatbin bytes (if any), .shstrtab, section headers."""
    names = b"\0.nv_fatbin\0.shstrtab\0" if fatbin is not None else b"\0.text\0.shstrtab\0"
    body = fatbin if fatbin is not None else b"\x90" * 32
    body_off, str_off = 64, 64 + len(body)
    shoff = (str_off + len(names) + 7) // 8 * 8
    head = bytearray(64)
    head[:7] = b"\x7fELF\x02\x01\x01"
    struct.pack_into("<Q", head, 0x28, shoff)
    struct.pack_into("<HHH", head, 0x3A, 64, 3, 2)

    def sh(name, off, size):
        return struct.pack("<IIQQQQIIQQ", name, 1, 0, 0, off, size, 0, 0, 1, 0)

    str_name = names.index(b".shstrtab")
    data = head + body + names
    data += bytes(shoff - len(data))
    data += bytes(64) + sh(1, body_off, len(body)) + sh(str_name, str_off, len(names))
    return bytearray(data)


P = {name: bytes([i + 1]) * (64 + 8 * i) for i, name in enumerate(
    ["elf80", "elf90", "ptx80", "ptx100", "elf75", "ptx80_only", "elf120"])}


def _library() -> bytearray:
    # Module A has an sm_90 cubin: every other image in it is unused on sm_90 (its PTX too).
    # Module B has none: its compute_80 PTX is what an sm_90 GPU would JIT, so it stays.
    a = _container(_entry(2, 80, P["elf80"], zstd_of=300_000), _entry(2, 90, P["elf90"], zstd_of=100),
                   _entry(1, 80, P["ptx80"]), _entry(1, 100, P["ptx100"]))
    b = _container(_entry(2, 75, P["elf75"], header=64), _entry(1, 80, P["ptx80_only"], header=112),
                   _entry(2, 120, P["elf120"]))
    return _elf(a + bytes(8) + b)


def test_only_what_sm90_never_loads_is_zeroed_and_nothing_moves():
    orig = _library()
    data = bytearray(orig)
    rec = fp.prune(data, 90)
    assert len(data) == len(orig)
    assert (rec["entries"], rec["kept"], rec["zeroed"]) == (7, 2, 5)
    assert rec["kept_archs"] == [(1, 80), (2, 90)]
    for name, payload in P.items():
        kept = name in ("elf90", "ptx80_only")
        assert (payload in data) == kept, name
    assert rec["zeroed_bytes"] == sum(len(p) for n, p in P.items() if n not in ("elf90", "ptx80_only"))
    # Every byte that differs lies in a zeroed entry: padding, containers and the ELF are untouched.
    ents = fp.entries(orig, *fp._section(orig, fp.SECTION))
    assert fp.entries(data, *fp._section(data, fp.SECTION)) == ents
    zeroed = [e for e in ents if data[e["payload"]:e["payload"] + e["bytes"]] != orig[e["payload"]:e["payload"] + e["bytes"]]]
    assert len(zeroed) == 5
    diff = [i for i in range(len(orig)) if orig[i] != data[i]]
    assert diff and all(any(e["payload"] <= i < e["payload"] + e["bytes"] or e["header"] + 16 <= i < e["header"] + 20
                            for e in zeroed) for i in diff)
    # The zstd entry now holds a frame of as many zeros as it held before; its compressed size says so.
    e80 = next(e for e in ents if e["arch"] == 80 and e["kind"] == 2)
    frame = fp.zstd_zeros(300_000)
    assert bytes(data[e80["payload"]:e80["payload"] + len(frame)]) == frame
    assert not any(data[e80["payload"] + len(frame):e80["payload"] + e80["bytes"]])
    assert struct.unpack_from("<I", data, e80["header"] + 16)[0] == len(frame)
    assert struct.unpack_from("<Q", data, e80["header"] + 56)[0] == 300_000


@pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd command")
@pytest.mark.parametrize("n", [0, 1, 5576, 128 << 10, (128 << 10) + 1, 3_000_000, 200 << 20])
def test_the_zero_frame_decompresses_to_as_many_zeros(n):
    out = subprocess.run(["zstd", "-d", "-c"], input=fp.zstd_zeros(n), capture_output=True, check=True).stdout
    assert out == bytes(n)


def test_ptx_is_kept_where_no_cubin_runs_and_another_gpu_keeps_its_own_major():
    lib = _elf(_container(_entry(2, 80, P["elf80"]), _entry(1, 90, P["ptx80"])) + _container(_entry(1, 86, P["ptx100"])))
    rec = fp.prune(bytearray(lib), 90)
    assert rec["kept_archs"] == [(1, 86), (1, 90)]  # no sm_90 cubin beside them: PTX <= 9.0 is what it would JIT
    data = bytearray(lib)
    rec = fp.prune(data, 86)  # an sm_86 GPU runs the sm_80 cubin: its module's PTX goes, the other's stays
    assert rec["kept_archs"] == [(1, 86), (2, 80)] and P["elf80"] in data and P["ptx80"] not in data


@pytest.mark.parametrize("case", ["lz4", "frame_too_big"])
def test_an_entry_that_cannot_be_zeroed_truthfully_is_refused_before_any_change(case):
    bad = (_entry(2, 80, P["elf80"], flags=fp.FLAG_LZ4) if case == "lz4"
           else _entry(2, 80, bytes(16), zstd_of=1 << 40))  # the frame of 2^40 zeros needs ~33 MB
    lib = _elf(_container(_entry(2, 90, P["elf90"]), _entry(2, 75, P["elf75"], zstd_of=500), bad))
    data = bytearray(lib)
    with pytest.raises(fp.FatbinError, match="LZ4" if case == "lz4" else "does not fit"):
        fp.prune(data, 90)
    assert data == lib


def test_a_container_that_would_never_end_is_refused():
    stuck = struct.pack("<IHHQ", fp.MAGIC, 1, 0, 0)  # header size 0: the walk would not advance
    with pytest.raises(fp.FatbinError, match="outside its section"):
        fp.prune(_elf(stuck + bytes(8)), 90)


def test_a_library_without_device_code_is_left_alone():
    data = _elf(None)
    assert fp.prune(data, 90) == {"entries": 0, "zeroed": 0, "zeroed_bytes": 0}


@pytest.mark.parametrize("damage", ["magic", "entry_size"])
def test_a_fatbin_that_does_not_parse_is_refused_and_the_file_kept(tmp_path, damage):
    data = _library()
    off, _ = fp._section(data, fp.SECTION)
    if damage == "magic":
        data[off] ^= 0xFF
    else:  # the first entry's payload size runs past its container
        struct.pack_into("<Q", data, off + 16 + 8, 1 << 20)
    f = tmp_path / "lib.so"
    f.write_bytes(bytes(data))
    with pytest.raises(fp.FatbinError):
        fp.prune(bytearray(data), 90)
    assert fp.main(["--keep-arch", "90", str(f)]) == 1
    assert f.read_bytes() == bytes(data)


def test_the_command_prunes_in_place_and_reports(tmp_path, capsys):
    f, script = tmp_path / "lib.so", tmp_path / "ld.so"
    f.write_bytes(bytes(_library()))
    f.chmod(0o755)
    script.write_text("/* GNU ld script */\nGROUP ( libc.so.6 )\n")  # a *.so that is not ELF: skipped
    assert fp.main(["--keep-arch", "90", str(script), str(f)]) == 0
    skipped, rec = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert skipped == {"file": str(script), "skipped": "not an ELF file"}
    assert f.stat().st_mode & 0o777 == 0o755 and not list(tmp_path.glob("*.tmp"))
    assert rec["zeroed"] == 5 and P["elf90"] in f.read_bytes() and P["elf80"] not in f.read_bytes()
    # Idempotent: a second run zeroes the same entries again and changes no byte.
    once = f.read_bytes()
    assert fp.main(["--keep-arch", "90", str(f)]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["kept_sha256"] == rec["kept_sha256"] and f.read_bytes() == once
