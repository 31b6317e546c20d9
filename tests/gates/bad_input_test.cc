// Clear errors for bad outside input, across every loader and command (reliability gate 5).
//
// Each row writes its input files into a fresh folder and runs the `oom` command in-process
// (cli::run) or, for recorded measurements (no command reads them yet), load_records(). Every
// row must be answered by exactly one line on stderr that names the file, the field and the
// value, exit code 2, nothing on stdout, and nothing written: the `-o` file of memory/report is
// left absent or unchanged, and the folder holds no new file (no temporary file either).
// File-level problems (missing, empty, directory, broken JSON at the root) name the file and
// what is wrong with it; there is no field to name. An unknown model name names no file: the
// name is the value.
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "costmodel/hardware_spec.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"
#include "costmodel/model_spec.h"
#include "costmodel/workload.h"
#include "experiments/ablation.h"
#include "experiments/study.h"
#include "planner/calibration/calibration.h"
#include "planner/calibration/explain.h"
#include "planner/plan/plan.h"
#include "traces/records.h"
#include "traces/trace.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kSrc = OOM_SOURCE_DIR;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

json read_json(const std::string& rel) { return json::parse(read_file(fs::path(kSrc) / rel)); }

// A project file with one change, as pretty JSON.
std::string edited(const std::string& rel, const std::function<void(json&)>& edit) {
  json j = read_json(rel);
  edit(j);
  return j.dump(2);
}

const char* kTiny = "configs/models/tiny-moe.json";
const char* kH200 = "configs/hardware/h200-node.json";
const char* kWorkload = "experiments/default/workload.json";
const char* kPlan = "experiments/default/plan-r23.json";
constexpr const char* kDirectory = "\x01directory";  // file content that makes a folder instead
constexpr const char* kFifo = "\x01fifo";            // file content that makes a FIFO (mkfifo) instead

struct Case {
  std::string name;
  std::vector<std::pair<std::string, std::string>> files;  // name in the case folder → content
  std::vector<std::string> args;  // "{dir}" = the case folder, "{src}" = the source root; "@records PATH" = load_records
  std::string file;               // the file the line must name ("" = none)
  std::string field;              // "" = a file-level problem
  std::string value;              // the value as the line prints it
  std::string reason;             // a word of the reason (optional)
  std::vector<std::pair<std::string, std::string>> env = {};  // variables set for the run ("{dir}" substituted)
};

// Commands of each input kind; the file under test is {dir}/x.json.
std::vector<std::string> model_show() { return {"model", "show", "{dir}/m.json"}; }
std::vector<std::string> memory_with_workload() {
  return {"memory", "--workload", "{dir}/w.json", "--plan", "{src}/" + std::string(kPlan)};
}
std::vector<std::string> memory_with_plan() {
  return {"memory", "--workload", "{src}/" + std::string(kWorkload), "--plan", "{dir}/p.json"};
}

// A workload on the H200 node whose hardware is {dir}/hw.json (for hardware rows).
std::string workload_on_hw() {
  return json{{"model", "tiny-moe"}, {"hardware", "{dir}/hw.json"}, {"gpus", 1}, {"global_batch", 2}, {"seq_len", 256}}.dump();
}

// `text` with `insert` written right after the first `anchor` (JSON that nlohmann's dump cannot
// write, such as a key twice in one object).
std::string duplicated(std::string text, const std::string& anchor, const std::string& insert) {
  const auto at = text.find(anchor);
  if (at == std::string::npos) throw std::logic_error("no " + anchor + " in the text");
  return text.insert(at + anchor.size(), insert);
}

std::string workload_with(const std::function<void(json&)>& edit) { return edited(kWorkload, edit); }
std::string plan_with(const std::function<void(json&)>& edit) { return edited(kPlan, edit); }
std::string model_with(const std::function<void(json&)>& edit) { return edited(kTiny, edit); }
std::string hw_with(const std::function<void(json&)>& edit) { return edited(kH200, edit); }

std::string calibration_with(const std::function<void(json&)>& edit) {
  return edited("configs/calibration/h100-sxm-node.json", edit);
}

std::string study_with(const std::function<void(json&)>& edit) { return edited("experiments/paper/fig5a-h100-batch.json", edit); }

std::string first_record_line() {
  std::ifstream in(fs::path(kSrc) / "traces/paper/paper-calibration.jsonl");
  std::string line;
  while (std::getline(in, line) && (line.empty() || line[0] == '#')) {
  }
  return line;
}
std::string record_with(const std::function<void(json&)>& edit) {
  json j = json::parse(first_record_line());
  edit(j);
  return j.dump();
}

// A study CSV as study_csv() writes it: one baseline; the OOM plan of line 2 beats the baseline,
// line 3's baseline ran out of memory, line 4's workload has no plan (absent values are empty
// cells). `edit` changes the cells of one line (from 1, the header) before they are joined.
using CsvCells = std::vector<std::vector<std::string>>;
CsvCells study_csv_cells() {
  return {{"sweep", "system", "model", "hardware", "gpus", "global_batch", "seq_len", "gpu_budget_gib", "host_budget_gib", "status", "plan",
           "step_s", "tokens_per_s", "gpu_peak_gib", "host_gib", "fsdp2-offload_step_s", "fsdp2-offload_tokens_per_s",
           "fsdp2-offload_gpu_peak_gib", "fsdp2-offload_host_gib", "fsdp2-offload_oom", "best_baseline", "speedup"},
          {"batch", "search", "qwen3.6-35b-a3b", "h100-sxm-node", "4", "16", "4096", "", "512", "ok", "\"ep R23/K0 c64K\"", "3.2",
           "20480", "61.500", "700.200", "5.1", "12850.2", "70.100", "900.300", "", "fsdp2-offload", "1.594"},
          {"batch", "search", "qwen3.6-35b-a3b", "h100-sxm-node", "4", "32", "4096", "", "512", "ok", "\"ep R23/K0 c64K\"", "6.1",
           "21489.3", "70.500", "720.000", "", "", "", "", "\"out of memory: GPU 0, 90.1 GiB\"", "", ""},
          {"batch", "search", "qwen3.6-35b-a3b", "h100-sxm-node", "4", "64", "4096", "", "512", "infeasible",
           "\"no plan fits, 512 GiB of host memory\"", "", "", "", "", "", "", "", "", "\"out of memory: host\"", "", ""}};
}
std::string study_csv_with(std::size_t line, const std::function<void(std::vector<std::string>&)>& edit) {
  CsvCells cells = study_csv_cells();
  edit(cells.at(line - 1));
  std::string text;
  for (const auto& row : cells) {
    for (std::size_t i = 0; i < row.size(); ++i) text += (i ? "," : "") + row[i];
    text += "\n";
  }
  return text;
}
// Cell `column` of a study CSV line set to `value`.
std::function<void(std::vector<std::string>&)> set_cell(const std::string& column, const std::string& value) {
  return [=](std::vector<std::string>& row) {
    const std::vector<std::string> header = study_csv_cells().front();
    row.at(static_cast<std::size_t>(std::find(header.begin(), header.end(), column) - header.begin())) = value;
  };
}

std::vector<Case> cases() {
  const std::string M = "{dir}/m.json", W = "{dir}/w.json", P = "{dir}/p.json", H = "{dir}/hw.json", R = "{dir}/r.jsonl";
  const std::string tiny = read_file(fs::path(kSrc) / kTiny);
  std::vector<Case> c;
  // --- model config.json: oom model show PATH
  c.push_back({"model_empty_file", {{"m.json", ""}}, model_show(), M, "", "", "empty"});
  c.push_back({"model_whitespace_only", {{"m.json", " \n\t\n"}}, model_show(), M, "", "", "empty"});
  c.push_back({"model_truncated", {{"m.json", R"({"model_type": "oom_tiny_moe", "num_hidden_layers": 4, "hidden_size": 6)"}},
               model_show(), M, "hidden_size", "6", "unexpected end of input"});
  c.push_back({"model_non_utf8_string", {{"m.json", "{\"model_type\": \"tiny\xff\xfe\", \"num_hidden_layers\": 4}"}},
               model_show(), M, "model_type", "\"tiny\\xff", "ill-formed UTF-8"});
  c.push_back({"model_non_utf8_document", {{"m.json", "\xff\xfe{}"}}, model_show(), M, "", "", "malformed JSON"});
  c.push_back({"model_directory", {{"m.json", kDirectory}}, model_show(), M, "", "", "directory"});
  c.push_back({"model_missing_file", {}, model_show(), M, "", "", "not found"});
  c.push_back({"model_wrong_type", {{"m.json", model_with([](json& j) { j["hidden_size"] = "64"; })}}, model_show(), M,
               "hidden_size", "\"64\"", "integer"});
  c.push_back({"model_negative_layers", {{"m.json", model_with([](json& j) { j["num_hidden_layers"] = -4; })}},
               model_show(), M, "num_hidden_layers", "-4", "range"});
  {
    std::string inf = tiny;
    inf.replace(inf.find("\"hidden_size\": 64"), 17, "\"hidden_size\": 1e999");
    c.push_back({"model_number_overflow", {{"m.json", inf}}, model_show(), M, "hidden_size", "1e999", "overflow"});
  }
  c.push_back({"model_huge_float", {{"m.json", model_with([](json& j) { j["vocab_size"] = 1e30; })}}, model_show(), M,
               "vocab_size", "1e+30", "integer"});
  c.push_back({"model_huge_dimensions", {{"m.json", model_with([](json& j) {
                 j["hidden_size"] = 1 << 24;
                 j["num_experts"] = 1 << 24;
                 j["moe_intermediate_size"] = 1 << 24;
               })}},
               model_show(), M, "hidden_size", "16777216", "parameters"});
  c.push_back({"model_unknown_layer_type", {{"m.json", model_with([](json& j) { j["layer_types"][2] = "mamba"; })}},
               model_show(), M, "layer_types[2]", "\"mamba\"", "unknown layer type"});
  const auto deepseek_with = [](const std::function<void(json&)>& edit) { return edited("configs/models/kimi-k2.json", edit); };
  c.push_back({"model_moe_layer_freq", {{"m.json", deepseek_with([](json& j) { j["moe_layer_freq"] = 2; })}}, model_show(), M,
               "moe_layer_freq", "2", "only every layer"});
  c.push_back({"model_expert_groups_uneven", {{"m.json", deepseek_with([](json& j) { j["n_group"] = 7; })}}, model_show(), M,
               "n_group", "7", "must divide the 384 routed experts"});
  c.push_back({"model_latent_rank_negative", {{"m.json", deepseek_with([](json& j) { j["kv_lora_rank"] = -512; })}}, model_show(), M,
               "kv_lora_rank", "-512", "range"});
  c.push_back({"model_layer_types_count", {{"m.json", model_with([](json& j) { j["layer_types"].erase(0); })}},
               model_show(), M, "layer_types", "[\"sliding_attention\"", "entries"});
  c.push_back({"model_kv_heads_not_dividing", {{"m.json", model_with([](json& j) { j["num_key_value_heads"] = 3; })}},
               model_show(), M, "num_key_value_heads", "3", "divide"});
  c.push_back({"model_top_k_above_experts", {{"m.json", model_with([](json& j) { j["num_experts_per_tok"] = 9; })}},
               model_show(), M, "num_experts_per_tok", "9", "range"});
  {
    std::string nan = tiny;
    nan.replace(nan.find("\"rope_theta\": 10000"), 19, "\"rope_theta\": NaN");
    c.push_back({"model_nan_literal", {{"m.json", nan}}, model_show(), M, "rope_theta", "\"rope_theta\": N", "malformed JSON"});
  }
  c.push_back({"model_bool_as_string", {{"m.json", model_with([](json& j) { j["tie_word_embeddings"] = "yes"; })}},
               model_show(), M, "tie_word_embeddings", "\"yes\"", "true or false"});
  c.push_back({"model_text_config_not_object", {{"m.json", model_with([](json& j) { j["text_config"] = 5; })}},
               model_show(), M, "text_config", "5", "object"});
  c.push_back({"model_document_is_list", {{"m.json", "[1, 2]"}}, model_show(), M, "document", "[1,2]", "object"});
  c.push_back({"model_deeply_nested", {{"m.json", std::string(100000, '[') + std::string(100000, ']')}}, model_show(),
               M, "document", "[[[[", "object"});
  {
    std::string deep_path = "...";
    for (int i = 0; i < 39; ++i) deep_path += "[0]";
    c.push_back({"model_deeply_nested_truncated", {{"m.json", std::string(100000, '[')}}, model_show(), M, deep_path,
                 "[[[[", "unexpected end of input"});
  }
  c.push_back({"model_unknown_name", {}, {"model", "show", "no-such-model"}, "", "model", "\"no-such-model\"", "unknown model"});
  c.push_back({"model_rotary_above_one", {{"m.json", model_with([](json& j) { j["partial_rotary_factor"] = 1.5; })}},
               model_show(), M, "partial_rotary_factor", "1.5", "range"});
  c.push_back({"model_sliding_without_window", {{"m.json", model_with([](json& j) { j["sliding_window"] = 0; })}},
               model_show(), M, "sliding_window", "0", "window"});
  c.push_back({"model_negative_head_dim", {{"m.json", model_with([](json& j) { j["head_dim"] = -16; })}}, model_show(),
               M, "head_dim", "-16", "range"});

  // --- workload: oom memory --workload W --plan P
  c.push_back({"workload_zero_gpus", {{"w.json", workload_with([](json& j) { j["gpus"] = 0; })}}, memory_with_workload(),
               W, "gpus", "0", "range"});
  c.push_back({"workload_gpus_string", {{"w.json", workload_with([](json& j) { j["gpus"] = "four"; })}},
               memory_with_workload(), W, "gpus", "\"four\"", "integer"});
  c.push_back({"workload_batch_not_multiple", {{"w.json", workload_with([](json& j) { j["global_batch"] = 30; })}},
               memory_with_workload(), W, "global_batch", "30", "multiple"});
  c.push_back({"workload_seq_len_not_splitting", {{"w.json", workload_with([](json& j) { j["global_batch"] = 2, j["seq_len"] = 4097; })}},
               memory_with_workload(), W, "seq_len", "4097", "split evenly over the 2 GPUs"});
  c.push_back({"workload_seq_len_above_context", {{"w.json", workload_with([](json& j) { j["seq_len"] = 1 << 20; })}},
               memory_with_workload(), W, "seq_len", "1048576", "max_position_embeddings"});
  c.push_back({"workload_unknown_field", {{"w.json", workload_with([](json& j) { j["batch"] = 32; })}},
               memory_with_workload(), W, "batch", "32", "unknown field"});
  c.push_back({"workload_control_char_in_key", {{"w.json", workload_with([](json& j) { j["ba\ntch"] = 1; })}},
               memory_with_workload(), W, "ba\\x0atch", "1", "unknown field"});
  {
    std::string inf = read_file(fs::path(kSrc) / kWorkload);
    inf.replace(inf.find("\"yarn_factor\": 1"), 16, "\"yarn_factor\": 1e999");
    c.push_back({"workload_yarn_overflow", {{"w.json", inf}}, memory_with_workload(), W, "yarn_factor", "1e999", "overflow"});
  }
  c.push_back({"workload_negative_budget", {{"w.json", workload_with([](json& j) { j["gpu_budget_gib"] = -1; })}},
               memory_with_workload(), W, "gpu_budget_gib", "-1", "range"});
  c.push_back({"workload_unknown_model", {{"w.json", workload_with([](json& j) { j["model"] = "no-such-model"; })}},
               memory_with_workload(), W, "model", "\"no-such-model\"", "unknown model"});
  c.push_back({"workload_unknown_hardware", {{"w.json", workload_with([](json& j) { j["hardware"] = "no-such-node"; })}},
               memory_with_workload(), W, "hardware", "\"no-such-node\"", "unknown hardware"});
  c.push_back({"workload_more_gpus_than_node", {{"w.json", workload_with([](json& j) { j["gpus"] = 16; })}},
               memory_with_workload(), W, "gpus", "16", "GPUs"});
  c.push_back({"workload_huge_batch", {{"w.json", workload_with([](json& j) { j["global_batch"] = std::int64_t{1} << 32; })}},
               memory_with_workload(), W, "global_batch", "4294967296", "supported"});
  c.push_back({"workload_batch_1e20", {{"w.json", workload_with([](json& j) { j["global_batch"] = 1e20; })}},
               memory_with_workload(), W, "global_batch", "1e+20", "integer"});
  c.push_back({"workload_truncated", {{"w.json", R"({"model": "qwen3.6-35b-a3b", "hardware": "h100-)"}}, memory_with_workload(),
               W, "hardware", "\"h100-", "malformed JSON"});
  c.push_back({"workload_empty_file", {{"w.json", ""}}, memory_with_workload(), W, "", "", "empty"});
  c.push_back({"workload_directory", {{"w.json", kDirectory}}, memory_with_workload(), W, "", "", "directory"});
  c.push_back({"workload_missing_file", {}, memory_with_workload(), W, "", "", "not found"});

  // --- hardware: a workload naming {dir}/hw.json
  c.push_back({"hardware_negative_hbm", {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["gpu"]["hbm_gib"] = -80; })}},
               memory_with_workload(), H, "gpu.hbm_gib", "-80", "range"});
  c.push_back({"hardware_unknown_fabric", {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["fabric"]["kind"] = "infiniband"; })}},
               memory_with_workload(), H, "fabric.kind", "\"infiniband\"", "one of"});
  c.push_back({"hardware_negative_amx", {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["numa"][0]["amx_bf16_flops_per_s"] = -1; })}},
               memory_with_workload(), H, "numa[0].amx_bf16_flops_per_s", "-1", "range"});
  c.push_back({"hardware_negative_l2", {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["gpu"]["l2_mib"] = -50; })}},
               memory_with_workload(), H, "gpu.l2_mib", "-50", "range"});
  c.push_back({"hardware_negative_gemm_half_rows",
               {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["gpu"]["gemm_half_rows"] = -4; })}},
               memory_with_workload(), H, "gpu.gemm_half_rows", "-4", "range"});
  c.push_back({"hardware_bad_architecture",
               {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["gpu"]["architecture"] = "Hopper GH100"; })}},
               memory_with_workload(), H, "gpu.architecture", "\"Hopper GH100\"", "lower-case"});
  c.push_back({"hardware_gpu_numa_out_of_range", {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["gpu_numa"] = {5}; })}},
               memory_with_workload(), H, "gpu_numa[0]", "5", "range"});
  c.push_back({"hardware_missing_gpu", {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j.erase("gpu"); })}},
               memory_with_workload(), H, "gpu", "(missing)", "required"});
  c.push_back({"hardware_empty_numa", {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["numa"] = json::array(); })}},
               memory_with_workload(), H, "numa", "[]", "non-empty"});
  c.push_back({"hardware_bandwidth_string", {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["pcie"]["h2d_Bps"] = "fast"; })}},
               memory_with_workload(), H, "pcie.h2d_Bps", "\"fast\"", "number"});
  c.push_back({"hardware_switch_not_dividing", {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["pcie"]["gpus_per_switch"] = 3; })}},
               memory_with_workload(), H, "pcie.gpus_per_switch", "3", "divide"});
  c.push_back({"hardware_directory", {{"w.json", workload_on_hw()}, {"hw.json", kDirectory}}, memory_with_workload(), H, "", "",
               "directory"});
  // Clusters: a node spec repeated over nodes needs a network; NICs, topology and the node named.
  const json network = {{"nic", {{"count", 1}, {"Bps", 45e9}, {"attach", "socket"}}}, {"latency_s", 5e-6}};
  c.push_back({"hardware_nodes_without_network",
               {{"w.json", [] {
                  json w = json::parse(workload_on_hw());
                  w["nodes"] = 2;
                  return w.dump();
                }()}, {"hw.json", hw_with([](json&) {})}},
               memory_with_workload(), W, "nodes", "2", "no network"});
  c.push_back({"hardware_nic_attach_unknown",
               {{"w.json", workload_on_hw()}, {"hw.json", hw_with([&](json& j) {
                  j["network"] = network;
                  j["network"]["nic"]["attach"] = "usb";
                })}},
               memory_with_workload(), H, "network.nic.attach", "\"usb\"", "one of"});
  c.push_back({"hardware_topology_without_leaves",
               {{"w.json", workload_on_hw()}, {"hw.json", hw_with([&](json& j) {
                  j["network"] = network;
                  j["network"]["topology"] = {{"kind", "leaf_spine"}};
                })}},
               memory_with_workload(), H, "network.topology.nodes_per_leaf", "(missing)", "required"});
  c.push_back({"hardware_cluster_of_unknown_node", {{"w.json", workload_on_hw()}, {"hw.json", R"({"name": "c", "node": "no-such-node", "nodes": 2})"}},
               memory_with_workload(), H, "node", "\"no-such-node\"", "unknown hardware"});
  c.push_back({"cli_nodes_zero", {}, {"memory", "--workload", "{src}/" + std::string(kWorkload), "--plan", "{src}/" + std::string(kPlan), "--nodes", "0"},
               "", "--nodes", "0", "out of range 1..65536"});

  // --- plan: oom memory --workload (default) --plan P
  c.push_back({"plan_layer_out_of_range", {{"p.json", plan_with([](json& j) { j["resident_layers"] = {0, 40}; })}},
               memory_with_plan(), P, "resident_layers[1]", "40", "out of range 0..39"});
  c.push_back({"plan_negative_layer", {{"p.json", plan_with([](json& j) { j["resident_layers"] = {-1}; })}},
               memory_with_plan(), P, "resident_layers[0]", "-1", "range"});
  c.push_back({"plan_duplicate_layer", {{"p.json", plan_with([](json& j) { j["resident_layers"] = {3, 3}; })}},
               memory_with_plan(), P, "resident_layers[1]", "3", "duplicate"});
  c.push_back({"plan_gpu_held_out_of_range", {{"p.json", plan_with([](json& j) { j["boundaries"]["gpu_held"] = {100}; })}},
               memory_with_plan(), P, "boundaries.gpu_held[0]", "100", "out of range"});
  c.push_back({"plan_unknown_path", {{"p.json", plan_with([](json& j) { j["path"] = "pipeline"; })}}, memory_with_plan(), P,
               "path", "\"pipeline\"", "one of"});
  c.push_back({"plan_unknown_version", {{"p.json", plan_with([](json& j) { j["version"] = 2; })}}, memory_with_plan(), P,
               "version", "2", "range"});
  c.push_back({"plan_chunk_wrong_type", {{"p.json", plan_with([](json& j) { j["split"]["gdn_chunk_tokens"] = "64"; })}},
               memory_with_plan(), P, "split.gdn_chunk_tokens", "\"64\"", "integer"});
  c.push_back({"plan_zero_routing_chunk", {{"p.json", plan_with([](json& j) { j["routing_chunk_tokens"] = 0; })}},
               memory_with_plan(), P, "routing_chunk_tokens", "0", "range"});
  c.push_back({"plan_host_kept_word", {{"p.json", plan_with([](json& j) { j["boundaries"]["host_kept"] = "some"; })}},
               memory_with_plan(), P, "boundaries.host_kept", "\"some\"", "all"});
  c.push_back({"plan_head_group_not_dividing", {{"p.json", plan_with([](json& j) { j["split"]["attention_head_group"] = 3; })}},
               memory_with_plan(), P, "split.attention_head_group", "3", "divide"});
  const auto local = [](json& j) {
    j["path"] = "local";
    j["resident_layers"] = json::array();
  };
  c.push_back({"plan_sub_batch_not_dividing", {{"p.json", plan_with([&](json& j) { local(j), j["split"]["sub_batch_seqs"] = 3; })}},
               memory_with_plan(), P, "split.sub_batch_seqs", "3", "divide"});
  c.push_back({"plan_ep_sub_batches", {{"p.json", plan_with([](json& j) { j["split"]["sub_batch_seqs"] = 2; })}},
               memory_with_plan(), P, "split.sub_batch_seqs", "2", "local-path partition"});
  c.push_back({"plan_ep_moe_chunk", {{"p.json", plan_with([](json& j) { j["split"]["moe_chunk_tokens"] = 1024; })}},
               memory_with_plan(), P, "split.moe_chunk_tokens", "1024", "dispatch rounds"});
  c.push_back({"plan_local_routing_chunk", {{"p.json", plan_with([&](json& j) { local(j), j["routing_chunk_tokens"] = 4096; })}},
               memory_with_plan(), P, "routing_chunk_tokens", "4096", "routes no tokens"});
  c.push_back({"plan_ep_group_negative", {{"p.json", plan_with([](json& j) { j["ep_group_gpus"] = -1; })}},
               memory_with_plan(), P, "ep_group_gpus", "-1", "range"});
  c.push_back({"plan_ep_group_not_dividing", {{"p.json", plan_with([](json& j) { j["ep_group_gpus"] = 3; })}},
               memory_with_plan(), P, "ep_group_gpus", "3", "divides the workload's 4 GPUs"});
  c.push_back({"plan_context_parallel_negative", {{"p.json", plan_with([](json& j) { j["context_parallel_gpus"] = -2; })}},
               memory_with_plan(), P, "context_parallel_gpus", "-2", "range"});
  c.push_back({"plan_context_parallel_whole_sequences", {{"p.json", plan_with([](json& j) { j["context_parallel_gpus"] = 2; })}},
               memory_with_plan(), P, "context_parallel_gpus", "2", "whole sequences per GPU"});
  c.push_back({"plan_unknown_field", {{"p.json", plan_with([](json& j) { j["resident"] = json::array(); })}},
               memory_with_plan(), P, "resident", "[]", "unknown field"});
  c.push_back({"plan_transfer_chunk_huge", {{"p.json", plan_with([](json& j) { j["transfer_chunk_mib"] = std::int64_t{1} << 40; })}},
               memory_with_plan(), P, "transfer_chunk_mib", "1099511627776", "range"});
  c.push_back({"plan_truncated", {{"p.json", R"({"version": 1, "path": "ep", "resident_layers": [0, 1, )"}}, memory_with_plan(),
               P, "resident_layers[2]", "1, ", "unexpected end of input"});
  c.push_back({"plan_directory", {{"p.json", kDirectory}}, memory_with_plan(), P, "", "", "directory"});
  c.push_back({"plan_missing_file", {}, memory_with_plan(), P, "", "", "not found"});

  // --- oom report: workload and plan errors reach the report command alike
  c.push_back({"report_workload_negative_gpus", {{"w.json", workload_with([](json& j) { j["gpus"] = -2; })}},
               {"report", "--workload", "{dir}/w.json"}, W, "gpus", "-2", "range"});
  c.push_back({"report_plan_retained_out_of_range", {{"p.json", plan_with([](json& j) { j["moe_retained_layers"] = {45}; })}},
               {"report", "--plan", "{dir}/p.json"}, P, "moe_retained_layers[0]", "45", "out of range"});
  c.push_back({"report_plan_non_utf8", {{"p.json", "{\"version\": 1, \"notes\": \"\xc3\x28\"}"}}, {"report", "--plan", "{dir}/p.json"},
               P, "notes", "\"\\xc3", "UTF-8"});

  // --- recorded measurements (JSON Lines): load_records
  const std::string ok = first_record_line();
  c.push_back({"records_truncated_line", {{"r.jsonl", ok + "\n" + ok.substr(0, 40) + "\n"}}, {"@records", R}, R + ":2",
               "source", "\"OOM arXiv 26", "malformed JSON"});
  c.push_back({"records_negative_step_time", {{"r.jsonl", record_with([](json& j) { j["measured"]["step_s"] = -3; })}},
               {"@records", R}, R + ":1", "measured.step_s", "-3", "range"});
  c.push_back({"records_compute_breakdown_bad_key",
               {{"r.jsonl", record_with([](json& j) { j["measured"]["compute_s"] = {{"forward", 0.5}}; })}}, {"@records", R},
               R + ":1", "measured.compute_s.forward", "0.5", "forward.KIND"});
  c.push_back({"records_duplicate_id", {{"r.jsonl", ok + "\n" + ok + "\n"}}, {"@records", R}, R + ":2", "id", "\"t4-b16\"",
               "duplicate"});
  c.push_back({"records_unknown_kind", {{"r.jsonl", record_with([](json& j) { j["kind"] = "gpu"; })}}, {"@records", R},
               R + ":1", "kind", "\"gpu\"", "step"});
  c.push_back({"records_workload_wrong_type", {{"r.jsonl", record_with([](json& j) { j["workload"]["gpus"] = "x"; })}},
               {"@records", R}, R + ":1", "workload.gpus", "\"x\"", "integer"});
  c.push_back({"records_unknown_system", {{"r.jsonl", record_with([](json& j) {
                 j.erase("plan");
                 j["system"] = "deepspeed-9";
               })}},
               {"@records", R}, R + ":1", "system", "\"deepspeed-9\"", "one of"});
  c.push_back({"records_empty_file", {{"r.jsonl", "\n# only a comment\n"}}, {"@records", R}, R, "", "", "empty"});
  c.push_back({"records_missing_file", {}, {"@records", R}, R, "", "", "not found"});
  c.push_back({"records_directory", {{"r.jsonl", kDirectory}}, {"@records", R}, R, "", "", "directory"});

  // --- calibration files: oom simulate --calibration PATH (default workload and plan, H100 node)
  const std::string C = "{dir}/c.json";
  const std::vector<std::string> simulate_cal = {"simulate", "--workload", "{src}/" + std::string(kWorkload), "--plan",
                                                 "{src}/" + std::string(kPlan), "--calibration", C};
  c.push_back({"calibration_efficiency_above_one", {{"c.json", calibration_with([](json& j) { j["gemm_efficiency"] = 1.5; })}},
               simulate_cal, C, "gemm_efficiency", "1.5", "range"});
  c.push_back({"calibration_negative_overhead", {{"c.json", calibration_with([](json& j) { j["compute_overhead_s"] = -0.001; })}},
               simulate_cal, C, "compute_overhead_s", "-0.001", "range"});
  c.push_back({"calibration_negative_operator_overhead",
               {{"c.json", calibration_with([](json& j) { j["operator_overhead_s"] = -2e-6; })}}, simulate_cal, C,
               "operator_overhead_s", "-2e-06", "range"});
  c.push_back({"calibration_rate_as_string", {{"c.json", calibration_with([](json& j) { j["h2d_Bps"] = "fast"; })}},
               simulate_cal, C, "h2d_Bps", "\"fast\"", "number"});
  c.push_back({"calibration_other_hardware", {{"c.json", calibration_with([](json& j) { j["hardware"] = "rtx4090-node"; })}},
               simulate_cal, C, "hardware", "\"rtx4090-node\"", "other hardware"});
  c.push_back({"calibration_negative_torch_adamw", {{"c.json", calibration_with([](json& j) { j["torch_adamw_params_per_s"] = -1; })}},
               simulate_cal, C, "torch_adamw_params_per_s", "-1", "range"});
  c.push_back({"calibration_unknown_constant", {{"c.json", calibration_with([](json& j) { j["gemm_speedup"] = 2; })}},
               simulate_cal, C, "gemm_speedup", "2", "unknown"});
  c.push_back({"calibration_truncated", {{"c.json", "{\"hardware\": \"h100-sxm-node\", \"gemm_efficiency\": 0."}},
               simulate_cal, C, "gemm_efficiency", "0.", "malformed JSON"});

  // --- cross-validation and explanations: oom calibrate --cross-validate G, oom validate --explain ID
  const std::string paper = "{src}/traces/paper/paper-calibration.jsonl";
  const std::vector<std::string> cross = {"calibrate", "--records", paper, "--hardware", "h100-sxm-node", "--cross-validate"};
  c.push_back({"calibrate_unknown_grouping", {}, {cross[0], cross[1], cross[2], cross[3], cross[4], cross[5], "batch"}, "",
               "--cross-validate", "\"batch\"", "unknown grouping"});
  c.push_back({"calibrate_unknown_engine", {}, {cross[0], cross[1], cross[2], cross[3], cross[4], cross[5], "model", "--engine", "abacus"},
               "", "--engine", "\"abacus\"", "unknown engine"});
  c.push_back({"calibrate_no_starts", {}, {cross[0], cross[1], cross[2], cross[3], cross[4], cross[5], "model", "--starts", "0"}, "",
               "--starts", "0", "out of range"});
  c.push_back({"calibrate_no_finalists", {}, {cross[0], cross[1], cross[2], cross[3], cross[4], "--finalists", "0", "-o", "{dir}/c.json"}, "",
               "--finalists", "0", "out of range"});
  c.push_back({"calibrate_negative_prior_weight", {}, {cross[0], cross[1], cross[2], cross[3], cross[4], cross[5], "record", "--prior-weight=-0.5"},
               "", "--prior-weight", "-0.5", "out of range"});
  c.push_back({"calibrate_negative_robust_scale", {}, {cross[0], cross[1], cross[2], cross[3], cross[4], "--robust-scale=-0.1", "-o", "{dir}/c.json"},
               "", "--robust-scale", "-0.1", "out of range"});
  c.push_back({"calibrate_hold_out_unknown_id", {}, {cross[0], cross[1], cross[2], cross[3], cross[4], "--hold-out", "t4-b32,t4-b999", "-o", "{dir}/c.json"},
               "", "--hold-out", "\"t4-b999\"", "no record"});
  c.push_back({"calibrate_hold_out_in_cross_validation", {}, {cross[0], cross[1], cross[2], cross[3], cross[4], cross[5], "record", "--hold-out", "t4-b32"},
               "", "--hold-out", "\"t4-b32\"", "not with --cross-validate"});
  c.push_back({"calibrate_cross_validate_records_bad_line", {{"r.jsonl", record_with([](json& j) { j["measured"]["step_s"] = -1; })}},
               {"calibrate", "--records", R, "--hardware", "h100-sxm-node", "--cross-validate", "record"}, R + ":1",
               "measured.step_s", "-1", "range"});
  c.push_back({"validate_explain_unknown_record", {}, {"validate", paper, "--explain", "t4-b999"}, paper, "--explain",
               "\"t4-b999\"", "no step record"});
  const std::string B = "{dir}/b.json";
  auto breakdowns_with = [](const std::function<void(json&)>& edit) { return edited("traces/paper/published-breakdowns.json", edit); };
  const std::vector<std::string> explain = {"validate", paper, "--explain", "t4-b32", "--published", B};
  c.push_back({"published_breakdown_time_as_string",
               {{"b.json", breakdowns_with([](json& j) { j["breakdowns"][1]["step_s"] = "slow"; })}}, explain, B,
               "breakdowns[1].step_s", "\"slow\"", "number"});
  c.push_back({"published_breakdown_unknown_field",
               {{"b.json", breakdowns_with([](json& j) { j["breakdowns"][0]["stepp_s"] = 8.5; })}}, explain, B,
               "breakdowns[0].stepp_s", "8.5", "unknown"});
  c.push_back({"published_breakdown_negative_mechanism",
               {{"b.json", breakdowns_with([](json& j) { j["breakdowns"][0]["mechanisms"]["non_compute_s"] = -4.55; })}}, explain, B,
               "breakdowns[0].mechanisms.non_compute_s", "-4.55", "range"});
  c.push_back({"calibrate_published_negative_compute",
               {{"b.json", breakdowns_with([](json& j) { j["breakdowns"][1]["mechanisms"]["compute_with_replay_s"] = -3.93; })}},
               {cross[0], cross[1], cross[2], cross[3], cross[4], cross[5], "model", "--published", B}, B,
               "breakdowns[1].mechanisms.compute_with_replay_s", "-3.93", "range"});

  // --- routing (costmodel/routing.h) and FLAT's schedules (planner/plan/plan.h "flat")
  c.push_back({"workload_routing_unknown_kind", {{"w.json", workload_with([](json& j) { j["routing"] = {{"kind", "pareto"}}; })}},
               memory_with_workload(), W, "routing.kind", "\"pareto\"", "one of"});
  c.push_back({"workload_routing_negative_skew",
               {{"w.json", workload_with([](json& j) { j["routing"] = {{"kind", "zipf"}, {"skew", -1}}; })}},
               memory_with_workload(), W, "routing.skew", "-1", "range"});
  c.push_back({"workload_routing_negative_count",
               {{"w.json", workload_with([](json& j) { j["routing"] = {{"kind", "histogram"}, {"counts", {4, -1}}}; })}},
               memory_with_workload(), W, "routing.counts[1]", "-1", "non-negative"});
  c.push_back({"workload_routing_histogram_length",
               {{"w.json", workload_with([](json& j) { j["routing"] = {{"kind", "histogram"}, {"counts", {1, 2, 3}}}; })}},
               memory_with_workload(), W, "routing.counts", "3 counts", "routed experts"});
  c.push_back({"workload_routing_histogram_file_missing",
               {{"w.json", workload_with([](json& j) { j["routing"] = {{"kind", "histogram"}, {"file", "h.json"}}; })}},
               memory_with_workload(), "h.json", "", "", "not found"});
  c.push_back({"plan_flat_unknown_dispatch", {{"p.json", plan_with([](json& j) { j["flat"] = {{"expert_dispatch", "balanced"}}; })}},
               memory_with_plan(), P, "flat.expert_dispatch", "\"balanced\"", "one of"});
  c.push_back({"plan_flat_negative_bucket", {{"p.json", plan_with([](json& j) { j["flat"] = {{"optimizer_bucket_mib", -64}}; })}},
               memory_with_plan(), P, "flat.optimizer_bucket_mib", "-64", "range"});
  c.push_back({"plan_flat_sco_with_gpu_held",
               {{"p.json", plan_with([](json& j) {
                  j["flat"] = {{"checkpoint_offload", "sco"}};
                  j["boundaries"]["gpu_held"] = {3};
                })}},
               memory_with_plan(), P, "flat.checkpoint_offload", "\"sco\"", "host_kept"});
  c.push_back({"plan_flat_unknown_field", {{"p.json", plan_with([](json& j) { j["flat"] = {{"ring", true}}; })}},
               memory_with_plan(), P, "flat.ring", "true", "unknown"});
  // --- oom ablation STUDY.json -o DIR
  const std::string A = "{dir}/a.json";
  const std::vector<std::string> ablation = {"ablation", A, "-o", "{dir}/out", "--no-plots"};
  const auto ablation_with = [](const std::function<void(json&)>& edit) { return edited("experiments/flat-optimizer.json", edit); };
  c.push_back({"ablation_unknown_schedule", {{"a.json", ablation_with([](json& j) { j["schedule"] = "weights"; })}}, ablation, A,
               "schedule", "\"weights\"", "one of"});
  c.push_back({"ablation_one_variant", {{"a.json", ablation_with([](json& j) { j["variants"] = json::array({j["variants"][0]}); })}}, ablation, A,
               "variants", "", "reference"});
  c.push_back({"ablation_token_fraction_not_dividing",
               {{"a.json", ablation_with([](json& j) { j["variants"][1]["plan"] = {{"routing_chunk_tokens", "tokens_per_gpu/7"}}; })}},
               ablation, A, "variant 'OffloadStreamAdamW, 256 MiB' plan.routing_chunk_tokens", "\"tokens_per_gpu/7\"", "divide"});
  c.push_back({"ablation_variant_bad_plan",
               {{"a.json", ablation_with([](json& j) { j["variants"][2]["plan"] = {{"flat", {{"vocab_projection", "tree"}}}}; })}},
               ablation, A, "variant 'OffloadStreamAdamW, 64 MiB' plan.flat.vocab_projection", "\"tree\"", "one of"});
  c.push_back({"ablation_workload_bad_gpus",
               {{"a.json", ablation_with([](json& j) { j["workloads"][0]["workload"]["gpus"] = 0; })}},
               ablation, A, "workloads[0].workload.gpus", "0", "range"});

  // --- plan search and what-if studies: oom plan --workload PATH, oom whatif STUDY.json -o DIR
  c.push_back({"plan_workload_negative_batch", {{"w.json", workload_with([](json& j) { j["global_batch"] = -4; })}},
               {"plan", "--workload", W}, W, "global_batch", "-4", "range"});
  c.push_back({"plan_workload_unknown_hardware", {{"w.json", workload_with([](json& j) { j["hardware"] = "tpu-pod"; })}},
               {"plan", "--workload", W}, W, "hardware", "\"tpu-pod\"", "unknown hardware"});
  const std::string S = "{dir}/s.json";
  const std::vector<std::string> whatif = {"whatif", S, "-o", "{dir}/out", "--no-plots"};
  c.push_back({"whatif_unknown_baseline", {{"s.json", study_with([](json& j) { j["baselines"] = {"deepspeed"}; })}}, whatif,
               S, "baselines[0]", "\"deepspeed\"", "unknown baseline"});
  c.push_back({"whatif_negative_context", {{"s.json", study_with([](json& j) { j["sweeps"][0]["seq_len"] = {-4096}; })}},
               whatif, S, "sweeps[0].seq_len[0]", "-4096", "range"});
  c.push_back({"whatif_zero_nodes", {{"s.json", study_with([](json& j) { j["sweeps"][0]["nodes"] = {0}; })}},
               whatif, S, "sweeps[0].nodes[0]", "0", "range"});
  c.push_back({"whatif_truncated_study", {{"s.json", R"({"name": "x", "sweeps": [{"models": ["qwen3.6-35b-a3b"])"}}, whatif,
               S, "sweeps[0].models", "\"qwen3.6", "malformed JSON"});
  c.push_back({"whatif_unknown_system", {{"s.json", study_with([](json& j) { j["sweeps"][0]["systems"] = {"search", "ep:R2"}; })}},
               whatif, S, "sweeps[0].systems[1]", "\"ep:R2\"", "unknown OOM system"});
  const std::string unchanged_study = study_with([](json&) {});
  const std::string bad_plan_record = record_with([](json& j) { j["plan"]["path"] = "gpu"; });
  c.push_back({"whatif_published_bad_plan", {{"s.json", unchanged_study}, {"r.jsonl", bad_plan_record}},
               {"whatif", S, "-o", "{dir}/out", "--no-plots", "--published", R}, R + ":1", "plan.path", "\"gpu\"", "expected"});
  c.push_back({"whatif_published_missing_file", {{"s.json", unchanged_study}},
               {"whatif", S, "-o", "{dir}/out", "--no-plots", "--published", R}, R, "", "", "not found"});
  c.push_back({"plan_unknown_preset", {}, {"plan", "--workload", "{src}/" + std::string(kWorkload), "--preset", "fancy"}, "",
               "--preset", "\"fancy\"", "unknown preset"});
  c.push_back({"plan_measure_memory_without_executor", {},
               {"plan", "--workload", "{src}/" + std::string(kWorkload), "--compare-engine", "analytic", "--measure-memory"}, "",
               "--measure-memory", "true", "executor"});
  // --- oom report-paper --studies DIR -o DIR/out: the case folder is the studies folder.
  const std::vector<std::string> report_paper = {"report-paper", "--studies", "{dir}", "-o", "{dir}/out", "--no-plots"};
  c.push_back({"report_paper_bad_study", {{"s.json", study_with([](json& j) { j["sweeps"][0]["gpus"] = {0}; })}}, report_paper, S,
               "sweeps[0].gpus[0]", "0", "range"});
  c.push_back({"report_paper_no_studies", {{"notes.txt", "not a study"}}, report_paper, "{dir}", "", "", "no study file"});
  {
    std::vector<std::string> with_records = report_paper;
    with_records.insert(with_records.end(), {"--published", R});
    c.push_back({"report_paper_published_bad_plan", {{"s.json", unchanged_study}, {"r.jsonl", bad_plan_record}}, with_records,
                 R + ":1", "plan.path", "\"gpu\"", "expected"});
  }

  // --- numbers: budgets, counts and times from input are finite, in range and within the hardware
  const std::vector<std::string> plan_default = {"plan", "--workload", "{src}/" + std::string(kWorkload)};
  const auto plan_with_option = [&plan_default](const std::string& option, const std::string& value) {
    std::vector<std::string> args = plan_default;
    args.insert(args.end(), {option, value});
    return args;
  };
  c.push_back({"plan_gpu_budget_infinite", {}, plan_with_option("--gpu-budget-gib", "inf"), "", "--gpu-budget-gib", "inf",
               "finite number of GiB"});
  c.push_back({"plan_gpu_budget_overflows_bytes", {}, plan_with_option("--gpu-budget-gib", "1e10"), "", "--gpu-budget-gib",
               "10000000000", "64-bit"});
  c.push_back({"plan_host_budget_nan", {}, plan_with_option("--host-budget-gib", "nan"), "", "--host-budget-gib", "nan",
               "positive number"});
  c.push_back({"plan_gpu_budget_above_hbm", {}, plan_with_option("--gpu-budget-gib", "218.7"), "", "--gpu-budget-gib", "218.7",
               "above the 80 GiB of HBM per GPU of h100-sxm-node"});
  c.push_back({"plan_host_budget_above_dram", {}, plan_with_option("--host-budget-gib", "4096"), "", "--host-budget-gib", "4096",
               "above the 2016 GiB of host memory per node of h100-sxm-node"});
  c.push_back({"workload_gpu_budget_above_hbm", {{"w.json", workload_with([](json& j) { j["gpu_budget_gib"] = 100; })}},
               memory_with_workload(), W, "gpu_budget_gib", "100", "above the 80 GiB of HBM per GPU"});
  c.push_back({"workload_host_budget_above_dram", {{"w.json", workload_with([](json& j) { j["host_budget_gib"] = 3000; })}},
               {"plan", "--workload", W}, W, "host_budget_gib", "3000", "above the 2016 GiB of host memory per node"});
  c.push_back({"whatif_gpu_budget_above_hbm", {{"s.json", study_with([](json& j) { j["sweeps"][0]["gpu_budget_gib"] = {64, 100}; })}},
               whatif, S + " (sweep batch)", "gpu_budget_gib", "100", "above the 80 GiB of HBM per GPU"});
  c.push_back({"plan_nodes_overflowing_gpu_count", {}, plan_with_option("--nodes", "2147483647"), "", "--nodes", "2147483647",
               "out of range 1..65536"});
  c.push_back({"workload_nodes_above_bound", {{"w.json", workload_with([](json& j) { j["nodes"] = 100000; })}},
               memory_with_workload(), W, "nodes", "100000", "out of range 1..65536"});
  c.push_back({"whatif_nodes_above_bound", {{"s.json", study_with([](json& j) { j["sweeps"][0]["nodes"] = {100000}; })}}, whatif,
               S, "sweeps[0].nodes[0]", "100000", "out of range 1..65536"});
  // One count per routed expert of Qwen3.6-35B-A3B (256), each finite, their sum not.
  c.push_back({"workload_routing_counts_infinite_sum",
               {{"w.json", workload_with([](json& j) { j["routing"] = {{"kind", "histogram"}, {"counts", std::vector<double>(256, 1e308)}}; })}},
               memory_with_workload(), W, "routing.counts", "[1e+308,1e+308", "finite"});
  {
    // A Chrome trace of one stage; `oom diff` reads it as both sides.
    const auto trace_with = [](const json& ts, const json& dur) {
      return json{{"traceEvents", {{{"ph", "X"}, {"name", "g0.fwd.L3.moe.c0.a2a_dispatch"}, {"cat", "a2a"}, {"pid", 0}, {"tid", 0},
                                    {"ts", ts}, {"dur", dur}}}}}
          .dump();
    };
    const std::string T = "{dir}/t.json";
    const std::vector<std::string> diff = {"diff", T, T};
    c.push_back({"diff_trace_ts_huge", {{"t.json", trace_with(1e308, 10)}}, diff, T, "traceEvents[0].ts", "1e+308", "out of range"});
    c.push_back({"diff_trace_ts_text", {{"t.json", trace_with("abc", 10)}}, diff, T, "traceEvents[0].ts", "\"abc\"", "number"});
    c.push_back({"diff_trace_dur_huge", {{"t.json", trace_with(0, 1e308)}}, diff, T, "traceEvents[0].dur", "1e+308", "out of range"});
  }
  {
    // A Local plan on 12 GPUs of two nodes: simulate refuses it, and memory and report alike.
    const std::string two_nodes = workload_with([](json& j) {
      j["hardware"] = "h100-sxm-2node";
      j["gpus"] = 12;
      j["global_batch"] = 24;
    });
    const std::string local = plan_with([](json& j) {
      j["path"] = "local";
      j["resident_layers"] = json::array();
    });
    for (const char* command : {"memory", "report", "simulate"}) {
      c.push_back({std::string(command) + "_local_plan_over_two_nodes", {{"w.json", two_nodes}, {"p.json", local}},
                   {command, "--workload", W, "--plan", P}, "", "gpus", "12", "one node"});
    }
  }
  c.push_back({"unknown_command", {}, {"frobnicate"}, "", "command", "\"frobnicate\"", "unknown command (known: model, memory"});
  c.push_back({"model_unknown_subcommand", {}, {"model", "frobnicate"}, "", "model command", "\"frobnicate\"", "unknown command (known: show"});
  c.push_back({"calibrate_hold_out_empty", {}, {"calibrate", "--records", paper, "--hardware", "h100-sxm-node", "--hold-out", "", "-o", "{dir}/c.json"},
               "", "--hold-out", "\"\"", "empty"});
  c.push_back({"calibrate_breakdown_weight_nan", {}, {cross[0], cross[1], cross[2], cross[3], cross[4], cross[5], "model", "--breakdown-weight", "nan"},
               "", "--breakdown-weight", "nan", "out of range"});
  // --- Bounded work: a plan whose graph would be too large is refused before it is built, naming
  // the field (planner/lowering/graph_size_estimate.h). One-token routing chunks on 262,144 tokens
  // per GPU would make ~2.5e8 stages, several GB; the row answers in milliseconds.
  {
    const std::string long_context = edited(kWorkload, [](json& j) {
      j["global_batch"] = 4;
      j["seq_len"] = 262144;
    });
    const std::string one_token_chunks = edited(kPlan, [](json& j) { j["routing_chunk_tokens"] = 1; });
    c.push_back({"simulate_routing_chunk_of_one_token", {{"w.json", long_context}, {"p.json", one_token_chunks}},
                 {"simulate", "--workload", "{dir}/w.json", "--plan", "{dir}/p.json"}, "{dir}/p.json", "routing_chunk_tokens", "1",
                 "--max-stages raises it"});
    c.push_back({"simulate_max_stages_not_a_count", {},
                 {"simulate", "--workload", "{src}/" + std::string(kWorkload), "--plan", "{src}/" + std::string(kPlan), "--max-stages", "0"},
                 "", "--max-stages", "0", "stage count"});
  }
  // --- schemas: unknown keys at every depth of every format, duplicate keys, messages naming the
  // file's own keys. The duplicate rows write the key a second time before the file's own: the
  // line names the later (the file's) value.
  c.push_back({"hardware_pcie_unknown_field", {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["pcie"]["gpu_per_switch"] = 2; })}},
               memory_with_workload(), H, "pcie.gpu_per_switch", "2", "unknown field"});
  c.push_back({"hardware_gpu_unknown_field", {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["gpu"]["l2_mb"] = 50; })}},
               memory_with_workload(), H, "gpu.l2_mb", "50", "unknown field"});
  c.push_back({"hardware_fabric_unknown_field",
               {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["fabric"]["per_gpu_bps"] = 9e11; })}},
               memory_with_workload(), H, "fabric.per_gpu_bps", "900000000000", "unknown field"});
  c.push_back({"hardware_numa_unknown_field", {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) {
                 j["numa"].push_back(j["numa"][0]);
                 j["numa"][1]["core"] = 8;
               })}},
               memory_with_workload(), H, "numa[1].core", "8", "unknown field"});
  c.push_back({"hardware_nested_oom_version",
               {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["gpu"]["oom_version"] = "0.9.0"; })}},
               memory_with_workload(), H, "gpu.oom_version", "\"0.9.0\"", "unknown field"});
  c.push_back({"hardware_provenance_value",
               {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["provenance"] = {{"numa.cores", "guessed"}}; })}},
               memory_with_workload(), H, "provenance.numa.cores", "\"guessed\"", "expected one of measured, assumed"});
  c.push_back({"hardware_provenance_unknown_field",
               {{"w.json", workload_on_hw()}, {"hw.json", hw_with([](json& j) { j["provenance"] = {{"gpu.clock", "measured"}}; })}},
               memory_with_workload(), H, "provenance.gpu.clock", "\"measured\"", "unknown field"});
  // `oom hardware probe -o`: the output is checked like every other before anything is probed.
  c.push_back({"hardware_probe_output_is_a_folder", {}, {"hardware", "probe", "-o", "{dir}"}, "{dir}", "", "", "is a directory"});
  c.push_back({"hardware_duplicate_key",
               {{"w.json", workload_on_hw()}, {"hw.json", duplicated(hw_with([](json&) {}), "\"gpu\": {", "\"hbm_gib\": 80,")}},
               memory_with_workload(), H, "gpu.hbm_gib", "139", "duplicate key"});
  c.push_back({"model_duplicate_key", {{"m.json", duplicated(tiny, "{", "\"hidden_size\": 32,")}}, model_show(), M, "hidden_size",
               "64", "duplicate key"});
  c.push_back({"model_experts_per_token_null", {{"m.json", model_with([](json& j) { j["num_experts_per_tok"] = nullptr; })}},
               model_show(), M, "num_experts_per_tok", "(missing)", "num_experts_per_tok or top_k_experts"});
  c.push_back({"model_experts_missing", {{"m.json", model_with([](json& j) { j.erase("num_experts"); })}}, model_show(), M,
               "num_experts", "(missing)", "num_experts or n_routed_experts or num_local_experts"});
  c.push_back({"workload_duplicate_key", {{"w.json", duplicated(workload_with([](json&) {}), "{", "\"gpus\": 2,")}},
               memory_with_workload(), W, "gpus", "4", "duplicate key"});
  c.push_back({"plan_duplicate_key", {{"p.json", duplicated(plan_with([](json&) {}), "\"split\": {", "\"moe_chunk_tokens\": 8,")}},
               memory_with_plan(), P, "split.moe_chunk_tokens", "0", "duplicate key"});
  c.push_back({"records_measured_unknown_field", {{"r.jsonl", record_with([](json& j) { j["measured"]["gpu_peak_gb"] = 60.5; })}},
               {"@records", R}, R + ":1", "measured.gpu_peak_gb", "60.5", "unknown field"});
  c.push_back({"records_operator_measured_unknown_field",
               {{"r.jsonl", json{{"id", "op1"}, {"kind", "operator"}, {"model", "tiny-moe"}, {"hardware", "h100-sxm-node"},
                                 {"layer_type", "moe"}, {"op", "experts"}, {"batch", 1}, {"seq_len", 128},
                                 {"measured", {{"time_s", 0.001}, {"time_us", 1000}}}}.dump()}},
               {"@records", R}, R + ":1", "measured.time_us", "1000", "unknown field"});
  c.push_back({"records_duplicate_key", {{"r.jsonl", duplicated(record_with([](json&) {}), "\"measured\":{", "\"step_s\":1.0,")}},
               {"@records", R}, R + ":1", "measured.step_s", "3.776", "duplicate key"});
  c.push_back({"validate_record_plan_unknown_field",
               {{"r.jsonl", record_with([](json& j) { j["plan"]["split"]["gdn_chunk"] = 4096; })}}, {"validate", R, "--explain", "t4-b16"}, R + ":1",
               "plan.split.gdn_chunk", "4096", "unknown field"});
  c.push_back({"calibration_duplicate_key", {{"c.json", duplicated(calibration_with([](json&) {}), "{", "\"gemm_efficiency\": 0.5,")}},
               simulate_cal, C, "gemm_efficiency", "0.", "duplicate key"});
  c.push_back({"calibration_unread_fit", {{"c.json", calibration_with([](json& j) { j["fit"] = {{"records", 12}}; })}}, simulate_cal,
               C, "fit", "{\"records\":12}", "unknown field"});
  c.push_back({"published_breakdown_unknown_mechanism",
               {{"b.json", breakdowns_with([](json& j) { j["breakdowns"][0]["mechanisms"]["non_compute"] = 4.55; })}}, explain, B,
               "breakdowns[0].mechanisms.non_compute", "4.55", "unknown field"});
  c.push_back({"published_breakdown_unknown_layer_kind",
               {{"b.json", breakdowns_with([](json& j) { j["breakdowns"][2]["layer_forward_s"]["attention"] = 3.18; })}}, explain, B,
               "breakdowns[2].layer_forward_s.attention", "3.18", "unknown field"});
  c.push_back({"published_breakdown_duplicate_key",
               {{"b.json", duplicated(breakdowns_with([](json&) {}), "\"breakdowns\": [\n    {", "\"step_s\": 1,")}}, explain, B,
               "breakdowns[0].step_s", "8.5", "duplicate key"});
  c.push_back({"whatif_duplicate_key", {{"s.json", duplicated(study_with([](json&) {}), "\"sweeps\": [\n    {", "\"seq_len\": [1],")}},
               whatif, S, "sweeps[0].seq_len", "[", "duplicate key"});
  c.push_back({"ablation_duplicate_key",
               {{"a.json", duplicated(ablation_with([](json&) {}), "\"variants\": [\n    {", "\"name\": \"x\",")}}, ablation, A,
               "variants[0].name", "\"", "duplicate key"});
  // oom diff PREDICTED MEASURED: the Chrome form's stage events and their args, and the Trace form.
  const std::string T = "{dir}/t.json";
  const std::string small_trace = read_file(fs::path(kSrc) / "tests/fuzz/seeds/trace/small.json");
  const std::vector<std::string> diff = {"diff", "{src}/tests/fuzz/seeds/trace/small.json", T};
  const auto chrome_with = [](const std::string& event) {
    return R"({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "gpu0"}}, )" + event +
           R"(], "displayTimeUnit": "ms", "otherData": {"engine": "torch", "step_s": 0.002}})";
  };
  const std::string stage_event = R"({"ph": "X", "name": "g0.fwd.L0.attn.h0.core", "cat": "attention", "pid": 1, "tid": 1, "ts": 0, )";
  c.push_back({"diff_chrome_unknown_event_field", {{"t.json", chrome_with(stage_event + R"("dur": 2000, "durr": 5})")}}, diff, T,
               "traceEvents[1].durr", "5", "unknown field"});
  c.push_back({"diff_chrome_unknown_arg",
               {{"t.json", chrome_with(stage_event + R"("dur": 2000, "args": {"id": 1, "layer": 0, "flop": 1e12}})")}}, diff, T,
               "traceEvents[1].args.flop", "1000000000000", "unknown field"});
  c.push_back({"diff_chrome_unknown_field", {{"t.json", duplicated(chrome_with(stage_event + R"("dur": 2000})"), "{", R"("units": "us", )")}},
               diff, T, "units", "\"us\"", "unknown field"});
  c.push_back({"diff_chrome_duplicate_key", {{"t.json", chrome_with(stage_event + R"("dur": 2000, "dur": 3000})")}}, diff, T,
               "traceEvents[1].dur", "3000", "duplicate key"});
  c.push_back({"diff_trace_duplicate_key", {{"t.json", duplicated(small_trace, "\"stages\": [\n  {", R"("kind": "gemm", )")}}, diff,
               T, "stages[0].kind", "\"h2d\"", "duplicate key"});
  // --- every shipped input runs: oom plot STUDY.csv reads every row and cell before it plots
  const std::string V = "{dir}/s.csv";
  const std::vector<std::string> plot = {"plot", V, "--kind", "throughput", "-o", "{dir}/plot.png"};
  c.push_back({"plot_csv_short_row", {{"s.csv", study_csv_with(3, [](auto& row) { row.resize(row.size() - 2); })}}, plot, V + ":3",
               "", "", "column 'best_baseline' is missing"});
  c.push_back({"plot_csv_long_row", {{"s.csv", study_csv_with(2, [](auto& row) { row.push_back("7"); })}}, plot, V + ":2", "", "",
               "23 cells, the header only 22"});
  c.push_back({"plot_csv_nan_step", {{"s.csv", study_csv_with(3, set_cell("step_s", "nan"))}}, plot, V + ":3", "step_s",
               "\"nan\"", "finite number"});
  c.push_back({"plot_csv_infinite_baseline", {{"s.csv", study_csv_with(2, set_cell("fsdp2-offload_step_s", "inf"))}}, plot, V + ":2",
               "fsdp2-offload_step_s", "\"inf\"", "finite number"});
  c.push_back({"plot_csv_word_for_gpus", {{"s.csv", study_csv_with(4, set_cell("gpus", "four"))}},
               {"plot", V, "--kind", "memory", "-o", "{dir}/plot.png"}, V + ":4", "gpus", "\"four\"", "finite number"});
  c.push_back({"plot_csv_absent_gpus", {{"s.csv", study_csv_with(2, set_cell("gpus", ""))}}, plot, V + ":2", "gpus", "\"\"",
               "finite number"});
  c.push_back({"plot_csv_header_without_step", {{"s.csv", study_csv_with(1, set_cell("step_s", "step"))}}, plot, V + ":1", "", "",
               "no column 'step_s'"});
  c.push_back({"plot_csv_open_quote", {{"s.csv", study_csv_with(3, set_cell("plan", "\"ep R23"))}}, plot, V + ":3", "", "",
               "quoted cell"});
  c.push_back({"plot_ablation_csv_word_for_step",
               {{"a.csv", "workload,variant,step_s,optimizer_tail_s,gpu_peak_gib,study_peak_gib,fits_gpu,binding_peak,peak_change,"
                          "step_change,gpu_peak_change,tail_speedup\n"
                          "\"w\",\"standard\",4.5,0.5,60.00,10.00,yes,dispatch,0.0000,0.0000,0.0000,1.0000\n"
                          "\"w\",\"LLEP\",slow,0.5,55.00,5.00,yes,dispatch,-0.5000,0.0100,-0.0800,1.0000\n"}},
               {"plot", "{dir}/a.csv", "--kind", "ablation", "-o", "{dir}/plot.png"}, "{dir}/a.csv:3", "step_s", "\"slow\"",
               "finite number"});
  // --- the file system: an input that is no regular file, a configs folder that is not there
  c.push_back({"model_fifo", {{"m.json", kFifo}}, model_show(), M, "", "", "is a FIFO, not a regular file"});
  c.push_back({"records_fifo", {{"r.jsonl", kFifo}}, {"validate", R}, R, "", "", "is a FIFO, not a regular file"});
  c.push_back({"config_dir_missing", {}, {"model", "list"}, "", "OOM_CONFIG_DIR", "\"{dir}/nowhere\"", "no such folder",
               {{"OOM_CONFIG_DIR", "{dir}/nowhere"}}});
  return c;
}

std::string substitute(std::string s, const fs::path& dir) {
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"{dir}", dir.string()}, {"{src}", kSrc}}) {
    for (auto pos = s.find(key); pos != std::string::npos; pos = s.find(key, pos + value.size())) s.replace(pos, key.size(), value);
  }
  return s;
}

std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// Test logs print the row's name, not its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class BadInput : public ::testing::TestWithParam<Case> {};

TEST_P(BadInput, OneLineNamingFileFieldValueExit2NothingWritten) {
  const Case& t = GetParam();
  std::string tmpl = (fs::path(::testing::TempDir()) / "oom-bad-input-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const fs::path dir = tmpl;
  for (const auto& [name, content] : t.files) {
    if (content == kDirectory) {
      fs::create_directory(dir / name);
    } else if (content == kFifo) {
      ASSERT_EQ(::mkfifo((dir / name).c_str(), 0644), 0);
    } else {
      std::ofstream(dir / name, std::ios::binary) << substitute(content, dir);
    }
  }
  std::vector<std::string> args;
  for (const auto& a : t.args) args.push_back(substitute(a, dir));

  std::string err_text;
  int rc = 0;
  std::string out_text;
  const bool writes_output = args[0] == "memory" || args[0] == "report";
  // Half the rows find an earlier output that must stay as it was, half find none.
  const bool had_output = std::hash<std::string>{}(t.name) % 2 == 0;
  const fs::path output = dir / "out.txt";
  if (writes_output) {
    args.push_back("-o");
    args.push_back(output.string());
    if (had_output) std::ofstream(output) << "the previous report\n";
  }
  const auto before = listing(dir);
  if (args[0] == "@records") {
    try {
      oom::load_records(args[1]);
      FAIL() << "load_records accepted the input";
    } catch (const oom::InputError& e) {
      err_text = std::string("error: ") + e.what() + "\n";
      rc = oom::cli::kExitBadInput;
    }
  } else {
    std::vector<std::pair<std::string, std::optional<std::string>>> saved;
    for (const auto& [name, value] : t.env) {
      const char* was = std::getenv(name.c_str());
      saved.emplace_back(name, was != nullptr ? std::optional<std::string>(was) : std::nullopt);
      ::setenv(name.c_str(), substitute(value, dir).c_str(), 1);
    }
    std::ostringstream out, err;
    rc = oom::cli::run(args, {out, err});
    out_text = out.str();
    err_text = err.str();
    for (const auto& [name, was] : saved) {
      if (was) {
        ::setenv(name.c_str(), was->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

  EXPECT_EQ(rc, oom::cli::kExitBadInput) << err_text;
  EXPECT_EQ(out_text, "");
  // Exactly one line.
  ASSERT_FALSE(err_text.empty());
  EXPECT_EQ(err_text.find('\n'), err_text.size() - 1) << err_text;
  EXPECT_EQ(err_text.rfind("error: ", 0), 0u) << err_text;
  const std::string line = err_text.substr(0, err_text.size() - 1);
  if (std::getenv("OOM_PRINT_ERROR_LINES") != nullptr) std::cout << t.name << "  →  " << line << "\n";
  const std::string file = substitute(t.file, dir);
  if (!file.empty()) {
    EXPECT_NE(line.find("error: " + file + ": "), std::string::npos) << line;
  }
  if (!t.field.empty()) {
    EXPECT_NE(line.find("field '" + t.field + "'"), std::string::npos) << line;
    EXPECT_NE(line.find("value " + substitute(t.value, dir)), std::string::npos) << line;
  }
  if (!t.reason.empty()) {
    EXPECT_NE(line.find(t.reason), std::string::npos) << line;
  }
  // Nothing written.
  EXPECT_EQ(listing(dir), before);
  if (writes_output) {
    if (had_output) {
      EXPECT_EQ(read_file(output), "the previous report\n");
    } else {
      EXPECT_FALSE(fs::exists(output));
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Table, BadInput, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(BadInputTable, HasAtLeastThirtyRowsOverEveryLoaderAndCommand) {
  const auto rows = cases();
  EXPECT_GE(rows.size(), 30u);
  std::set<std::string> commands;
  for (const auto& r : rows) commands.insert(r.args[0] == "model" ? "model show" : r.args[0]);
  EXPECT_EQ(commands, (std::set<std::string>{"model show", "memory", "report", "simulate", "plan", "whatif", "report-paper",
                                             "calibrate", "validate", "ablation", "diff", "frobnicate", "plot", "@records",
                                             "hardware"}));
}

// The same inputs with nothing wrong are accepted: the rows fail for the reason they name.
TEST(BadInputTable, UneditedInputsAreAccepted) {
  std::ostringstream out, err;
  EXPECT_EQ(oom::cli::run({"model", "show", kSrc + "/" + kTiny}, {out, err}), 0) << err.str();
  EXPECT_EQ(oom::cli::run({"memory", "--workload", kSrc + "/" + kWorkload, "--plan", kSrc + "/" + kPlan}, {out, err}), 0)
      << err.str();
  EXPECT_NO_THROW(oom::load_records(kSrc + "/traces/paper/paper-calibration.jsonl"));
  EXPECT_NO_THROW(oom::check_study_csv(study_csv_with(1, [](auto&) {}), "s.csv"));
  const std::string calibration = kSrc + "/configs/calibration/h100-sxm-node.json";
  EXPECT_EQ(oom::cli::run({"simulate", "--workload", kSrc + "/" + kWorkload, "--plan", kSrc + "/" + kPlan, "--calibration",
                           calibration},
                          {out, err}),
            0)
      << err.str();
}

// Every format the project defines accepts an oom_version (a string) at its root, which the
// packaging writes: one shipped file of each, with the field added, loads as it does without.
TEST(BadInputTable, OomVersionIsAcceptedInEveryFormat) {
  std::string tmpl = (fs::path(::testing::TempDir()) / "oom-version-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const fs::path dir = tmpl;
  const auto write = [&](const std::string& name, json j) {
    j[oom::kOomVersionKey] = "0.9.0";
    std::ofstream(dir / name) << j.dump(2);
    return (dir / name).string();
  };
  const auto shipped = [&](const std::string& rel, const std::string& name) { return write(name, read_json(rel)); };
  const oom::HardwareSpec h100 = oom::load_hardware_spec("h100-sxm-node");
  EXPECT_NO_THROW(oom::load_model_spec(shipped(kTiny, "model.json")));
  EXPECT_NO_THROW(oom::load_hardware_spec(shipped(kH200, "hardware.json")));
  EXPECT_NO_THROW(oom::load_hardware_spec(shipped("configs/hardware/h200-sxm-4node.json", "cluster.json")));
  EXPECT_NO_THROW(oom::load_workload(shipped(kWorkload, "workload.json")));
  EXPECT_NO_THROW(oom::load_plan(shipped(kPlan, "plan.json")));
  EXPECT_NO_THROW(oom::load_calibration_file(shipped("configs/calibration/h100-sxm-node.json", "calibration.json"), h100));
  EXPECT_NO_THROW(oom::load_study(shipped("experiments/paper/fig5a-h100-batch.json", "study.json")));
  EXPECT_NO_THROW(oom::load_ablation(shipped("experiments/flat-optimizer.json", "ablation.json")));
  EXPECT_NO_THROW(oom::load_published_breakdowns(shipped("traces/paper/published-breakdowns.json", "breakdowns.json")));
  write("histogram.json", {{"counts", {1, 2, 3, 4}}, {"source", "a test"}});
  json routed = read_json(kWorkload);
  routed["routing"] = {{"kind", "histogram"}, {"file", "histogram.json"}};
  EXPECT_NO_THROW(oom::load_workload(write("routed.json", routed)));
  json record = json::parse(first_record_line());
  record[oom::kOomVersionKey] = "0.9.0";
  std::ofstream(dir / "records.jsonl") << record.dump() << "\n";
  EXPECT_NO_THROW(oom::load_records((dir / "records.jsonl").string()));
  // Traces, both forms, as oom diff reads them.
  const json trace = read_json("tests/fuzz/seeds/trace/small.json");
  const std::string trace_file = write("trace.json", trace);
  const std::string chrome_file = write("chrome.json", oom::trace_to_chrome_json(oom::trace_from_json(trace, "small.json")));
  std::ostringstream out, err;
  EXPECT_EQ(oom::cli::run({"diff", trace_file, chrome_file}, {out, err}), 0) << err.str();
  fs::remove_all(dir);
}

}  // namespace
