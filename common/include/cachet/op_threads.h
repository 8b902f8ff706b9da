// cachet/op_threads.h: the OS threads of an op list's threads (cachet/ops.h `t<k>`), for the runners
// that drive gpu/ (the lockstep harness, `cachet conform`'s impl engine). The calls of thread k run
// on an OS thread of their own, one at a time, while the runner waits: gpu/'s use_mem_pool filter
// compares std::this_thread::get_id() as PyTorch's does (docs/pytorch-allocator.md §14.10.2).
// Thread 0 is the runner's own thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "cachet/types.h"

namespace cachet {

class OpThreads {
 public:
  OpThreads() = default;
  OpThreads(const OpThreads&) = delete;
  OpThreads& operator=(const OpThreads&) = delete;

  // Runs f on thread t's OS thread and returns when it has; f must not throw (a runner catches
  // inside f and hands the exception back itself).
  void run(ThreadIndex t, const std::function<void()>& f) {
    if (t == 0) {
      f();
      return;
    }
    auto& w = workers_[t];
    if (!w) w = std::make_unique<Worker>();
    w->run(f);
  }

 private:
  class Worker {
   public:
    Worker() : thread_([this] { loop(); }) {}
    ~Worker() {
      {
        std::lock_guard lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
    void run(const std::function<void()>& f) {
      std::unique_lock lock(mu_);
      job_ = &f;
      cv_.notify_all();
      cv_.wait(lock, [&] { return job_ == nullptr; });
    }

   private:
    void loop() {
      std::unique_lock lock(mu_);
      for (;;) {
        cv_.wait(lock, [&] { return stop_ || job_ != nullptr; });
        if (job_ == nullptr) return;  // stop_ and nothing to run
        (*job_)();
        job_ = nullptr;
        cv_.notify_all();
      }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    const std::function<void()>* job_ = nullptr;
    bool stop_ = false;
    std::thread thread_;  // last: started once the members above exist
  };
  std::map<ThreadIndex, std::unique_ptr<Worker>> workers_;
};

}  // namespace cachet
