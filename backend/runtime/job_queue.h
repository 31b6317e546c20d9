// JobQueue: one thread that runs submitted jobs in order (the trainers' CPU AdamW updates while
// backward continues on the compute device).
//
// submit() returns the job's 1-based index; wait_done(n) blocks until the first n jobs finished and
// wait_all() until every submitted job did. A job's exception is kept (the first one) and rethrown
// by the next wait; later jobs still run. The destructor runs the jobs already queued, then joins.
// submit() and the waits are meant for one owning thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace oom::backend {

class JobQueue {
 public:
  JobQueue();
  ~JobQueue();
  JobQueue(const JobQueue&) = delete;
  JobQueue& operator=(const JobQueue&) = delete;

  int submit(std::function<void()> job);
  void wait_done(int n);
  void wait_all();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> jobs_;
  int submitted_ = 0, finished_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace oom::backend
