"""The sm_90 CUTLASS route's configurations: one compiled kernel each (``sm90.build``), named by
their tile, cluster, schedule, operand order, epilogue and tile depth. ``sm90`` re-exports
:data:`CONFIGS`; the probes (``sm90_probe``, ``sm90_kscan_probe``) time them and the route table
(``configs/sm90_cutlass.json``) picks among them."""

# name -> (tile_m, tile_n, cluster_m, cluster_n, coop, swap_ab, direct_epilogue, tile_k). Tile K is
# the contract's chunk (64) or two chunks (128, "x128" after the width: the same K chain where
# K's chunks come in pairs, :func:`serves_k`);
# direct_epilogue 1 ("d"): stores from registers, no shared-memory epilogue.
# Widths follow one wave on 132 SMs at Qwen3 shapes (N 4096, 6144, 24576; M 64-512) and the
# tiles cuBLAS picks there; "pp" = ping-pong (two consumer warp groups on alternate 64-row
# tiles), "co" = cooperative (both on one 128- or 256-row tile), both persistent; "ws" (coop 2) =
# CUTLASS's non-persistent kernel: one CTA per tile, one consumer warp group on a 64-row tile
# (its stage count leaves the same epilogue carveout as the persistent kernels', so it gets no
# more pipeline stages from sharing shared memory between mainloop and epilogue).
# Swapped names start "sw"; their schedule follows from the tile (64 rows ping-pong, 128
# cooperative) unless they end in "w" (coop 2, before the "d").
CONFIGS = {
    "pp64x96": (64, 96, 1, 1, 0, 0, 0, 64),
    "pp64x128": (64, 128, 1, 1, 0, 0, 0, 64),
    "pp64x192": (64, 192, 1, 1, 0, 0, 0, 64),
    "co128x96": (128, 96, 1, 1, 1, 0, 0, 64),
    "co128x128": (128, 128, 1, 1, 1, 0, 0, 64),
    "co128x192": (128, 192, 1, 1, 1, 0, 0, 64),
    "co128x256": (128, 256, 1, 1, 1, 0, 0, 64),
    "co256x128": (256, 128, 1, 1, 1, 0, 0, 64),
    # Clusters of two CTAs along M: the pair shares each weight tile (TMA multicast).
    "pp64x96m2": (64, 96, 2, 1, 0, 0, 0, 64),
    "pp64x128m2": (64, 128, 2, 1, 0, 0, 0, 64),
    "pp64x192m2": (64, 192, 2, 1, 0, 0, 0, 64),
    "co128x96m2": (128, 96, 2, 1, 1, 0, 0, 64),
    "co128x192m2": (128, 192, 2, 1, 1, 0, 0, 64),
    # Operands swapped ("sw", gemm_sm90.cu's RLK_SWAP_AB): tile_m weight rows x tile_n tokens, so a
    # decode batch of M tokens fills a tile of the next multiple of 16 instead of 64-row tiles.
    # Built for the M 77-208 buckets where the tiles above lose to cuBLAS; on the H100 probe only
    # sw64x48 wins, at M <= 96 (docs/results/h100_2026-12-07_session27). The probe's byte check and
    # timing decide whether the table picks one (a configuration with a differing element never is).
    "sw64x48": (64, 48, 1, 1, 0, 1, 0, 64),
    "sw64x80": (64, 80, 1, 1, 0, 1, 0, 64),
    "sw64x144": (64, 144, 1, 1, 0, 1, 0, 64),
    "sw64x208": (64, 208, 1, 1, 0, 1, 0, 64),
    "sw128x80": (128, 80, 1, 1, 1, 1, 0, 64),
    "sw128x144": (128, 144, 1, 1, 1, 1, 0, 64),
    # Operands swapped, in clusters ("m2": two weight-row tiles share each token tile by TMA
    # multicast; "n2": two token tiles share each weight tile): the tiles cuBLAS's nvjet kernels
    # use where the route loses at M 144-320 on the H100 (e.g. 64x72 in clusters of 2x1 for o at
    # M 144, 128x80 in 1x2 for down at M 320; docs/results/h100_2026-12-07_session29).
    "sw64x72m2": (64, 72, 2, 1, 0, 1, 0, 64),
    "sw64x80m2": (64, 80, 2, 1, 0, 1, 0, 64),
    "sw64x104m2": (64, 104, 2, 1, 0, 1, 0, 64),
    "sw64x144m2": (64, 144, 2, 1, 0, 1, 0, 64),
    "sw128x80n2": (128, 80, 1, 2, 1, 1, 0, 64),
    "sw128x104n2": (128, 104, 1, 2, 1, 1, 0, 64),
    # cuBLAS's tiles at the rows the route loses on the H100 (qkv and tp4_gate_up at M 64 and
    # 144-384; docs/results/h100_2026-12-07_session29), each written the way wgmma can take it.
    # A tile of h weight rows x t tokens with h not a multiple of 64 (48, 96, 144) runs unswapped:
    # the tokens on wgmma's M side (64 ping-pong, 128 cooperative), the weight rows on its N side
    # (multiples of 8), so cuBLAS's 144x64 in a 2x1 cluster is pp64x144n2 here.
    "pp64x48n2": (64, 48, 1, 2, 0, 0, 0, 64),
    "pp64x144n2": (64, 144, 1, 2, 0, 0, 0, 64),
    "pp64x256n4": (64, 256, 1, 4, 0, 0, 0, 64),
    "co128x96n2": (128, 96, 1, 2, 1, 0, 0, 64),
    "co128x144n2": (128, 144, 1, 2, 1, 0, 0, 64),
    # ... and the swapped ones in clusters of four along the weight rows (64x144 4x1 at M 144,
    # 128x80 and 128x104 4x2 at M 160 and 200).
    "sw64x144m4": (64, 144, 4, 1, 0, 1, 0, 64),
    "sw128x80m4n2": (128, 80, 4, 2, 1, 1, 0, 64),
    "sw128x104m4n2": (128, 104, 4, 2, 1, 1, 0, 64),
    # Swapped tiles whose token width is a multiple of 32. CUTLASS's epilogue stores a tile in
    # subtiles gcd(min(32, width), width) columns wide: 8 for the 72- and 104-wide tiles above, 16
    # for 48, 80 and 144, 32 here. Explicit wider subtiles do not compile: 72 and 104 columns fail
    # the epilogue builder's multiple-of-16 assert, 48 and a whole 144-wide tile (swapped or not)
    # the TMA epilogue's "Fragment size does not vectorize properly".
    # On the H100 the swapped tiles ran 1.1-3.1x cuBLAS with cuBLAS's own tile and cluster, the
    # narrowest subtiles slowest (docs/results/h100_2026-12-07_session30); where the route loses
    # on o, down, tp4_o and tp4_down (M 64-384), cuBLAS runs swapped 64-row tiles 32-120 tokens
    # wide and 128x64 / 128x96 tiles, in clusters of two.
    "sw64x32n2": (64, 32, 1, 2, 0, 1, 0, 64),
    "sw64x64m2": (64, 64, 2, 1, 0, 1, 0, 64),
    "sw64x96": (64, 96, 1, 1, 0, 1, 0, 64),
    "sw64x96m2": (64, 96, 2, 1, 0, 1, 0, 64),
    "sw64x128m2": (64, 128, 2, 1, 0, 1, 0, 64),
    "sw64x160m2": (64, 160, 2, 1, 0, 1, 0, 64),
    "sw128x64n2": (128, 64, 1, 2, 1, 1, 0, 64),
    "sw128x96n2": (128, 96, 1, 2, 1, 1, 0, 64),
    # The slow swapped twins of cuBLAS's tiles again, with the direct epilogue ("d"): the other way
    # around the 8- and 16-column subtiles above.
    "sw64x48d": (64, 48, 1, 1, 0, 1, 1, 64),
    "sw64x80d": (64, 80, 1, 1, 0, 1, 1, 64),
    "sw64x72m2d": (64, 72, 2, 1, 0, 1, 1, 64),
    "sw64x80m2d": (64, 80, 2, 1, 0, 1, 1, 64),
    "sw64x104m2d": (64, 104, 2, 1, 0, 1, 1, 64),
    "sw128x80n2d": (128, 80, 1, 2, 1, 1, 1, 64),
    # The other slow twins with narrow subtiles (16 or 8 columns, unswapped ones included), and the
    # route's most picked wide-subtile tiles: whether the direct epilogue helps only narrow subtiles.
    "sw64x144m2d": (64, 144, 2, 1, 0, 1, 1, 64),
    "sw64x144m4d": (64, 144, 4, 1, 0, 1, 1, 64),
    "sw128x80m4n2d": (128, 80, 4, 2, 1, 1, 1, 64),
    "sw128x104m4n2d": (128, 104, 4, 2, 1, 1, 1, 64),
    "pp64x144n2d": (64, 144, 1, 2, 0, 0, 1, 64),
    "co128x144n2d": (128, 144, 1, 2, 1, 0, 1, 64),
    "pp64x96d": (64, 96, 1, 1, 0, 0, 1, 64),
    "pp64x128d": (64, 128, 1, 1, 0, 0, 1, 64),
    "pp64x192d": (64, 192, 1, 1, 0, 0, 1, 64),
    "co128x192d": (128, 192, 1, 1, 1, 0, 1, 64),
    # The non-persistent schedule ("ws", "w"): cuBLAS's swapped 64-row tiles of the decode rows and
    # the route's most picked 64-row tiles again, each beside its persistent ping-pong twin. On the
    # H100 the same tile and cluster ran 1.01-3.09x cuBLAS (median 1.36) under ping-pong
    # (docs/results/h100_2026-12-07_session30): whether the persistent loop costs that time.
    "sw64x48w": (64, 48, 1, 1, 2, 1, 0, 64),
    "sw64x80w": (64, 80, 1, 1, 2, 1, 0, 64),
    "sw64x96w": (64, 96, 1, 1, 2, 1, 0, 64),
    "sw64x32n2w": (64, 32, 1, 2, 2, 1, 0, 64),
    "sw64x64m2w": (64, 64, 2, 1, 2, 1, 0, 64),
    "sw64x72m2w": (64, 72, 2, 1, 2, 1, 0, 64),
    "sw64x80m2w": (64, 80, 2, 1, 2, 1, 0, 64),
    "sw64x96m2w": (64, 96, 2, 1, 2, 1, 0, 64),
    "sw64x104m2w": (64, 104, 2, 1, 2, 1, 0, 64),
    "sw64x128m2w": (64, 128, 2, 1, 2, 1, 0, 64),
    "sw64x144m2w": (64, 144, 2, 1, 2, 1, 0, 64),
    "sw64x144m4w": (64, 144, 4, 1, 2, 1, 0, 64),
    "sw64x72m2wd": (64, 72, 2, 1, 2, 1, 1, 64),
    "ws64x96": (64, 96, 1, 1, 2, 0, 0, 64),
    "ws64x128": (64, 128, 1, 1, 2, 0, 0, 64),
    "ws64x192": (64, 192, 1, 1, 2, 0, 0, 64),
    "ws64x48n2": (64, 48, 1, 2, 2, 0, 0, 64),
    "ws64x144n2": (64, 144, 1, 2, 2, 0, 0, 64),
    # The same-tile twins that stream their weights at half cuBLAS's rate (sw64x72m2, sw64x104m2:
    # 1.87x and 2.15x cuBLAS's time per K step at N 4096, M 144 and 200 on the H100;
    # docs/results/h100_2026-12-07_session32/sm90_probe_75/sm90_kscan_fits.json) share a 2 x 1
    # cluster whose multicast halves of the token tile (36 and 52 rows) are not whole 8-row swizzle
    # atoms. Whether that is the cause is open (sw64x64m2, whose halves are whole atoms, streams
    # slowly too): these hold the width and drop the cluster, or multicast the weight tile instead
    # (n2: halves of 32 rows).
    "sw64x72": (64, 72, 1, 1, 0, 1, 0, 64),
    "sw64x104": (64, 104, 1, 1, 0, 1, 0, 64),
    "sw64x72w": (64, 72, 1, 1, 2, 1, 0, 64),
    "sw64x104w": (64, 104, 1, 1, 2, 1, 0, 64),
    "sw64x72n2w": (64, 72, 1, 2, 2, 1, 0, 64),
    "sw64x104n2w": (64, 104, 1, 2, 2, 1, 0, 64),
    # Tiles two chunks deep ("x128" after the width: tile K 128, the same ascending chain of
    # wgmma k16 steps on one accumulator where K's chunks come in pairs, see serves_k): a stage
    # reads 256 contiguous bytes of each weight row instead of 128 (two 128-byte box rows, the
    # 128-byte swizzle's limit), waits on one barrier per 128 K instead of per 64, and the stage
    # count halves. A test of whether the short reads cost the route its weight-streaming rate: at
    # N 4096 on the H100 the best 64-deep configurations stream at 0.86 of cuBLAS's rate (sw64x80,
    # M 144) and 0.90 (ws64x192, M 200), the best swapped one at M 200 at 0.51 (sw64x80m2w);
    # cuBLAS's nvjet kernels there are 64 deep, so a gain would not be cuBLAS's own choice.
    "sw64x72x128w": (64, 72, 1, 1, 2, 1, 0, 128),
    "sw64x80x128w": (64, 80, 1, 1, 2, 1, 0, 128),
    "sw64x104x128w": (64, 104, 1, 1, 2, 1, 0, 128),
    "sw64x72x128m2w": (64, 72, 2, 1, 2, 1, 0, 128),
    "sw64x104x128m2w": (64, 104, 2, 1, 2, 1, 0, 128),
    "sw64x72x128n2w": (64, 72, 1, 2, 2, 1, 0, 128),
    "ws64x128x128": (64, 128, 1, 1, 2, 0, 0, 128),
    "ws64x192x128": (64, 192, 1, 1, 2, 0, 0, 128),
    # The unswapped 128-deep non-persistent tile streamed the weights at cuBLAS's rate at N 4096,
    # M 200 on the H100 (ws64x128x128: 1.01x cuBLAS's time per K step; its 64-deep twin 1.40x;
    # docs/results/h100_2026-12-07_session34). There its grid, 4 token tiles x 32 weight tiles,
    # is one wave on 132 SMs. The same scan over 16 M (kscan_m/ there): the 64-deep tile loses its
    # per-K rate where the last token tile holds 4-16 rows (M 136-144, 196-204, not 208), and the
    # 128-deep one is 0-17% slower per K than it at the other M. These widths make one wave at other
    # token counts at N 4096 (64: M <= 128, 96: M <= 192, 32: M <= 64; 144: N 6144 at M 129-192),
    # multicast the weight tile over two token tiles (m2), or keep the tile and take the persistent
    # ping-pong loop (pp). Each has its 64-deep twin (sm90_probe.tile_k_pairs).
    "ws64x32": (64, 32, 1, 1, 2, 0, 0, 64),
    "ws64x64": (64, 64, 1, 1, 2, 0, 0, 64),
    "ws64x144": (64, 144, 1, 1, 2, 0, 0, 64),
    "ws64x128m2": (64, 128, 2, 1, 2, 0, 0, 64),
    "ws64x32x128": (64, 32, 1, 1, 2, 0, 0, 128),
    "ws64x64x128": (64, 64, 1, 1, 2, 0, 0, 128),
    "ws64x96x128": (64, 96, 1, 1, 2, 0, 0, 128),
    "ws64x144x128": (64, 144, 1, 1, 2, 0, 0, 128),
    "ws64x128x128m2": (64, 128, 2, 1, 2, 0, 0, 128),
    "pp64x128x128": (64, 128, 1, 1, 0, 0, 0, 128),
}


def token_tile(name: str) -> int:
    """The rows of tokens one CTA tile covers: tile N for an operand-swapped configuration (the
    weights are its A operand), else tile M."""
    f = CONFIGS[name]
    return f[1] if f[5] else f[0]


def padded_rows(M: int, pad: int) -> int:
    """M rounded up to a multiple of ``pad`` (M itself when ``pad`` is 0): the token rows a GEMM
    runs over when its input's allocation is padded to the token tile."""
    return -(-M // pad) * pad if pad else M
