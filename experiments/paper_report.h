// The paper report (`oom report-paper`): every study of experiments/paper/ (one per figure or
// table of the OOM paper) as a section of one Markdown document that renders on GitHub.
//
// A section holds the study's figure and settings, its plots (PNG files beside the report, drawn
// by the caller), the table of predictions (each workload and OOM system: plan, step time,
// tokens/s, memory, each baseline's step time or out-of-memory), the largest workload each system
// completes per sweep, and, where published records matched (experiments/published.h), the
// predicted-vs-published table and the error summary. Pure text functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "experiments/study.h"

namespace oom {

// The study files (*.json) of a folder, sorted by name. Throws InputError naming `dir` when it
// is not a folder or holds none.
std::vector<std::string> paper_study_files(const std::string& dir);

struct PaperSection {
  StudyResult result;
  std::vector<std::string> plots;  // PNG paths relative to the report
};

// The Markdown of one section and of the whole report (a title, how it was made, the sections
// in order, the overall published-error summary).
std::string paper_section_markdown(const PaperSection& s);
std::string paper_report_markdown(const std::vector<PaperSection>& sections, const std::string& engine, double wall_s);

}  // namespace oom
