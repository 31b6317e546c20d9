#include "experiments/paper_report.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "costmodel/token_text.h"
#include "costmodel/version.h"
#include "experiments/published.h"

namespace oom {
namespace {

std::string workload_cell(const Workload& w) {
  std::string s = fmt::format("{} · {}×{} · B={} · S={}", w.model, w.gpus, w.hardware, w.global_batch, tokens_text(w.seq_len));
  if (w.gpu_budget_gib) s += fmt::format(" · GPU≤{:g} GiB", *w.gpu_budget_gib);
  if (w.host_budget_gib) s += fmt::format(" · host≤{:g} GiB", *w.host_budget_gib);
  return s;
}

// Markdown table cells must not break the row.
std::string cell(std::string s) {
  std::replace(s.begin(), s.end(), '|', '/');
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

std::string pct(std::optional<double> e) { return e ? fmt::format("{:+.1f}%", 100 * *e) : std::string("–"); }

std::string predictions_table(const StudyResult& r) {
  std::string out = "| workload | system | plan | step (s) | tokens/s | GPU peak (GiB) | host (GiB) |";
  std::string rule = "|---|---|---|--:|--:|--:|--:|";
  for (const auto b : r.spec.baselines) {
    out += fmt::format(" {} (s) |", baseline_system_name(b));
    rule += "--:|";
  }
  if (!r.spec.baselines.empty()) {
    out += " speedup |";
    rule += "--:|";
  }
  out += "\n" + rule + "\n";
  for (const auto& row : r.rows) {
    out += fmt::format("| {} | {} |", workload_cell(row.study_case.workload), plan_variant_name(row.study_case.system));
    if (row.plan) {
      out += fmt::format(" {} | {:.3f} | {:.0f} | {:.1f} | {:.1f} |", cell(row.plan->summary), row.plan->step_s, row.plan->tokens_per_s,
                         to_gib(row.plan->gpu_peak_bytes), to_gib(row.plan->host_bytes()));
    } else {
      out += fmt::format(" out of memory: {} | – | – | – | – |", cell(row.infeasible));
    }
    for (const auto& b : row.baselines) {
      out += b.fits() ? fmt::format(" {:.2f} |", b.step_s)
                  : !b.not_run.empty() ? std::string(" n/a |")
                      : fmt::format(" OOM ({}) |", b.oom->space == "gpu" ? std::string("GPU") : fmt::format("host n{}", b.oom->device));
    }
    if (!r.spec.baselines.empty()) out += row.speedup ? fmt::format(" {:.2f}× |", *row.speedup) : std::string(" – |");
    out += "\n";
  }
  return out;
}

// Per sweep: the largest global batch (then context) each system completes.
std::string largest_workloads(const StudyResult& r) {
  std::string out;
  for (const auto& sweep : r.spec.sweeps) {
    const bool varies = sweep.global_batch.size() + sweep.seqs_per_gpu.size() > 1 || sweep.seq_len.size() > 1;
    if (!varies) continue;
    std::vector<std::pair<std::string, const StudyRow*>> best;  // system name → largest fitting row
    auto consider = [&](const std::string& name, const StudyRow& row) {
      auto it = std::find_if(best.begin(), best.end(), [&](const auto& p) { return p.first == name; });
      const auto tokens = [](const StudyRow* x) {
        return std::pair(x->study_case.workload.seq_len * x->study_case.workload.global_batch, x->study_case.workload.seq_len);
      };
      if (it == best.end()) {
        best.emplace_back(name, &row);
      } else if (!it->second || tokens(&row) > tokens(it->second)) {
        it->second = &row;
      }
    };
    auto none = [&](const std::string& name) {
      if (std::none_of(best.begin(), best.end(), [&](const auto& p) { return p.first == name; })) best.emplace_back(name, nullptr);
    };
    for (const auto& row : r.rows) {
      if (row.study_case.sweep != sweep.name) continue;
      const std::string oom = "OOM " + plan_variant_name(row.study_case.system);
      row.plan ? consider(oom, row) : none(oom);
      for (const auto& b : row.baselines) {
        const std::string name(baseline_system_name(b.system));
        b.fits() ? consider(name, row) : none(name);
      }
    }
    out += fmt::format("Largest workload each system completes (sweep {}): ", sweep.name);
    std::vector<std::string> parts;
    for (const auto& [name, row] : best) {
      parts.push_back(row ? fmt::format("{} B={} S={}", name, row->study_case.workload.global_batch, tokens_text(row->study_case.workload.seq_len))
                          : fmt::format("{} none", name));
    }
    out += fmt::format("{}.\n\n", fmt::join(parts, "; "));
  }
  return out;
}

// Table 5's shape: for sweeps of EP R/K grid systems, one table per workload with R down and K
// across, each cell the predicted step time or "OOM".
std::string residency_grids(const StudyResult& r) {
  std::string out;
  for (const auto& sweep : r.spec.sweeps) {
    std::vector<int> rs, ks;
    for (const auto& v : sweep.systems) {
      if (v.kind != PlanVariant::Kind::kEpGrid) return out;
      if (std::find(rs.begin(), rs.end(), v.resident_layers) == rs.end()) rs.push_back(v.resident_layers);
      if (std::find(ks.begin(), ks.end(), v.retained_layers) == ks.end()) ks.push_back(v.retained_layers);
    }
    std::vector<const Workload*> workloads;
    for (const auto& row : r.rows) {
      if (row.study_case.sweep != sweep.name) continue;
      if (std::none_of(workloads.begin(), workloads.end(), [&](const Workload* w) { return *w == row.study_case.workload; })) {
        workloads.push_back(&row.study_case.workload);
      }
    }
    for (const Workload* w : workloads) {
      out += fmt::format("Step time (s) by resident (R) and MoE-retained (K) decoders, {}:\n\n| |", workload_cell(*w));
      std::string rule = "|---|";
      for (const int k : ks) {
        out += fmt::format(" K{} |", k);
        rule += "--:|";
      }
      out += "\n" + rule + "\n";
      for (const int res : rs) {
        out += fmt::format("| R{} |", res);
        for (const int k : ks) {
          std::string v = "–";
          for (const auto& row : r.rows) {
            const PlanVariant& s = row.study_case.system;
            if (row.study_case.workload == *w && s.resident_layers == res && s.retained_layers == k) {
              v = row.plan ? fmt::format("{:.3f}", row.plan->step_s) : std::string("OOM");
            }
          }
          out += " " + v + " |";
        }
        out += "\n";
      }
      out += "\n";
    }
  }
  return out;
}

std::string published_table(const StudyResult& r) {
  std::string out;
  for (const auto& row : r.rows) {
    if (row.published && row.published->measured.step_s) {
      const auto pred = row.plan ? std::optional<double>(row.plan->step_s) : std::nullopt;
      out += fmt::format("| {} | {} | {} | {} | {:.3f} | {} |\n", row.published->id, workload_cell(row.study_case.workload),
                         plan_variant_name(row.study_case.system), pred ? fmt::format("{:.3f}", *pred) : std::string("OOM"),
                         *row.published->measured.step_s, pct(relative_error(pred, row.published->measured.step_s)));
    }
    for (std::size_t i = 0; i < row.published_baselines.size() && i < row.baselines.size(); ++i) {
      const auto& p = row.published_baselines[i];
      const auto& b = row.baselines[i];
      if (!p || !p->measured.step_s) continue;
      const auto pred = b.fits() ? std::optional<double>(b.step_s) : std::nullopt;
      out += fmt::format("| {} | {} | {} | {} | {:.3f} | {} |\n", p->id, workload_cell(row.study_case.workload),
                         baseline_system_name(b.system), pred ? fmt::format("{:.3f}", *pred) : std::string("OOM"),
                         *p->measured.step_s, pct(relative_error(pred, p->measured.step_s)));
    }
  }
  if (out.empty()) return "No published record matches this study's workloads.\n\n";
  return "| record | workload | system | predicted (s) | published (s) | error |\n|---|---|---|--:|--:|--:|\n" + out + "\n" +
         published_errors_text(r) + "\n\n";
}

// The published capacity verdicts beside the predicted ones (a study that states them).
std::string verdict_table(const StudyResult& r) {
  if (!states_verdicts(r.spec)) return "";
  std::string out = "### Capacity verdicts, published and predicted\n\n| workload | system | published | predicted | |\n|---|---|---|---|---|\n";
  for (const auto& row : r.rows) {
    for (const VerdictCheck& c : verdict_checks(r, row)) {
      out += fmt::format("| {} | {} | {} | {} | {} |\n", workload_cell(row.study_case.workload), c.system, capacity_name(c.published),
                         c.predicted, c.matches() ? "" : "MISMATCH");
    }
  }
  return out + "\n" + verdict_summary_text(r) + "\n\n";
}

}  // namespace

std::vector<std::string> paper_study_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(dir, "", "", "not a folder of study files");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path().string());
  }
  if (files.empty()) throw InputError(dir, "", "", "holds no study file (*.json)");
  std::sort(files.begin(), files.end());
  return files;
}

std::string paper_section_markdown(const PaperSection& s) {
  const StudyResult& r = s.result;
  std::string out = fmt::format("## {}: {}\n\n", r.spec.figure.empty() ? r.spec.name : r.spec.figure, r.spec.name);
  out += r.spec.description + ".\n\n";
  out += fmt::format("Study file `experiments/paper/{}.json`; {} cases in {:.1f} s.\n\n", r.spec.name, r.rows.size(), r.wall_s);
  for (const auto& p : s.plots) out += fmt::format("![{}]({})\n\n", r.spec.name, p);
  out += residency_grids(r);
  out += predictions_table(r) + "\n";
  out += largest_workloads(r);
  out += verdict_table(r);
  if (!r.published_file.empty()) out += "### Predicted vs published\n\n" + published_table(r);
  return out;
}

std::string paper_report_markdown(const std::vector<PaperSection>& sections, const std::string& engine, double wall_s) {
  std::string out = "# The OOM paper, figure by figure (predicted)\n\n";
  std::string published;
  for (const auto& s : sections) {
    if (!s.result.published_file.empty()) published = s.result.published_file;
  }
  out += fmt::format("Every study of `experiments/paper/` run with the {} engine in {:.1f} s ({} studies). Each section names the "
                     "figure or table of the OOM paper (arXiv 2611.11364) it reproduces and its settings; plots mark "
                     "out-of-memory with an x at the top edge{}.\n\n",
                     engine, wall_s, sections.size(),
                     published.empty() ? std::string() : fmt::format(" and published points (`{}`) with hollow stars", published));
  out += fmt::format("Written by oom {}.\n\n", oom_version_text());
  out += "| section | cases | published points | median abs. error | max abs. error |\n|---|--:|--:|--:|--:|\n";
  for (const auto& s : sections) {
    const PublishedErrors e = published_errors(s.result);
    const int n = e.plan_count + e.baseline_count;
    out += fmt::format("| {} | {} | {} | {} | {} |\n", s.result.spec.figure.empty() ? s.result.spec.name : s.result.spec.figure,
                       s.result.rows.size(), n, e.plan_count ? fmt::format("{:.1f}% (OOM)", 100 * e.plan_median_abs) : std::string("–"),
                       e.plan_count ? fmt::format("{:.1f}% (OOM)", 100 * e.plan_max_abs) : std::string("–"));
  }
  out += "\n";
  for (const auto& s : sections) out += paper_section_markdown(s);
  return out;
}

}  // namespace oom
