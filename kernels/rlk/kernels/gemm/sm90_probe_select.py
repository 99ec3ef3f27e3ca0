"""Which token counts and configurations an ``sm90_probe`` run covers.

A probe's time grows with rows x configurations, and the route table it writes changes its pick
only at the M it timed: an M between two probed rows gets the pick of the next larger one. The
decode step's worst rows (M 136-152 and 200-208 on the H100, docs/results/h100_2026-12-07_session34)
sit between the rows of the default list, so ``--m decode`` probes every batch size vLLM's decode
can run under CUDA graphs, and ``--configs-from`` keeps it affordable by probing only the
configurations that came within a margin of the fastest at some row of earlier probes.

    python -m rlk.kernels.gemm.sm90_probe --out p.json --m decode --configs-from old.json.xz --within 0.02
"""

from __future__ import annotations

# Decode batches every 16 rows up to 256, where the route's table changes most; odd 77 and 200 for
# half-empty tiles; prefill sizes sparser.
M_LIST = (1, 16, 32, 48, 64, 77, 80, 96, 112, 128, 144, 160, 176, 192, 200, 208, 224, 240, 256, 320, 384,
          448, 512, 1024, 2048, 4096)

# vLLM's default CUDA-graph capture sizes (1, 2, 4, then every 8 up to 256, then every 16; the
# engine pads a decode batch up to the next one) for max_num_seqs 256, the rollout benchmark's,
# up to 256, then the default list's rows above it, so the table's entries for long prefills stay.
M_DECODE = (1, 2, 4) + tuple(range(8, 257, 8)) + (320, 384, 448, 512, 1024, 2048, 4096)

M_NAMES = {"default": M_LIST, "decode": M_DECODE}


def parse_m(text: str) -> list[int]:
    """``"decode"``, ``"default,77"``, ``"64,128"`` -> ascending distinct M: named lists
    (:data:`M_NAMES`) and integers >= 1, comma-separated."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        if part in M_NAMES:
            out.update(M_NAMES[part])
            continue
        try:
            m = int(part)
        except ValueError:
            raise ValueError(f"sm90_probe: --m takes integers and {sorted(M_NAMES)}, got {part!r}") from None
        if m < 1:
            raise ValueError(f"sm90_probe: --m values must be >= 1, got {m}")
        out.add(m)
    if not out:
        raise ValueError("sm90_probe: --m names no M")
    return sorted(out)


def contenders(docs: list[dict], within: float, known) -> list[str]:
    """The configurations that, in at least one row of the probes ``docs``, had 0 differing
    elements and a time within ``1 + within`` of the fastest such configuration of that row, and
    those of ``known`` that no row of ``docs`` timed (built after those probes: nothing says they
    lose), in the order of ``known`` (the library's names; a name it no longer has is left out)."""
    if within < 0:
        raise ValueError(f"sm90_probe: --within must be >= 0, got {within}")
    keep: set[str] = set()
    timed: set[str] = set()
    for doc in docs:
        for row in doc["rows"]:
            timed.update(n for n, c in row["configs"].items() if c.get("ms"))
            ok = {n: c["ms"] for n, c in row["configs"].items() if c.get("ms") and c.get("differing") == 0}
            if ok:
                best = min(ok.values())
                keep.update(n for n, t in ok.items() if t <= best * (1 + within))
    if not keep:
        raise ValueError("sm90_probe: --configs-from: no configuration was timed with 0 differing elements there")
    return [n for n in known if n in keep or n not in timed]


def split_names(text: str | None) -> list[str]:
    """``"a, b,,c"`` -> ["a", "b", "c"]; None -> []."""
    return [c.strip() for c in (text or "").split(",") if c.strip()]
