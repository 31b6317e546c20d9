// Crash-safe file output: every file the project writes goes through write_file_atomically().
//
// The content is written to a temporary file in the destination's folder, flushed to disk
// (fsync), and renamed over the destination, so a reader sees either the old file or the new
// one, never a half-written file, even if the writer is killed mid-write. Safe to call from
// several threads for different destinations.
//
// The destination is the file the path names (costmodel/output_path.h): a symbolic link is
// followed and its target replaced, the temporary file beside the target, the link kept; a
// destination that exists and is not a regular file (a device, FIFO, directory, socket, or a
// link in /proc such as /dev/stdout) is refused with an InputError, never replaced.
#pragma once

#include <string>
#include <string_view>

namespace oom {

// Writes `content` to `path` atomically. On failure throws std::runtime_error (InputError for a
// destination refused as above) naming the path and the system error, removes its temporary
// file, and leaves an existing destination untouched.
void write_file_atomically(const std::string& path, std::string_view content);

}  // namespace oom
