#include "backend/measure/local_calibration.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <ctime>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/measure/torch_executor.h"
#include "backend/optim/adamw.h"
#include "backend/runtime/threads.h"
#include "backend/train/plan_runtime.h"
#include "costmodel/input_error.h"
#include "costmodel/units.h"
#include "planner/lowering/step_graph.h"
#include "traces/trace.h"

namespace oom::backend {
namespace {

// Repeats `work` until `budget_s` has passed (at least 3 times after one warm-up); returns the
// fastest repetition's seconds.
double now_s(bool cpu_time) {
  if (cpu_time) {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class F>
double best_time_s(double budget_s, bool cpu_time, F&& work) {
  work();
  double best = 1e30, spent = 0;
  for (int i = 0; i < 3 || spent < budget_s; ++i) {
    const double t0 = now_s(cpu_time);
    work();
    const double dt = now_s(cpu_time) - t0;
    best = std::min(best, dt);
    spent += dt;
    if (i > 1000) break;
  }
  return best;
}

Bytes physical_memory_bytes() {
  return static_cast<Bytes>(sysconf(_SC_PHYS_PAGES)) * static_cast<Bytes>(sysconf(_SC_PAGESIZE));
}

}  // namespace

HardwareSpec measure_local_hardware(const LocalMeasureOptions& o) {
  set_compute_threads(o.threads);
  const bool cuda = o.use_cuda && at::hasCUDA();
  const at::Device dev = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const bool cpu_time = o.cpu_time && !cuda;
  auto sync = [&](const at::Tensor& t) {
    if (cuda) t.sum().item<float>();
  };
  // Compute: a square GEMM large enough to reach the kernel's plateau.
  const std::int64_t n = cuda ? 4096 : 1024;
  const auto dtype = cuda ? at::kBFloat16 : at::kFloat;
  const auto a = at::randn({n, n}, at::TensorOptions().dtype(dtype).device(dev));
  const auto b = at::randn({n, n}, at::TensorOptions().dtype(dtype).device(dev));
  at::Tensor c;
  const double gemm_s = best_time_s(o.seconds_per_probe, cpu_time, [&] {
    c = at::mm(a, b);
    sync(c);
  });
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / gemm_s;

  // The GEMM's ramp: the rate of [m, w] × [w, w] products against m, fitted as
  // 1 / rate = (1 + half / m) / plateau (least squares over m; half = the rows at half the rate).
  const std::int64_t w = cuda ? 4096 : 256;
  const auto bw = at::randn({w, w}, at::TensorOptions().dtype(dtype).device(dev));
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const std::vector<std::int64_t> rows = {8, 16, 32, 64, 128, 256, 1024};
  for (const std::int64_t m : rows) {
    const auto am = at::randn({m, w}, at::TensorOptions().dtype(dtype).device(dev));
    // Enough products per timing that each lasts well above the clock's resolution.
    const double product_flops = 2.0 * static_cast<double>(m) * static_cast<double>(w) * static_cast<double>(w);
    const int reps = static_cast<int>(std::clamp(5e7 / product_flops, 1.0, 1000.0));
    const double s_per = best_time_s(o.seconds_per_probe / 4, cpu_time, [&] {
                           for (int i = 0; i < reps; ++i) c = at::mm(am, bw);
                           sync(c);
                         }) / reps;
    const double x = 1.0 / static_cast<double>(m), y = s_per / product_flops;
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double count = static_cast<double>(rows.size());
  const double slope = (count * sxy - sx * sy) / (count * sxx - sx * sx), intercept = (sy - slope * sx) / count;
  const double half_rows = intercept > 0 && slope > 0 ? slope / intercept : 0.0;

  // Memory: a copy reads and writes each byte.
  const std::int64_t elems = std::int64_t{32} << 20;  // 128 MiB of FP32
  const auto src = at::rand({elems}, at::TensorOptions().device(dev));
  auto dst = at::empty_like(src);
  const double copy_s = best_time_s(o.seconds_per_probe, cpu_time, [&] {
    dst.copy_(src);
    sync(dst);
  });
  const double mem_Bps = 2.0 * static_cast<double>(elems) * 4.0 / copy_s;

  // Host DRAM and the link.
  const auto hsrc = at::rand({elems});
  auto hdst = at::empty_like(hsrc);
  const double host_copy_s = best_time_s(o.seconds_per_probe, cpu_time, [&] { hdst.copy_(hsrc); });
  const double dram_Bps = 2.0 * static_cast<double>(elems) * 4.0 / host_copy_s;
  double h2d_Bps = dram_Bps / 2, d2h_Bps = dram_Bps / 2;  // a CPU "transfer" copies within DRAM
  if (cuda) {
    const auto pinned = at::empty({elems}, at::TensorOptions().pinned_memory(true));
    h2d_Bps = static_cast<double>(elems) * 4.0 / best_time_s(o.seconds_per_probe, cpu_time, [&] {
                dst.copy_(pinned, true);
                sync(dst);
              });
    d2h_Bps = static_cast<double>(elems) * 4.0 / best_time_s(o.seconds_per_probe, cpu_time, [&] {
                pinned.copy_(dst, true);
                sync(dst);
              });
  }

  // CPU AdamW over 8 M parameters.
  const std::int64_t np = std::int64_t{8} << 20;
  auto p = at::rand({np}), g = at::rand({np}), m = at::zeros({np}), v = at::zeros({np});
  std::int64_t step = 0;
  const double adam_s = best_time_s(o.seconds_per_probe, cpu_time, [&] { cpu_adamw_step(p, g, m, v, AdamWConfig{}, ++step); });

  HardwareSpec h;
  h.name = o.name;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  h.description = cuda ? fmt::format("this machine: CUDA device 0 ({} host cores), measured by oom calibrate --backend", cores)
                       : fmt::format("this machine's CPU ({} cores) with {} LibTorch thread(s) as the compute device, measured "
                                     "by oom calibrate --backend ({} time)",
                                     cores, at::get_num_threads(), cpu_time ? "process CPU" : "wall");
  h.nodes = 1;
  h.gpus_per_node = 1;
  h.gpu.name = cuda ? "CUDA device 0" : "host CPU (FP32)";
  h.gpu.hbm_bytes = cuda ? static_cast<Bytes>(80) << 30 : physical_memory_bytes();
  h.gpu.bf16_flops_per_s = flops;
  h.gpu.hbm_Bps = mem_Bps;
  h.gpu.gemm_half_rows = half_rows;
  h.gpu_numa = {0};
  h.pcie.generation = cuda ? 4 : 1;  // CPU: no link; 1 is the loader's minimum
  h.pcie.h2d_Bps = h2d_Bps;
  h.pcie.d2h_Bps = d2h_Bps;
  h.pcie.latency_s = 1e-6;
  h.fabric.kind = FabricKind::kPciePeer;
  h.fabric.per_gpu_Bps = h2d_Bps;
  h.fabric.latency_s = 1e-5;
  NumaSpec numa;
  numa.dram_bytes = physical_memory_bytes();
  numa.dram_Bps = dram_Bps;
  numa.cores = cores;
  numa.adamw_params_per_s = static_cast<double>(np) / adam_s;
  h.numa = {numa};
  const std::string how = "measured by oom calibrate --backend: ";
  h.sources = {
      {"gpu.hbm_gib", cuda ? "estimate: 80 GiB device" : "sysconf: physical memory"},
      {"gpu.bf16_flops", how + fmt::format("best of repeated {}x{} {} GEMMs", n, n, cuda ? "BF16" : "FP32")},
      {"gpu.hbm_Bps", how + "best 128 MiB device copy (read + write)"},
      {"gpu.gemm_half_rows", how + fmt::format("rate of [m, {0}] x [{0}, {0}] products at m = 8 to 1024, fitted as 1/rate = (1 + half/m) / plateau", w)},
      {"gpu_numa", "one compute device on socket 0"},
      {"pcie.h2d_Bps", how + (cuda ? "128 MiB pinned host-to-device copy" : "half the DRAM copy rate (a CPU transfer is a copy)")},
      {"pcie.d2h_Bps", how + (cuda ? "128 MiB device-to-pinned-host copy" : "half the DRAM copy rate (a CPU transfer is a copy)")},
      {"pcie.generation", cuda ? "estimate: PCIe Gen4 or later" : "no PCIe link: the CPU compute device reads host memory directly (1 is the loader's minimum)"},
      {"pcie.latency_s", "estimate: 1 us per copy"},
      {"fabric.per_gpu_Bps", "estimate: as the link (one device)"},
      {"fabric.latency_s", "estimate: 10 us"},
      {"numa.dram_gib", "sysconf: physical memory"},
      {"numa.dram_Bps", how + "best 128 MiB host copy (read + write)"},
      {"numa.cores", "std::thread::hardware_concurrency"},
      {"numa.adamw_params_per_s", how + "backend CPU AdamW over 8 Mi FP32 parameters"}};
  return h;
}

std::vector<LocalRun> default_local_runs() {
  auto local = [] {
    Plan p;
    p.path = ExpertPath::kLocal;
    return p;
  };
  struct Variant {
    const char* tag;
    Plan plan;
  };
  std::vector<Variant> variants;
  variants.push_back({"plain", local()});
  {
    Plan p = local();
    p.split.sub_batch_seqs = 2;
    p.split.attention_head_group = 1;
    variants.push_back({"split", p});
  }
  {
    Plan p = local();
    p.split.gdn_chunk_tokens = 32;
    p.split.moe_chunk_tokens = 64;
    variants.push_back({"chunks", p});
  }
  {
    Plan p = local();
    p.keep_attention_results = true;
    p.boundaries.host_kept_all = false;
    p.boundaries.host_kept = {0};
    p.boundaries.regenerate_cap = 1;
    variants.push_back({"keep-replay", p});
  }
  {
    Plan p = local();
    p.boundaries.host_kept_all = false;
    p.boundaries.gpu_held = {0, 1};
    p.boundaries.regenerate_cap = 2;
    variants.push_back({"held", p});
  }
  {
    // The EP path on one rank: dispatch rounds, a resident expert bank, a retained MoE.
    Plan p;
    p.path = ExpertPath::kEp;
    p.routing_chunk_tokens = 128;
    p.resident_layers = {0};
    p.moe_retained_layers = {1};
    p.boundaries.host_kept_all = false;
    p.boundaries.host_kept = {0};
    variants.push_back({"ep", p});
  }
  struct Shape {
    const char* tag;
    std::int64_t batch, seq;
  };
  const std::vector<Shape> shapes = {{"b4s64", 4, 64}, {"b8s128", 8, 128}};
  std::vector<LocalRun> runs;
  std::size_t grid = 0;  // the (model, shape) cell
  for (const char* model : {"tiny-moe", "tiny-moe-qwen", "tiny-moe-mixtral", "tiny-moe-gemma"}) {
    for (const auto& s : shapes) {
      for (std::size_t v = 0; v < variants.size(); ++v) {
        runs.push_back({fmt::format("{}-{}-{}", model, s.tag, variants[v].tag), model, s.batch, s.seq, variants[v].plan,
                        (v + grid) % 3 == 2});
      }
      ++grid;
    }
  }
  return runs;
}

namespace {

// One record's run in a child process forked from the recording process (whose heap has not run a
// trainer), so that every run starts from the same process state. Run one after another in one
// process, a record's steps depend on the records before it: glibc sizes its mmap and trim
// thresholds from the blocks freed so far, and the steps paid page faults a training process in
// its steady state does not (with those thresholds pinned, the 48 recorded steps came out 11 %
// faster at the median record; forked children measure that same level, 0.99×). A forked child
// is a training process of its own, as `oom train` is. The child reports through a pipe its median
// step, device peak and compute breakdown (JSON), or one line of error text.
struct ChildRun {
  double step_s = 0;
  double gpu_peak_gib = -1;
  std::map<std::string, double> compute_s;  // Measured::compute_s of the traced step
};

ChildRun child_run_of(const Measurement& m) {
  ChildRun r;
  r.step_s = m.step_s;
  if (!m.gpu_peak_bytes.empty()) r.gpu_peak_gib = to_gib(m.gpu_peak_bytes[0]);
  r.compute_s = busy_by_direction_and_kind(m.trace, gpu_compute_resource_name(0));
  return r;
}

ChildRun run_in_child(TorchExecutor& ex, const Plan& plan, const WorkloadContext& ctx, const std::string& id) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error(fmt::format("{}: cannot create a pipe for the measured run", id));
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw std::runtime_error(fmt::format("{}: cannot fork the measured run", id));
  }
  if (pid == 0) {
    close(fds[0]);
    std::string payload;
    int code = 0;
    try {
      const ChildRun r = child_run_of(ex.run(plan, ctx, {}));
      payload = nlohmann::json{{"step_s", r.step_s}, {"gpu_peak_gib", r.gpu_peak_gib}, {"compute_s", r.compute_s}}.dump();
    } catch (const std::exception& e) {
      payload = e.what();
      code = 1;
    }
    for (std::size_t done = 0; done < payload.size();) {
      const auto n = write(fds[1], payload.data() + done, payload.size() - done);
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    close(fds[1]);
    _exit(code);
  }
  close(fds[1]);
  std::string got;
  char buf[4096];
  for (;;) {
    const auto n = read(fds[0], buf, sizeof buf);
    if (n > 0) {
      got.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status)) throw std::runtime_error(fmt::format("{}: the measured run was killed (signal {})", id, WTERMSIG(status)));
  if (WEXITSTATUS(status) != 0) throw std::runtime_error(fmt::format("{}: {}", id, got.empty() ? "the measured run failed" : got));
  const auto j = nlohmann::json::parse(got, nullptr, false);
  if (!j.is_object() || !j.contains("step_s")) throw std::runtime_error(fmt::format("{}: the measured run reported nothing", id));
  ChildRun r;
  r.step_s = j["step_s"].get<double>();
  r.gpu_peak_gib = j["gpu_peak_gib"].get<double>();
  r.compute_s = j["compute_s"].get<std::map<std::string, double>>();
  return r;
}

}  // namespace

RecordSet record_local_steps(const std::vector<LocalRun>& runs, const std::string& hardware, int measured_steps,
                             int threads, bool cpu_time) {
  // Rounds: each round runs every record once (two warm-up steps, then the median of three
  // measured steps), and a record's time is its fastest round. On the CPU each run is a child
  // process of its own (run_in_child); a CUDA context does not survive fork(), so with CUDA the
  // runs share this process. The fastest round, not the median: on this shared two-core machine
  // a run's CPU time spreads widely from round to round (other tenants' load on the caches it
  // shares), and interference only adds time. Over 16 rounds of the 48 records, the fastest round
  // of the odd rounds and of the even rounds differ by 3.0 % at the median record (26 % at most);
  // their medians by 9.3 % (50 %) (backend/README.md).
  TorchExecutorOptions eo;
  const bool cuda = at::hasCUDA();
  if (cpu_time && !cuda) eo.clock = TorchExecutorOptions::Clock::kProcessCpu;
  eo.warmup_steps = 2;
  eo.measured_steps = 3;
  eo.threads = threads;
  TorchExecutor ex(eo);
  std::vector<WorkloadContext> contexts;
  for (const auto& r : runs) {
    WorkloadContext ctx;
    ctx.workload.model = r.model;
    ctx.workload.hardware = hardware;
    ctx.workload.gpus = 1;
    ctx.workload.global_batch = r.batch;
    ctx.workload.seq_len = r.seq;
    ctx.model = load_model_spec(r.model);
    // Refused here, with the plan's field named, rather than as a child's text.
    check_plan_for_run(r.plan, ctx.model, r.batch, r.seq, 1, r.id);
    contexts.push_back(std::move(ctx));
  }
  std::vector<std::vector<double>> times(runs.size());
  std::vector<double> gpu_peak_gib(runs.size(), -1.0);
  std::vector<std::map<std::string, double>> breakdown(runs.size());
  for (int round = 0; round < std::max(1, measured_steps); ++round) {
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const ChildRun m = cuda ? child_run_of(ex.run(runs[i].plan, contexts[i], {}))
                              : run_in_child(ex, runs[i].plan, contexts[i], runs[i].id);
      times[i].push_back(m.step_s);
      gpu_peak_gib[i] = std::max(gpu_peak_gib[i], m.gpu_peak_gib);
      // Each kind's fastest round, like the step's.
      for (const auto& [key, seconds] : m.compute_s) {
        const auto [it, added] = breakdown[i].emplace(key, seconds);
        if (!added) it->second = std::min(it->second, seconds);
      }
    }
  }
  RecordSet out;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    StepRecord rec;
    rec.id = runs[i].id;
    rec.source = fmt::format(
        "oom calibrate --backend: fastest {} over {} rounds (each round every record once, {}: two warm-up "
        "steps, then the median of three measured steps), {} LibTorch threads; compute_s: the traced step after "
        "them, each kind's fastest round",
        eo.clock == TorchExecutorOptions::Clock::kProcessCpu ? "process CPU time" : "wall time", times[i].size(),
        cuda ? "in this process" : "each in a process of its own",
        at::get_num_threads());
    rec.workload = contexts[i].workload;
    rec.plan = plan_to_json(runs[i].plan);
    rec.measured.step_s = *std::min_element(times[i].begin(), times[i].end());
    rec.measured.compute_s = breakdown[i];
    if (gpu_peak_gib[i] >= 0) rec.measured.gpu_peak_gib = gpu_peak_gib[i];
    out.steps.push_back(std::move(rec));
  }
  return out;
}

}  // namespace oom::backend
