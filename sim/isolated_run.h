// Isolated runs: SimGrid work in a child process, so one process can simulate many times.
//
// SimGrid 3.32 keeps one global engine per process and cannot create a second after the first
// (models and configuration are frozen once initialized). run_isolated() forks, runs `body` in
// the child with a fresh SimGrid state, and returns the bytes the child wrote to its output. The
// parent never initializes SimGrid, so runs are independent and repeatable: the same body gives
// the same bytes. Assumptions: POSIX fork; the child needs none of the caller's other threads
// (it only runs `body`, which must not wait on locks those threads may hold; glibc's malloc is
// fork-safe). Several threads may run isolated runs at once: each child closes every inherited
// descriptor but its own pipe end, so no child keeps another run's pipe open.
#pragma once

#include <functional>
#include <string>

namespace oom::sim {

// Runs `body(out)` in a forked child and returns what it appended to `out`.
// On success the child exits 0 and its output comes back whole. If `body` throws, the exception's
// message comes back as a std::runtime_error("simulation failed: ..."); if the child dies
// (assertion, signal), a std::runtime_error says how. Nothing of the child's state survives.
std::string run_isolated(const std::function<void(std::string& out)>& body);

}  // namespace oom::sim
