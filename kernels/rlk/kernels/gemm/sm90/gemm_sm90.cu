// gemm.bf16.v1 on sm_90a through CUTLASS's warp-specialized TMA + wgmma kernels (CuTe).
//
//   y[M, N] (bf16) = x[M, K] (bf16, row-major) @ w[N, K]^T (bf16, row-major), fp32 accumulator.
//
// The arithmetic is v1's for a single segment (split_rule(K, N) == 1): each output element is one
// fp32 accumulator that starts at zero and runs over K in ascending 64-wide chunks, each chunk a
// sequential chain of four 16-deep wgmma k-steps; one RNE rounding to bf16 at the store (alpha =
// 1, no C operand). A tile's K extent (RLK_TILE_K) is one chunk or two: a 128-deep tile issues the
// two chunks' eight k-steps in the same ascending order on the same accumulator, so the chain, and
// the bytes, do not depend on it; only the pipeline stage (and each TMA row: 256 contiguous bytes
// instead of 128) grows. That is the instruction chain the Triton kernels issue,
// so the bytes equal theirs at every M: the GPU test proves it per configuration, and the
// invariance sweep proves it across M. What the CUTLASS kernels add is what Triton 3.6 cannot
// express on Hopper: tile widths that are not powers of two (one wave on 132 SMs), a TMA producer
// warp with two consumer warp groups (cooperative or ping-pong) and a persistent tile scheduler.
//
// Each compilation of this file is one configuration, chosen by macros (the build script passes
// them): RLK_TILE_M, RLK_TILE_N, RLK_CLUSTER_M, RLK_CLUSTER_N, RLK_COOP (1: cooperative, 0:
// ping-pong, 2: non-persistent), RLK_SWAP_AB, RLK_SYMBOL (the exported C function's name) and, optionally,
// RLK_TILE_K (64, the default, or 128) and RLK_EPI_DIRECT (stores from registers, no shared-memory epilogue).
//
// RLK_SWAP_AB = 1 computes the transpose, y^T[N, M] = w[N, K] @ x[M, K]^T: the weight rows take
// wgmma's M side (tiles of RLK_TILE_M weight rows) and the tokens its N side (RLK_TILE_N tokens,
// any multiple of 8 up to 256), and the epilogue stores y^T column-major, i.e. y row-major. A
// decode batch of M tokens then fills one tile exactly where the unswapped kernel rounds M up to
// 64-row tiles. Each output element is the same dot product: the same products w[n, k] * x[m, k],
// the same fp32 accumulator from zero over the same ascending 64-wide K chunks of four k16 steps,
// one RNE rounding; the GPU test per configuration checks the bytes. The exported function has a C ABI
// (called through ctypes, no libtorch linkage): it returns 0 on success, else an error code that
// the Python side turns into a message.

#include <cuda_runtime.h>

#include <atomic>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"

#if !defined(RLK_TILE_M) || !defined(RLK_TILE_N) || !defined(RLK_CLUSTER_M) || \
    !defined(RLK_CLUSTER_N) || !defined(RLK_COOP) || !defined(RLK_SWAP_AB) || !defined(RLK_SYMBOL)
#error "build with -DRLK_TILE_M=.. -DRLK_TILE_N=.. -DRLK_CLUSTER_M=.. -DRLK_CLUSTER_N=.. -DRLK_COOP=.. -DRLK_SWAP_AB=.. -DRLK_SYMBOL=.."
#endif

#define RLK_CAT2(a, b) a##b
#define RLK_CAT(a, b) RLK_CAT2(a, b)

// A named namespace per configuration (an anonymous one clashes with CUTLASS's in nvcc's stub,
// and every configuration's types must stay distinct when the objects are linked together).
namespace RLK_CAT(RLK_SYMBOL, _ns) {

using namespace cute;

// The contract's chunk: 64 K elements (four wgmma k-steps of 16). A pipeline stage holds one
// chunk or two (RLK_TILE_K), walked in the same order either way (see the top of this file).
constexpr int kChunkK = 64;
#ifndef RLK_TILE_K
#define RLK_TILE_K 64
#endif
static_assert(RLK_TILE_K == kChunkK || RLK_TILE_K == 2 * kChunkK, "RLK_TILE_K: 64 or 128");
using TileShape = Shape<Int<RLK_TILE_M>, Int<RLK_TILE_N>, Int<RLK_TILE_K>>;
using ClusterShape = Shape<Int<RLK_CLUSTER_M>, Int<RLK_CLUSTER_N>, _1>;

// RLK_COOP: 1 cooperative (two consumer warp groups on one tile), 0 ping-pong (two consumer warp
// groups on alternate tiles), both persistent (a grid of at most one CTA per SM walks the tiles);
// 2 the non-persistent kernel: one CTA per tile, one consumer warp group, shared memory of the
// mainloop and the epilogue in a union (no persistent loop, no tile scheduler in the K walk's way).
// The schedule decides which CTA and warp group runs a tile, never the tile's K walk.
#if RLK_COOP == 1
using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
#elif RLK_COOP == 2
using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecialized;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
#else
using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
#endif

using Bf16 = cutlass::bfloat16_t;
constexpr int kAlign = 8;  // 16 bytes of bf16: TMA's alignment for base addresses and row strides

// Unswapped: D = y[M, N] row-major. Swapped: D = y^T[N, M] column-major (the same bytes as y
// row-major with row stride ldy).
#if RLK_SWAP_AB
using LayoutD = cutlass::layout::ColumnMajor;
#else
using LayoutD = cutlass::layout::RowMajor;
#endif

// RLK_EPI_DIRECT = 1: the consumer warps store their accumulators straight to global memory
// (CUTLASS's NoSmemWarpSpecialized epilogue) instead of staging subtiles in shared memory for TMA
// stores. CUTLASS's TMA epilogue cuts a tile into subtiles gcd(min(32, TILE_N), TILE_N) columns
// wide, 8 or 16 for most swapped tiles, and stores them one after another.
#if defined(RLK_EPI_DIRECT) && RLK_EPI_DIRECT
using EpilogueScheduleUsed = cutlass::epilogue::NoSmemWarpSpecialized;
#else
using EpilogueScheduleUsed = EpilogueSchedule;
#endif

// D = alpha * acc with alpha = 1 (exact in fp32), no C operand, one RNE conversion to bf16 (both
// epilogues: the same LinearCombination, alpha only, round to nearest even).
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    void, LayoutD, kAlign,
    Bf16, LayoutD, kAlign,
    EpilogueScheduleUsed>::CollectiveOp;

// Both operands K-major: A row-major (x, or w when swapped), B stored K-major (ColumnMajor B: w[N,
// K] row-major, or x[M, K] row-major when swapped).
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    Bf16, cutlass::layout::RowMajor, kAlign,
    Bf16, cutlass::layout::ColumnMajor, kAlign,
    float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    MainloopSchedule>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

// Error codes of the C entry point (mirrored in sm90.py).
enum : int {
  kOk = 0,
  kBadShape = 1,        // M, N or K < 1
  kBadAlignment = 2,    // a pointer or row stride not 16-byte aligned
  kCannotImplement = 3, // CUTLASS's can_implement refused the problem
  kNeedsWorkspace = 4,  // the kernel asked for a workspace (none is passed)
  kSmemAttribute = 5,   // cudaFuncSetAttribute failed
  kLaunch = 6,          // the launch failed (cudaGetLastError after it)
};

// SM count per device ordinal, queried once per device (a process may drive several GPUs, from
// several threads). It sets the persistent grid's size only: every tile's K walk and arithmetic
// are the same whatever the count.
constexpr int kMaxDevices = 64;
static std::atomic<int> g_sm_count[kMaxDevices];

}  // namespace RLK_SYMBOL_ns

using namespace RLK_CAT(RLK_SYMBOL, _ns);

extern "C" int RLK_SYMBOL(const void* x, const void* w, void* y, int M, int N, int K,
                          long long ldx, long long ldw, long long ldy, void* stream) {
  if (M < 1 || N < 1 || K < 1) return kBadShape;
  auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) % 16) != 0; };
  if (misaligned(x) || misaligned(w) || misaligned(y) || ldx % kAlign || ldw % kAlign ||
      ldy % kAlign || ldx < K || ldw < K || ldy < N) {
    return kBadAlignment;
  }
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return kLaunch;
  }
  const bool cached = dev >= 0 && dev < kMaxDevices;
  int sm_count = cached ? g_sm_count[dev].load(std::memory_order_relaxed) : 0;
  if (sm_count == 0) {
    sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(dev);
    if (cached) g_sm_count[dev].store(sm_count, std::memory_order_relaxed);
  }
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  // Row strides are the callers' (views into wider buffers are served without a copy).
#if RLK_SWAP_AB
  const Bf16* a_ptr = static_cast<const Bf16*>(w);
  const Bf16* b_ptr = static_cast<const Bf16*>(x);
  StrideA stride_a = make_stride(static_cast<int64_t>(ldw), _1{}, int64_t(0));
  StrideB stride_b = make_stride(static_cast<int64_t>(ldx), _1{}, int64_t(0));
  StrideD stride_d = make_stride(_1{}, static_cast<int64_t>(ldy), int64_t(0));
  const int gemm_m = N, gemm_n = M;
#else
  const Bf16* a_ptr = static_cast<const Bf16*>(x);
  const Bf16* b_ptr = static_cast<const Bf16*>(w);
  StrideA stride_a = make_stride(static_cast<int64_t>(ldx), _1{}, int64_t(0));
  StrideB stride_b = make_stride(static_cast<int64_t>(ldw), _1{}, int64_t(0));
  StrideD stride_d = make_stride(static_cast<int64_t>(ldy), _1{}, int64_t(0));
  const int gemm_m = M, gemm_n = N;
#endif

  cutlass::KernelHardwareInfo hw_info;
  hw_info.sm_count = sm_count;
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {gemm_m, gemm_n, K, 1},
      {a_ptr, stride_a, b_ptr, stride_b},
      {{1.0f, 0.0f}, nullptr, stride_d, static_cast<Bf16*>(y), stride_d},
      hw_info};
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return kCannotImplement;
  if (Gemm::get_workspace_size(args) != 0) return kNeedsWorkspace;
  // The shared-memory attribute is per device: set on every eager call (cheap), skipped inside a
  // stream capture, where the eager warm-up call before the capture has set it (vLLM and rlk's
  // engines warm every configuration up before they capture).
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capturing) != cudaSuccess) {
    cudaGetLastError();
    return kLaunch;
  }
  int smem = GemmKernel::SharedStorageSize;
  if (capturing == cudaStreamCaptureStatusNone && smem >= (48 << 10) &&
      cudaFuncSetAttribute(cutlass::device_kernel<GemmKernel>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
    cudaGetLastError();
    return kSmemAttribute;
  }
  typename GemmKernel::Params params = GemmKernel::to_underlying_arguments(args, nullptr);
  cutlass::Status st = Gemm::run(params, static_cast<cudaStream_t>(stream));
  if (st != cutlass::Status::kSuccess || cudaGetLastError() != cudaSuccess) return kLaunch;
  return kOk;
}

// The configuration this object was built with, for the loader's cross-check.
#define RLK_STR2(s) #s
#define RLK_STR(s) RLK_STR2(s)
extern "C" const char* RLK_CAT(RLK_SYMBOL, _config)() {
  return "tile_m=" RLK_STR(RLK_TILE_M) " tile_n=" RLK_STR(RLK_TILE_N) " cluster_m=" RLK_STR(
      RLK_CLUSTER_M) " cluster_n=" RLK_STR(RLK_CLUSTER_N) " coop=" RLK_STR(RLK_COOP) " swap_ab=" RLK_STR(
      RLK_SWAP_AB) " tile_k=" RLK_STR(RLK_TILE_K) " chunk_k=64";
}
