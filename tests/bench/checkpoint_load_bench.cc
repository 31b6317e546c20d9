// Loading a Hugging Face checkpoint folder (backend/io) into FP32 host memory, against reading
// the same files with plain read() calls. Setup writes a sharded BF16 folder of
// OOM_IO_BENCH_MIB MiB of tensor data (default 1024, 4 shards, 64 MiB tensors) and an FP32 folder
// of the same bytes in a temporary folder; the files are in the page cache (just written), so all
// three measure memory-side costs, not the disk:
//   (a) ReadFiles: read() of every file into one reused 8 MiB buffer;
//   (b) LoadBf16:  CheckpointFolder + read_tensor_f32 of every tensor into one preallocated FP32
//       buffer (straight from the mapping, pages released as converted);
//   (c) LoadF32:   the same for the FP32 folder.
// The loads run on 1 and 2 threads (the argument; tensors dealt out round-robin).
// Throughput is in bytes of file per second. Each load also reports its peak resident memory
// (VmHWM, reset before the load through /proc/self/clear_refs) over the FP32 buffer's size. The
// program ends with (b)/(a), (c)/(a) and the peak RSS ratio (targets: ≥ 0.70 and ≤ 1.10).
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backend/io/checkpoint_folder.h"
#include "tests/bench/bench_ratios.h"

namespace {

namespace fs = std::filesystem;
using namespace oom::io;

std::uint64_t bench_bytes() {
  const char* env = std::getenv("OOM_IO_BENCH_MIB");
  const std::uint64_t mib = env != nullptr && *env != '\0' ? std::max(64ll, std::atoll(env)) : 1024;
  return mib << 20;
}
constexpr std::uint64_t kTensorBytes = 64ull << 20;
constexpr int kShards = 4;

struct Folders {
  fs::path root;
  std::string bf16, f32;
  std::uint64_t bytes = 0;  // tensor bytes in each folder
  Folders() {
    std::string tmpl = (fs::temp_directory_path() / "oom-checkpoint-bench-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    root = tmpl;
    bf16 = (root / "bf16").string();
    f32 = (root / "f32").string();
    bytes = bench_bytes() / kTensorBytes * kTensorBytes;
    for (const DType dtype : {DType::BF16, DType::F32}) {
      const std::int64_t elems = static_cast<std::int64_t>(kTensorBytes / dtype_size(dtype));
      std::vector<TensorToWrite> tensors;
      for (std::uint64_t k = 0; k < bytes / kTensorBytes; ++k) {
        tensors.push_back({fmt::format("model.layers.{}.mlp.experts.weight", k), dtype, {elems / 1024, 1024},
                           [elems, dtype, k](std::byte* dst) {
                             std::vector<float> v(static_cast<std::size_t>(elems));
                             for (std::int64_t i = 0; i < elems; ++i) v[i] = static_cast<float>((i * 7 + k) % 1001) * 1e-3f;
                             convert_from_f32(v.data(), elems, dtype, dst);
                           },
                           nullptr});
      }
      write_checkpoint_folder(dtype == DType::BF16 ? bf16 : f32, {{"model_type", "bench"}}, std::move(tensors),
                              bytes / kShards);
    }
  }
  ~Folders() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

Folders& folders() {
  static Folders f;
  return f;
}

std::uint64_t vm_hwm_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) << 10;
  }
  return 0;
}
void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

void BM_ReadFiles(benchmark::State& state) {
  const CheckpointFolder folder(folders().bf16);
  std::vector<std::string> paths;
  std::uint64_t file_bytes = 0;
  for (const auto& f : folder.files()) {
    paths.push_back(f->path());
    file_bytes += f->file_size();
  }
  std::vector<char> buffer(8 << 20);
  for (auto _ : state) {
    for (const std::string& p : paths) {
      const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
      while (::read(fd, buffer.data(), buffer.size()) > 0) {
      }
      ::close(fd);
    }
    benchmark::DoNotOptimize(buffer.data());
  }
  state.counters["file_Bps"] = benchmark::Counter(static_cast<double>(file_bytes), benchmark::Counter::kIsIterationInvariantRate);
}

void load(benchmark::State& state, const std::string& dir) {
  const std::uint64_t elems = [&] {
    const CheckpointFolder f(dir);
    std::uint64_t n = 0;
    for (const auto& name : f.tensor_names()) n += static_cast<std::uint64_t>(f.find(name)->info->numel());
    return n;
  }();
  std::vector<float> host(elems, 1.0f);  // the host state, touched before any load
  std::uint64_t file_bytes = 0;
  double peak_ratio = 0;
  const int threads = static_cast<int>(state.range(0));
  for (auto _ : state) {
    reset_peak_rss();
    const CheckpointFolder folder(dir, SafetensorsFile::Access::Sequential);
    // Every tensor in data order with its place in the host buffer; thread i takes tensors
    // i, i + threads, ...
    std::vector<std::pair<TensorLocation, float*>> work;
    float* dst = host.data();
    file_bytes = 0;
    for (const auto& file : folder.files()) {
      file_bytes += file->file_size();
      for (const TensorInfo& t : file->tensors()) {
        work.emplace_back(TensorLocation{file.get(), &t}, dst);
        dst += t.numel();
      }
    }
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) {
      pool.emplace_back([&work, i, threads] {
        for (std::size_t k = static_cast<std::size_t>(i); k < work.size(); k += static_cast<std::size_t>(threads)) {
          read_tensor_f32(work[k].first, work[k].second);
        }
      });
    }
    for (auto& t : pool) t.join();
    benchmark::DoNotOptimize(host.data());
    peak_ratio = std::max(peak_ratio, static_cast<double>(vm_hwm_bytes()) / static_cast<double>(elems * 4));
  }
  state.counters["file_Bps"] = benchmark::Counter(static_cast<double>(file_bytes), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_rss_x"] = peak_ratio;
}

void BM_LoadBf16(benchmark::State& state) { load(state, folders().bf16); }
void BM_LoadF32(benchmark::State& state) { load(state, folders().f32); }

BENCHMARK(BM_ReadFiles)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_LoadBf16)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_LoadF32)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  (void)folders();  // written before any measurement
  oom::bench::RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  const auto* read = reporter.find("BM_ReadFiles");
  const auto* bf16 = reporter.find("BM_LoadBf16/1/");
  const auto* f32 = reporter.find("BM_LoadF32/1/");
  const auto* bf16_2 = reporter.find("BM_LoadBf16/2/");
  const auto* f32_2 = reporter.find("BM_LoadF32/2/");
  if (read != nullptr && bf16 != nullptr && f32 != nullptr) {
    const double r = read->counters.at("file_Bps");
    fmt::print("\n{} MiB of tensors per folder, {} shards, one thread unless said\n", folders().bytes >> 20, kShards);
    fmt::print("read() {:.3g} B/s; BF16 load {:.3g} B/s: ratio {:.2f} (target >= 0.70); FP32 load {:.3g} B/s: ratio {:.2f}\n",
               r, bf16->counters.at("file_Bps"), bf16->counters.at("file_Bps") / r, f32->counters.at("file_Bps"),
               f32->counters.at("file_Bps") / r);
    if (bf16_2 != nullptr && f32_2 != nullptr) {
      fmt::print("two loading threads: BF16 ratio {:.2f}, FP32 ratio {:.2f}\n", bf16_2->counters.at("file_Bps") / r,
                 f32_2->counters.at("file_Bps") / r);
    }
    fmt::print("peak RSS during a load / FP32 buffer: BF16 {:.3f}x, FP32 {:.3f}x (target <= 1.10)\n",
               bf16->counters.at("peak_rss_x"), f32->counters.at("peak_rss_x"));
  }
  benchmark::Shutdown();
  return 0;
}
