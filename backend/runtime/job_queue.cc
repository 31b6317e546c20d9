#include "backend/runtime/job_queue.h"

namespace oom::backend {

JobQueue::JobQueue() : thread_([this] { loop(); }) {}

JobQueue::~JobQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int JobQueue::submit(std::function<void()> job) {
  int index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    index = ++submitted_;
  }
  cv_.notify_all();
  return index;
}

void JobQueue::wait_done(int n) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return finished_ >= n; });
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void JobQueue::wait_all() {
  int n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = submitted_;
  }
  wait_done(n);
}

void JobQueue::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    std::exception_ptr err;
    try {
      job();
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (err && !error_) error_ = err;
      ++finished_;
    }
    done_cv_.notify_all();
  }
}

}  // namespace oom::backend
