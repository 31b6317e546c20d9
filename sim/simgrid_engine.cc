#include "sim/simgrid_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <simgrid/s4u.hpp>

#include "costmodel/input_error.h"
#include "sim/isolated_run.h"

namespace oom {

std::unique_ptr<StepEngine> make_simgrid_engine() { return std::make_unique<sim::SimGridEngine>(); }

StepEngines simulator_engines() { return StepEngines().add("simgrid", make_simgrid_engine); }

}  // namespace oom

namespace oom::sim {
namespace {

constexpr Seconds kTimingPrecision_s = 1e-9;
// Any multiple of the GPUs and nodes of a cluster: the pairwise rotation's modulus.
constexpr int kRotation = 1 << 24;

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

bool is_cpu_resource(ResourceKind k) { return k == ResourceKind::kCpuUpdate || k == ResourceKind::kHostPrep; }

std::uint64_t flow_bytes(double bytes) { return bytes <= 0 ? 0 : static_cast<std::uint64_t>(std::llround(bytes)); }

// One simulation of one graph, run inside an isolated process (it creates the process's engine).
class Simulation {
 public:
  Simulation(const StepGraph& g, const std::vector<StageCost>& costs, const HardwareSpec& hw, const PlatformRates& rates,
             std::vector<int> rank_gpu)
      : g_(g), costs_(costs), hw_(hw), rates_(rates), rank_gpu_(std::move(rank_gpu)) {}

  // Runs the step; fills start_s / finish_s. Throws std::runtime_error if a stage never ran.
  void run() {
    int argc = 1;
    char program[] = "oom-simgrid";
    char* argv[] = {program, nullptr};
    // Never destroyed: the isolated process exits right after the run, and tearing the engine
    // down before the semaphores and hosts that still refer to it is not needed.
    auto* engine = new sg4::Engine(&argc, argv);
    configure_engine();
    platform_ = std::make_unique<Platform>(hw_, rates_, PlatformOptions{.link_latencies = false});

    const std::size_t n = g_.stages.size();
    start_s.assign(n, 0.0);
    finish_s.assign(n, 0.0);
    done_.assign(n, 0);
    // A semaphore for every stage that a stage of another resource waits for, released once per
    // waiting edge: the simulated CUDA event.
    releases_.assign(n, 0);
    plan_joins();
    for (const Stage& s : g_.stages) {
      if (join_of_[at(s.id)] >= 0) continue;  // its join acquires them
      for (const StageId u : s.deps) {
        if (g_.stage(u).resource != s.resource) ++releases_[at(u)];
      }
    }
    for (Join& j : joins_) {
      for (const StageId u : j.deps) ++releases_[at(u)];
      j.ready = sg4::Semaphore::create(0);
    }
    events_.resize(n);
    for (std::size_t v = 0; v < n; ++v) {
      if (releases_[v] > 0) events_[v] = sg4::Semaphore::create(0);
    }
    for (const Resource& r : g_.resources) {
      if (r.order.empty()) continue;
      sg4::Actor::create(r.name, actor_host(r), [this, &r] { walk(r); });
      if (is_cpu_resource(r.kind)) {
        int flows = 0;
        for (const StageId v : r.order) flows += dram_flow_bytes(g_.stage(v)) > 0 ? 1 : 0;
        if (flows > 0) {
          sg4::Actor::create(r.name + ".dram", memory_host(r), [this, &r, flows] {
            sg4::Mailbox* box = sg4::Mailbox::by_name(r.name + ".dram");
            for (int i = 0; i < flows; ++i) box->get<int>();
          });
        }
      }
    }
    engine->run();
    for (std::size_t v = 0; v < n; ++v) {
      if (!done_[v]) throw std::runtime_error(fmt::format("stage {} ('{}') never ran", v, g_.stages[v].name));
    }
  }

  std::vector<Seconds> start_s;
  std::vector<Seconds> finish_s;

 private:
  int global_gpu(int rank) const { return rank_gpu_.at(at(rank)); }
  int node_of_rank(int rank) const { return platform_->node_of_gpu(global_gpu(rank)); }
  // The resource's socket within its node (Resource::numa counts over the cluster, node-major).
  int numa_of(const Resource& r) const {
    return r.numa >= 0 ? r.numa % platform_->numa_per_node() : platform_->numa_of_gpu(global_gpu(r.gpu));
  }

  sg4::Host* actor_host(const Resource& r) const {
    if (is_cpu_resource(r.kind)) return platform_->socket(node_of_rank(r.gpu), numa_of(r));
    return platform_->gpu(global_gpu(r.gpu));
  }
  sg4::Host* memory_host(const Resource& r) const { return platform_->memory(node_of_rank(r.gpu), numa_of(r)); }

  // DRAM bytes of a CPU stage that does work.
  Bytes dram_flow_bytes(const Stage& s) const {
    const StageCost& c = costs_[at(s.id)];
    return c.work > 0 ? cpu_stage_dram_bytes(s) : 0;
  }

  void walk(const Resource& r) {
    for (const StageId v : r.order) run_stage(g_.stage(v), r);
  }

  // Stages that wait for the same many stages of other resources (the members of a collective,
  // each waiting for every member's input) wait through one join: the first to arrive acquires the
  // inputs once and releases the others, who wait for it alone. Same times; P acquisitions per
  // collective instead of P² simulated waits.
  struct Join {
    std::vector<StageId> deps;  // the stages of other resources waited for
    int waiters = 0;
    bool started = false;
    sg4::SemaphorePtr ready;
  };
  static constexpr std::size_t kJoinMinDeps = 4;

  void plan_joins() {
    join_of_.assign(g_.stages.size(), -1);
    std::map<std::vector<StageId>, int> by_deps;
    for (const Stage& s : g_.stages) {
      std::vector<StageId> c;
      for (const StageId u : s.deps) {
        if (g_.stage(u).resource != s.resource) c.push_back(u);
      }
      if (c.size() < kJoinMinDeps) continue;
      const auto [it, added] = by_deps.emplace(c, static_cast<int>(joins_.size()));
      if (added) joins_.push_back(Join{c, 0, false, nullptr});
      ++joins_[static_cast<std::size_t>(it->second)].waiters;
      join_of_[at(s.id)] = it->second;
    }
    // A join of one stage is that stage's own waits.
    std::vector<int> index(joins_.size(), -1);
    std::vector<Join> kept;
    for (std::size_t j = 0; j < joins_.size(); ++j) {
      if (joins_[j].waiters > 1) {
        index[j] = static_cast<int>(kept.size());
        kept.push_back(std::move(joins_[j]));
      }
    }
    joins_ = std::move(kept);
    for (int& j : join_of_) {
      if (j >= 0) j = index[static_cast<std::size_t>(j)];
    }
  }

  void run_stage(const Stage& s, const Resource& r) {
    const std::size_t v = at(s.id);
    if (const int j = join_of_[v]; j >= 0) {
      Join& join = joins_[static_cast<std::size_t>(j)];
      if (!join.started) {
        join.started = true;
        for (const StageId u : join.deps) events_[at(u)]->acquire();
        for (int i = 1; i < join.waiters; ++i) join.ready->release();
      } else {
        join.ready->acquire();
      }
    } else {
      for (const StageId u : s.deps) {
        if (g_.stage(u).resource != s.resource) events_[at(u)]->acquire();
      }
    }
    start_s[v] = sg4::Engine::get_clock();
    const StageCost& c = costs_[v];
    // SimGrid times are accurate to 1 ns ("precision/timing"); shorter waits are not simulated.
    if (c.fixed_s >= kTimingPrecision_s) sg4::this_actor::sleep_for(c.fixed_s);
    const Seconds alone_s = c.work > 0 && c.exclusive_rate > 0 ? c.work / c.exclusive_rate : 0.0;
    if (alone_s > 0) do_work(s, r, alone_s);
    finish_s[v] = sg4::Engine::get_clock();
    done_[v] = 1;
    for (int i = 0; i < releases_[v]; ++i) events_[v]->release();
  }

  void do_work(const Stage& s, const Resource& r, Seconds alone_s) {
    switch (r.kind) {
      case ResourceKind::kGpuCompute:
        sg4::this_actor::execute(alone_s * sg4::this_actor::get_host()->get_speed());
        return;
      case ResourceKind::kH2d: {
        const std::uint64_t bytes = flow_bytes(alone_s * rates_.h2d_Bps);
        if (bytes > 0) sg4::Comm::sendto(memory_host(r), platform_->gpu(global_gpu(r.gpu)), bytes);
        return;
      }
      case ResourceKind::kD2h:
      case ResourceKind::kExpertGradD2h: {
        const std::uint64_t bytes = flow_bytes(alone_s * rates_.d2h_Bps);
        if (bytes > 0) sg4::Comm::sendto(platform_->gpu(global_gpu(r.gpu)), memory_host(r), bytes);
        return;
      }
      case ResourceKind::kFabric:
        collective(s, r, alone_s);
        return;
      case ResourceKind::kCpuUpdate:
      case ResourceKind::kHostPrep:
        cpu_task(s, r, alone_s);
        return;
    }
  }

  // Each member sends an even share of its bytes to every other member; alone on its port the
  // flows end after alone_s. All-gather and reduce-scatter spanning nodes run as NCCL's rings (a
  // channel per NIC), whose inter-node hops carry, over all channels, what one member sends: each
  // member sends 1/(its node's members) of its bytes to the members on other nodes, the rest to
  // its node's members (the duration model's ring, planner/engine/duration_model.h).
  // Within one node every share is in flight at once (PCIe peer fabrics need the concurrency:
  // shared switches and root complex). Across nodes the node's shares go as a chain over the
  // fabric, a pairwise exchange (step k sends to the k-th next member, so that in every step each
  // port sends one share and receives one: on an NVSwitch a port carries the same bytes at the
  // same rate as with every share in flight), and the shares for the other nodes as one flow to
  // the network and one from it, through the node's NICs (and its shares of the uplinks of each
  // tier the farthest member is beyond): what the member sends and, the exchange being even, what
  // it receives. The simulation then holds three flows per member, however many nodes (SimGrid
  // 3.32's cost of ending a flow grows with the flows alive).
  void collective(const Stage& s, const Resource& r, Seconds alone_s) {
    const int self = global_gpu(r.gpu);
    std::vector<int> here;  // the other members on this node (global GPUs)
    const CollectiveReach reach = collective_reach(hw_, s.peers, r.gpu, [&](int q) { here.push_back(global_gpu(q)); });
    const int away = reach.off_node;  // the members on other nodes
    // The most switches to one of them (NetworkSpec::switches_between).
    const int switches = reach.farthest_node < 0 ? 1
                                                 : std::max(1, hw_.network.switches_between(r.gpu / hw_.gpus_per_node, reach.farthest_node));
    if (here.empty() && away == 0) {
      if (alone_s >= kTimingPrecision_s) sg4::this_actor::sleep_for(alone_s);
      return;
    }
    const double bytes = alone_s * rates_.fabric_Bps;
    const bool ring = s.op != OpKind::kAllToAll && away > 0;
    const double others = static_cast<double>(here.size()) + away;
    const double away_bytes = ring ? bytes / static_cast<double>(here.size() + 1) : bytes * away / others;
    const std::uint64_t here_share = here.empty() ? 0 : flow_bytes((bytes - away_bytes) / static_cast<double>(here.size()));
    sg4::Host* gpu = platform_->gpu(self);
    if (away == 0) {
      std::vector<sg4::CommPtr> flows;
      for (const int gp : here) flows.push_back(sg4::Comm::sendto_async(gpu, platform_->gpu(gp), here_share));
      sg4::Comm::wait_all(flows);
      return;
    }
    std::vector<sg4::CommPtr> flows;
    const std::uint64_t network = flow_bytes(away_bytes);
    if (network > 0) {
      // Through the farthest tier its shares cross, as the duration model prices them (its
      // sustained rate over every off-node peer).
      sg4::Host* beyond = platform_->network(switches);
      flows.push_back(sg4::Comm::sendto_async(gpu, beyond, network));
      flows.push_back(sg4::Comm::sendto_async(beyond, gpu, network));
    }
    // The fabric chain: the k-th next member of the node in step k.
    std::sort(here.begin(), here.end(), [&](int a, int b) { return (a - self + kRotation) % kRotation < (b - self + kRotation) % kRotation; });
    std::size_t next = 0;
    std::size_t chain = flows.size();  // the index of the chain's flow in `flows`, when it has one
    auto start_chain = [&] {
      if (here_share == 0 || next >= here.size()) return false;
      flows.push_back(sg4::Comm::sendto_async(gpu, platform_->gpu(here[next++]), here_share));
      chain = flows.size() - 1;
      return true;
    };
    bool chained = start_chain();
    while (!flows.empty()) {
      const auto i = static_cast<std::size_t>(sg4::Comm::wait_any(flows));
      flows.erase(flows.begin() + static_cast<std::ptrdiff_t>(i));
      if (chained && i == chain) {
        chained = start_chain();
      } else if (chained && i < chain) {
        --chain;
      }
    }
  }

  // Arithmetic on every core of the socket, and the task's DRAM traffic at no more than the rate
  // it draws alone.
  void cpu_task(const Stage& s, const Resource& r, Seconds alone_s) {
    sg4::Host* socket = sg4::this_actor::get_host();
    const int cores = socket->get_core_count();
    sg4::ExecPtr exec = sg4::Exec::init()
                            ->set_host(socket)
                            ->set_flops_amount(alone_s * socket->get_speed())
                            ->set_thread_count(cores);
    exec->start();
    const Bytes dram = dram_flow_bytes(s);
    if (dram > 0) {
      static const int token = 0;
      sg4::Mailbox* box = sg4::Mailbox::by_name(r.name + ".dram");
      sg4::CommPtr flow = box->put_init(const_cast<int*>(&token), static_cast<std::uint64_t>(dram));
      flow->set_rate(static_cast<double>(dram) / alone_s);
      flow->start();
      flow->wait();
    }
    exec->wait();
  }

  const StepGraph& g_;
  const std::vector<StageCost>& costs_;
  const HardwareSpec& hw_;
  PlatformRates rates_;
  std::vector<int> rank_gpu_;
  std::unique_ptr<Platform> platform_;
  std::vector<int> releases_;
  std::vector<sg4::SemaphorePtr> events_;
  std::vector<Join> joins_;
  std::vector<int> join_of_;  // per stage: its join, or −1
  std::vector<char> done_;
};

void append_doubles(std::string& out, const std::vector<double>& v) {
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(double));
}

std::vector<double> read_doubles(const std::string& in, std::size_t offset, std::size_t count) {
  std::vector<double> v(count);
  std::memcpy(v.data(), in.data() + offset, count * sizeof(double));
  return v;
}

// A simulation's input as bytes, for the simulation server (sim/isolated_run.h): the HardwareSpec
// (as its JSON), then what Simulation reads of the rest (simulation_fields). Plain values in native
// byte order: writer and reader are the same program.
class RequestWriter {
 public:
  template <typename T>
  void field(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void field(const std::string& v) {
    size(v);
    out += v;
  }
  template <typename T>
  void field(const std::vector<T>& v) {
    size(v);
    for (const T& x : v) field(x);
  }
  // A collective's members once per list: its index among the lists written, the ranks the first time.
  void field(const PeerList& v) {
    const auto [it, fresh] = lists_.emplace(v.identity(), lists_.size());
    field<std::uint64_t>(it->second);
    if (fresh) field(v.ranks());
  }
  template <typename V>
  void size(const V& v) {
    field<std::uint64_t>(v.size());
  }
  std::string out;

 private:
  std::map<const void*, std::uint64_t> lists_;
};

class RequestReader {
 public:
  explicit RequestReader(const std::string& in) : in_(in) {}
  template <typename T>
  void field(T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    take(reinterpret_cast<char*>(&v), sizeof v);
  }
  void field(std::string& v) {
    size(v);
    take(v.data(), v.size());
  }
  template <typename T>
  void field(std::vector<T>& v) {
    size(v);
    for (T& x : v) field(x);
  }
  void field(PeerList& v) {
    std::uint64_t i = 0;
    field(i);
    if (i > lists_.size()) throw std::runtime_error("malformed simulation request");
    if (i == lists_.size()) {
      std::vector<int> ranks;
      field(ranks);
      lists_.emplace_back(std::move(ranks));
    }
    v = lists_[i];
  }
  // Reads a count and sizes `v` to it (at most what is left of the request: one byte an element).
  template <typename V>
  void size(V& v) {
    std::uint64_t n = 0;
    field(n);
    if (n > in_.size() - pos_) throw std::runtime_error("truncated simulation request");
    v.resize(n);
  }

 private:
  void take(char* data, std::size_t n) {
    if (n > in_.size() - pos_) throw std::runtime_error("truncated simulation request");
    std::memcpy(data, in_.data() + pos_, n);
    pos_ += n;
  }
  const std::string& in_;
  std::size_t pos_ = 0;
  std::vector<PeerList> lists_;  // the collectives' member lists read so far
};

// What Simulation reads besides the HardwareSpec, in one order for writing and for reading: the
// rates, the ranks' GPUs, the graph's resources and its stages' names, resources, demand, peers
// and dependencies, and the stage costs.
template <typename Io, typename Rates, typename Ranks, typename Graph, typename Costs>
void simulation_fields(Io& io, Rates& rates, Ranks& rank_gpu, Graph& g, Costs& costs) {
  io.field(rates.gpu_flops_per_s);
  io.field(rates.h2d_Bps);
  io.field(rates.d2h_Bps);
  io.field(rates.fabric_Bps);
  io.field(rates.network_Bps);
  io.field(rates.dram_Bps);
  io.field(rates.socket_params_per_s);
  io.field(rank_gpu);
  io.field(g.gpus);
  io.size(g.resources);
  for (auto& r : g.resources) {
    io.field(r.id);
    io.field(r.kind);
    io.field(r.name);
    io.field(r.gpu);
    io.field(r.numa);
    io.field(r.order);
  }
  io.size(g.stages);
  for (auto& st : g.stages) {
    io.field(st.id);
    io.field(st.name);
    io.field(st.resource);
    io.field(st.op);
    io.field(st.bytes);
    io.field(st.params);
    io.field(st.peers);
    io.field(st.deps);
  }
  io.field(costs);
}

// Simulates one step and appends its stage starts and finishes to `out`, in the isolated process.
void simulate_into(const StepGraph& g, const std::vector<StageCost>& costs, const HardwareSpec& hw, const PlatformRates& rates,
                   std::vector<int> rank_gpu, std::string& out) {
  Simulation sim(g, costs, hw, rates, std::move(rank_gpu));
  sim.run();
  append_doubles(out, sim.start_s);
  append_doubles(out, sim.finish_s);
}

// `hw` as the JSON a request carries, when it reads back as it is; nothing for a spec built in
// code that the reader would refuse or change (it is simulated in place instead).
std::optional<std::string> travelling_json(const HardwareSpec& hw) {
  try {
    std::string text = hardware_spec_to_json(hw).dump();
    if (hardware_spec_from_json(nlohmann::json::parse(text), "simulation request") == hw) return text;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::string encode_request(const StepGraph& g, const std::vector<StageCost>& costs, const std::string& hw_json,
                           const PlatformRates& rates, const std::vector<int>& rank_gpu) {
  RequestWriter w;
  w.field(hw_json);
  simulation_fields(w, rates, rank_gpu, g, costs);
  return std::move(w.out);
}

// The server's handler: decodes a request and simulates it, as simulate_times() does in place.
void simulate_request(const std::string& request, std::string& out) {
  RequestReader r(request);
  std::string hw_json;
  r.field(hw_json);
  const HardwareSpec hw = hardware_spec_from_json(nlohmann::json::parse(hw_json), "simulation request");
  PlatformRates rates;
  std::vector<int> rank_gpu;
  StepGraph g;
  std::vector<StageCost> costs;
  simulation_fields(r, rates, rank_gpu, g, costs);
  simulate_into(g, costs, hw, rates, std::move(rank_gpu), out);
}

}  // namespace

bool start_simulation_server() { return start_isolated_server(simulate_request); }

std::vector<int> rank_global_gpus(const HardwareSpec& h, int ranks) {
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(std::max(0, ranks)));
  for (int r = 0; r < ranks; ++r) out.push_back(h.global_gpu_of_rank(r, ranks));
  return out;
}

SimGridEngine::SimGridEngine(HardwareSpec hardware, std::optional<Calibration> calibration)
    : hardware_(std::move(hardware)), calibration_(std::move(calibration)) {}

StageTimes SimGridEngine::simulate_times(const StepGraph& g, const DurationModel& durations) const {
  // A graph of one node's stages (StepGraph::ranks_emitted) simulates that node alone: its members
  // reach the other nodes through its own NICs and its own shares of the tiers' uplinks, which no
  // other node's flow crosses (sim/platform.h), so every other node would run the same flows at
  // the same times.
  const auto* calibrated = dynamic_cast<const CalibratedDurationModel*>(&durations);
  const HardwareSpec* hw = hardware_ ? &*hardware_ : calibrated ? &calibrated->hardware() : nullptr;
  if (hw == nullptr) {
    throw std::invalid_argument("the simgrid engine needs a HardwareSpec: construct it with one or pass a CalibratedDurationModel");
  }
  if (g.gpus > hw->total_gpus()) {
    throw std::invalid_argument(fmt::format("the step has {} ranks but hardware '{}' has {} GPUs", g.gpus, hw->name, hw->total_gpus()));
  }
  for (const Resource& r : g.resources) {
    if (r.gpu < 0 || r.gpu >= g.gpus || r.numa >= hw->host_numa_count(g.gpus)) {
      throw std::invalid_argument(fmt::format("resource '{}' (rank {}, NUMA node {}) does not fit the {} ranks and {} NUMA nodes of '{}'",
                                              r.name, r.gpu, r.numa, g.gpus, hw->host_numa_count(g.gpus), hw->name));
    }
  }
  const Calibration cal = calibration_ ? *calibration_ : calibrated ? calibrated->calibration() : default_calibration(*hw);
  const PlatformRates rates = platform_rates(*hw, cal);
  std::vector<StageCost> costs;
  costs.reserve(g.stages.size());
  for (const Stage& s : g.stages) costs.push_back(durations.cost(s, g));
  const std::vector<int> rank_gpu = rank_global_gpus(*hw, g.gpus);

  // Through the simulation server where one runs (the same simulation of the same input), else
  // in a child forked from here.
  const std::optional<std::string> hw_json = isolated_server_running(simulate_request) ? travelling_json(*hw) : std::nullopt;
  const std::string bytes = hw_json ? run_isolated_request(simulate_request, encode_request(g, costs, *hw_json, rates, rank_gpu))
                                    : run_isolated([&](std::string& out) { simulate_into(g, costs, *hw, rates, rank_gpu, out); });
  const std::size_t n = g.stages.size();
  if (bytes.size() != 2 * n * sizeof(double)) throw std::runtime_error("simulation failed: truncated stage times");
  StageTimes t;
  t.start_s = read_doubles(bytes, 0, n);
  t.finish_s = read_doubles(bytes, n * sizeof(double), n);
  for (const Seconds f : t.finish_s) t.step_s = std::max(t.step_s, f);
  return t;
}

Trace SimGridEngine::execute(const StepGraph& g, const DurationModel& durations) const {
  const StageTimes times = simulate_times(g, durations);
  return trace_of_times(g, times, name());
}

}  // namespace oom::sim
