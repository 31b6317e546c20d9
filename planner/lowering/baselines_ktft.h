// KT-FT as a baseline (reference §7b): the routed experts computed on the CPU with AMX BF16
// kernels, everything else trained with FSDP2 and CPU offload; lowered to the same StepGraph as
// the other baselines (planner/lowering/baselines.h) so both engines run it.
//
// One step per rank, micro-batch by micro-batch (gradient accumulation as in FSDP2):
//   - the dense part of each decoder (attention or GDN, router, shared expert, dense MLP) is
//     FSDP2-sharded: FP32 shard copied host-to-device, BF16 all-gather, FP32 reduce-scatter of
//     its gradient and D2H of the rank's shard; decoder inputs stay on the GPU (activation
//     checkpointing) and each decoder is recomputed in the backward;
//   - rank 0 owns the routed experts (kt-kernel/python/sft: "Rank-0-only expert pattern: only rank
//     0 holds C++ wrapper and expert weights"; autograd.py KTMoEFunction, dist_utils.py): at each
//     MoE sublayer every rank's hidden states are gathered to rank 0 over NCCL, rank 0 copies them
//     to the host, the experts of all of them run on the CPU (AMX BF16, spread over every socket of
//     the node), the outputs come back to rank 0 and are scattered to their ranks; the other ranks
//     wait. The backward does the same with the output gradients and twice the FLOPs, after the
//     checkpoint's recompute has run the CPU forward once more;
//   - after the backward every rank's CPU Adam updates its 1/P of the dense shards, and rank 0's
//     every expert.
// Host: 16 B/param for the dense part (FSDP2) and 18 B/param for the experts (BF16 weights the
// AMX kernels read, FP32 gradient, master and moments), plus process memory per rank. GPU: M_0,
// the two-slot window of the largest dense decoder and its staging, the kept decoder inputs, the
// largest workset. Needs NumaSpec::amx_bf16_flops_per_s > 0 (hardware without AMX is bad input).
// Units: bytes, seconds, FLOP/s. Pure functions; thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "planner/lowering/baselines.h"

namespace oom {

// Achieved fraction of the AMX BF16 peak by KT-FT's CPU experts in the forward, from KT-FT's own
// published throughput while fine-tuning (kvcache-ai/ktransformers,
// doc/en/SFT/KTransformers-Fine-Tuning_Developer-Technical-Notes.md, "MoE Compute"): 17.55 TFLOP/s
// forward on Xeon Platinum 8488C, AMX on. Taken over that machine's two sockets, as KT's SFT
// backend spreads the experts over every NUMA node (kt-kernel moe-sft-tp.hpp, "Tensor-parallel
// wrapper for multi-NUMA"): 2 × 48 cores × 2.4 GHz base × 1,024 BF16 FLOPs per cycle and core =
// 235.9 TFLOP/s. Not fitted. (The same run's backward, 18.41 TFLOP/s, is LoRA's: it computes no
// gradient of the frozen expert weights, so it does not stand for full fine-tuning's.)
inline constexpr double kKtFtReferenceAmxPeak = 2 * 48 * 2.4e9 * 1024;
inline constexpr double kKtFtAmxForwardEfficiency = 17.55e12 / kKtFtReferenceAmxPeak;  // 0.074
// The checkpoint's recompute relative to the forward, per FLOP, from KT-FT's full fine-tuning
// profile (doc/en/SFT/Qwen3-30B-A3B-Full-FT-BF16-Performance.md, "Detailed Profile": the TP0
// critical path of one step of Qwen3-30B-A3B, 1,024 tokens, on a two-socket EPYC 9355, TP = 2
// NUMA partitions): initial CPU MoE forward 0.344 s, recompute forward 0.505 s (it also fills the
// cache the backward reads).
inline constexpr double kKtFtRecomputeOverForward = 0.344 / 0.505;  // 0.681
// The full fine-tuning backward, from the same profile: TP backward total 1.447 s, of which the
// weight gradient (dW) 0.933 s wall and the TP wrapper's gradient-buffer clear 0.352 s. The dW
// workers' summed CPU time (one socket's pool) is mostly packing: pack A 11.248 s, pack B 9.933 s
// and the BF16 store 1.960 s against 3.614 + 1.881 s in the gate/up and down kernels, so 23.141 /
// 28.636 of the dW wall time, 0.754 s, packs route-major panels and stores gradients on the cores.
// AMX speeds only the kernels (the dW driver and its packing are shared by the AVX-512 and AMX
// paths), so on an AMX socket the packing does not shrink with the forward. The backward is priced
// in three parts:
// - its matmuls (input and weight gradients, twice the forward's FLOPs) and the rest, 1.447 −
//   0.352 − 0.754 = 0.341 s against the forward's 0.344 s: per FLOP at 2 · 0.344 / 0.341 times the
//   forward's rate;
inline constexpr double kKtFtDwPackSeconds = 0.933 * (11.248 + 9.933 + 1.960) / (11.248 + 9.933 + 3.614 + 1.881 + 1.960);  // 0.754
inline constexpr double kKtFtBackwardOverForward = 2 * 0.344 / (1.447 - 0.352 - kKtFtDwPackSeconds);  // 2.018
// - the packing: each socket packs, per route (a token routed to an expert) and decoder, the input
//   X [H] and the output gradient [H] once each, and its TP slice of the gate and up gradients
//   (2·I/N) and of the activation (I/N): 2H + 3I/N elements with N sockets; in the profile 1,024 ×
//   8 routes × 48 decoders × (2 · 2048 + 3 · 768 / 2) elements in 0.754 s on a socket of 32 cores at
//   3.55 GHz base (AMD EPYC 9355): 41.5 core cycles per element. Core-bound, not DRAM-bound (about
//   11 GB/s of a socket's 614 GB/s), so it scales with a socket's cores × clock (a Zen 5 and a
//   Golden Cove core taken to pack alike per cycle). Not fitted;
inline constexpr double kKtFtReferenceSocketCyclesPerS = 32 * 3.55e9;
inline constexpr double kKtFtDwPackCyclesPerElement =
    kKtFtDwPackSeconds * kKtFtReferenceSocketCyclesPerS / (1024.0 * 8 * 48 * (2 * 2048 + 3 * 768 / 2.0));  // 41.5
// - the gradient-buffer clear, per expert parameter of a socket's TP slice and per backward pass:
//   Qwen3-30B-A3B's 48 × 128 experts of 3 · 2048 · 768 parameters, half on each socket, in 0.352 s:
//   2.76 core cycles per parameter.
inline constexpr double kKtFtGradClearCyclesPerParam = 0.352 * kKtFtReferenceSocketCyclesPerS / (48.0 * 128 * 3 * 2048 * 768 / 2);  // 2.76
// A socket's core cycles per second are its AMX BF16 peak over the 1,024 BF16 FLOPs AMX does per
// core and cycle (the HardwareSpec states the peak as cores × base clock × 1,024).
inline constexpr double kAmxBf16FlopsPerCoreCycle = 1024;
// DRAM bytes per expert parameter a CPU pass moves: the forward (and the recompute) reads the BF16
// weights; the backward reads them for the input gradient and stores the BF16 weight gradient
// (KT-FT full fine-tuning: "FP32 accumulation and BF16 gradient storage",
// doc/en/SFT/Qwen3-30B-A3B-Full-FT-BF16-Performance.md).
inline constexpr Bytes kKtFtForwardDramBytesPerParam = kBf16Bytes;
inline constexpr Bytes kKtFtBackwardDramBytesPerParam = 2 * kBf16Bytes;

BaselineMemory ktft_static_memory(const BaselineSetup& setup, const WorkloadContext& ctx, const MemoryConstants& constants = {});
BaselineFit configure_ktft(const WorkloadContext& ctx, const MemoryConstants& constants = {});
StepGraph lower_ktft(const BaselineSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options = {});

// Seconds a backward CPU expert pass spends packing dW panels and clearing gradient buffers on the
// cores of each of `hw`'s sockets (they run at once, each on its TP slice): `routes` routed
// tokens, hidden size `hidden`, `experts` experts of `params` parameters in all (3 · H · I each).
// 0 without routes.
double ktft_backward_core_s(const HardwareSpec& hw, std::int64_t routes, std::int64_t hidden, std::int64_t experts, ParamCount params);

}  // namespace oom
