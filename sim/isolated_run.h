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

// Isolated runs of serialized requests, served by a small process forked early.
//
// Forking a large, multithreaded process for every run is what such runs cost most: the child's
// page tables are the parent's, every page either side writes while the child lives is copied
// (the parent's other threads keep writing), and the exit tears it all down again. A server
// forked while the process is still small (start_isolated_server(), before anything large is
// loaded) forks a child of its own size for each request instead. A request is bytes the caller
// serializes; the server's child runs `handler(request, out)` in a fresh process, as
// run_isolated() runs a body, and its output comes back through a pipe of the caller's.
using IsolatedHandler = void (*)(const std::string& request, std::string& out);

// Forks the server for `handler` (once per process: later calls do nothing). The server has one
// thread, holds no descriptor of the caller but its socket, and ends when the caller's process
// does. Returns false, starting nothing, when the process cannot fork or make the socket.
bool start_isolated_server(IsolatedHandler handler);
// True once start_isolated_server(handler) has started a server for this handler.
bool isolated_server_running(IsolatedHandler handler);

// `handler(request, out)` in an isolated process: through the server where one runs for this
// handler, else through run_isolated(). The same request gives the same bytes either way; errors
// as run_isolated() reports them. Several threads may call it at once.
std::string run_isolated_request(IsolatedHandler handler, const std::string& request);

}  // namespace oom::sim
