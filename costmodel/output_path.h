// Where a command's output goes: the file write_file_atomically() replaces, and the checks every
// command makes on each output it will write before it starts its work.
//
// The rules, each refusal an InputError of one line naming the output path as given:
// - Standard output is named "-" (or left empty); it is never checked.
// - Symbolic links are followed (a chain of links to its end, at most kMaxOutputLinks): the
//   target is written, atomically, its temporary file beside the target, and the links stay
//   links. A dangling link (its target does not exist yet) creates the target, when the target's
//   folder exists. A relative link target is read from the link's own folder, as the kernel does.
// - A link that lives in /proc (procfs: /dev/stdout -> /proc/self/fd/1, /dev/fd/N) names an open
//   file of this process, not a file, and is refused: replacing what it points at would detach
//   the file from the descriptor (a terminal, a pipe, or the file the shell redirected into).
// - An output that exists must be a regular file: a directory, character or block device, FIFO
//   or socket is refused, never replaced (as root, `-o /dev/null` would otherwise destroy it).
// - An output may not be one of the command's inputs: the same file by device and inode (after
//   links, hard links too), or, where either does not exist, the same path once made absolute
//   and normal. Two outputs of one command may not be the same file either.
// - An output folder must exist and take a new file (a temporary file is created there and
//   removed at once: a missing folder, a file in the way, a read-only file system or a folder
//   the user may not write are found before the work, even as root, whom permissions never stop).
// - An output folder a command creates (whatif, ablation, report-paper -o DIR) may be missing:
//   its nearest existing ancestor must be a folder that takes a new file. Such a folder may not
//   be an input, nor hold one: an input directly in DIR (or in a folder the command writes files
//   into) is refused, so the command's files can never land on its inputs.
// The checks read the file system as it is when called; a change between the check and the
// write is caught by the write itself (write_file_atomically() applies the same link and type
// rules), never by replacing a device.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace oom {

// Links followed before an output path is refused as a loop (the kernel's limit, SYMLOOP_MAX).
inline constexpr int kMaxOutputLinks = 40;

// The file `path` names as an output: its symbolic links followed (the path itself when it is no
// link; a dangling link's target). Throws InputError for a link loop, a link in /proc, or an
// existing target that is not a regular file.
std::string output_target(const std::string& path);

// Checks the output files of one command before it starts: each as above, its folder existing
// and taking a new file, none of them one of `inputs` (paths as given; empty entries and names
// that are no file are fine), no two of them the same file. "-" and "" are standard output.
void check_output_files(const std::vector<std::string>& files, const std::vector<std::string>& inputs);

// Checks an output folder the command creates when needed and the files it will write in it
// (`names`, relative to `folder`, e.g. "study.csv" or "fig5a/study.json"), as above.
void check_output_folder(const std::string& folder, const std::vector<std::string>& names,
                         const std::vector<std::string>& inputs);

// "a directory", "a character device", "a block device", "a FIFO", "a socket", "a symbolic link",
// "a regular file" for a stat() mode: how the checks and the input reader name what they refuse.
const char* file_type_name(mode_t mode);

}  // namespace oom
