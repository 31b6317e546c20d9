#include "costmodel/output_path.h"

#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

namespace fs = std::filesystem;

// The folder a path lies in ("." for a bare name).
fs::path folder_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

std::optional<struct stat> stat_of(const fs::path& p) {
  struct stat st{};
  if (::stat(p.c_str(), &st) != 0) return std::nullopt;
  return st;
}

bool on_procfs(const fs::path& folder) {
  struct statfs s{};
  return ::statfs(folder.c_str(), &s) == 0 && s.f_type == PROC_SUPER_MAGIC;
}

// Same file by device and inode where both exist, else the same absolute, normal path.
bool same_file(const fs::path& a, const fs::path& b) {
  const auto sa = stat_of(a), sb = stat_of(b);
  if (sa && sb) return sa->st_dev == sb->st_dev && sa->st_ino == sb->st_ino;
  if (sa || sb) return false;
  std::error_code ec1, ec2;
  const fs::path ca = fs::weakly_canonical(a, ec1), cb = fs::weakly_canonical(b, ec2);
  if (ec1 || ec2) return fs::absolute(a).lexically_normal() == fs::absolute(b).lexically_normal();
  return ca == cb;
}

// " (a link to TARGET)" when the output path was a link.
std::string via(const std::string& path, const std::string& target) {
  return target == path ? std::string() : fmt::format(" (a link to {})", target);
}

// The folder `folder` (of output `path`) exists, or with `may_create` its nearest existing
// ancestor does, and takes a new file. `probed` holds the folders already found writable.
void check_folder(const std::string& path, const fs::path& folder, bool may_create, std::set<std::string>& probed) {
  fs::path f = folder.empty() ? fs::path(".") : folder;
  struct stat st{};
  while (::stat(f.c_str(), &st) != 0) {
    const int err = errno;
    // ENOTDIR: a file is in the way further up; the walk up finds it and names it below.
    if (err != ENOENT && err != ENOTDIR) {
      throw InputError(path, fmt::format("cannot write the output in folder {}: {}", f.string(), std::strerror(err)));
    }
    const fs::path up = folder_of(f);
    if ((err == ENOENT && !may_create) || up == f) {
      throw InputError(path, fmt::format("cannot write the output: folder {} does not exist", f.string()));
    }
    f = up;
  }
  if (!S_ISDIR(st.st_mode)) {
    throw InputError(path, fmt::format("cannot write the output: {} is {}, not a folder", f.string(), file_type_name(st.st_mode)));
  }
  if (!probed.insert(fs::absolute(f).lexically_normal().string()).second) return;
  // Permissions do not stop root: only creating a file tells whether the folder takes one.
  std::string probe = (f / ".oom-output-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    const int err = errno;
    throw InputError(path, fmt::format("cannot write the output in folder {}: {}", f.string(), std::strerror(err)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

// Refuses `target` (output `path` with its links followed) when it is one of `inputs`.
void check_not_an_input(const std::string& path, const std::string& target, const std::vector<std::string>& inputs) {
  for (const auto& in : inputs) {
    if (in.empty() || in == "-") continue;
    if (same_file(target, in)) {
      throw InputError(path, fmt::format("the output{} is also an input of this command ({}): refusing to overwrite it",
                                         via(path, target), in));
    }
  }
}

// One output file: its target, the target's folder, not an input. Returns the target.
std::string check_file(const std::string& path, const std::vector<std::string>& inputs, bool may_create,
                       std::set<std::string>& probed) {
  const std::string target = output_target(path);
  check_folder(path, folder_of(target), may_create, probed);
  check_not_an_input(path, target, inputs);
  return target;
}

// Refuses two outputs that are one file.
void check_distinct(const std::vector<std::pair<std::string, std::string>>& outputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (same_file(outputs[i].second, outputs[j].second)) {
        throw InputError(outputs[i].first,
                         fmt::format("the output is also another output of this command ({}): one would overwrite the other",
                                     outputs[j].first));
      }
    }
  }
}

}  // namespace

const char* file_type_name(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

std::string output_target(const std::string& path) {
  fs::path p = path;
  for (int links = 0;; ++links) {
    struct stat st{};
    if (::lstat(p.c_str(), &st) != 0) return p.string();  // not there yet (the folder checks say why when it matters)
    if (!S_ISLNK(st.st_mode)) {
      if (!S_ISREG(st.st_mode)) {
        throw InputError(path, fmt::format("the output{} is {}, not a regular file: refusing to replace it (standard output is -)",
                                           via(path, p.string()), file_type_name(st.st_mode)));
      }
      return p.string();
    }
    if (links == kMaxOutputLinks) {
      throw InputError(path, fmt::format("the output is a chain of more than {} symbolic links (a loop?)", kMaxOutputLinks));
    }
    if (on_procfs(folder_of(p))) {
      throw InputError(path, fmt::format("the output{} names an open file of this process, not a file: write standard output as -",
                                         via(path, p.string())));
    }
    std::error_code ec;
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) throw InputError(path, fmt::format("cannot read the symbolic link {}: {}", p.string(), ec.message()));
    p = to.is_absolute() ? to : folder_of(p) / to;
  }
}

void check_output_files(const std::vector<std::string>& files, const std::vector<std::string>& inputs) {
  std::set<std::string> probed;
  std::vector<std::pair<std::string, std::string>> outputs;  // as given, target
  for (const auto& f : files) {
    if (f.empty() || f == "-") continue;
    outputs.emplace_back(f, check_file(f, inputs, false, probed));
  }
  check_distinct(outputs);
}

void check_output_folder(const std::string& folder, const std::vector<std::string>& names, const std::vector<std::string>& inputs) {
  if (const auto st = stat_of(folder); st && !S_ISDIR(st->st_mode)) {
    throw InputError(folder, fmt::format("the output folder is {}, not a folder", file_type_name(st->st_mode)));
  }
  std::set<std::string> probed;
  check_folder(folder, folder, true, probed);
  // The folders the command writes files into: `folder` and those under it that names go in.
  std::vector<fs::path> written = {fs::path(folder)};
  for (const auto& n : names) {
    const fs::path f = folder_of(fs::path(folder) / n);
    bool known = false;
    for (const auto& w : written) known = known || same_file(w, f);
    if (!known) written.push_back(f);
  }
  for (const auto& in : inputs) {
    if (in.empty() || in == "-") continue;
    std::error_code ec;
    const fs::path real = fs::weakly_canonical(in, ec);
    for (const auto& w : written) {
      if (same_file(w, in)) {
        throw InputError(folder, fmt::format("the output folder{} is also an input of this command ({}): refusing to write into it",
                                             w == fs::path(folder) ? std::string() : " " + w.string(), in));
      }
      if (same_file(w, folder_of(ec ? fs::path(in) : real))) {
        throw InputError(folder, fmt::format("the output folder {} holds {}, an input of this command: write the output elsewhere",
                                             w.string(), in));
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> outputs;
  for (const auto& n : names) {
    const std::string f = (fs::path(folder) / n).string();
    outputs.emplace_back(f, check_file(f, inputs, true, probed));
  }
  check_distinct(outputs);
}

}  // namespace oom
