#include "ddp/mpi_progress.h"

#include <sys/prctl.h>

#include <algorithm>

namespace ddp {
namespace {
std::unique_ptr<MpiProgress>& instance() {
  static std::unique_ptr<MpiProgress> progress;
  return progress;
}
std::atomic<MpiProgress*> g_running{nullptr};
}  // namespace

MpiProgress* MpiProgress::running() { return g_running.load(std::memory_order_acquire); }

void MpiProgress::start(std::chrono::microseconds poll) {
  if (instance()) return;
  instance().reset(new MpiProgress(poll));
  g_running.store(instance().get(), std::memory_order_release);
}

void MpiProgress::stop() noexcept {
  g_running.store(nullptr, std::memory_order_release);
  instance().reset();
}

MpiProgress::MpiProgress(std::chrono::microseconds poll) : poll_(poll) {
  thread_ = std::thread([this] { loop(); });
}

MpiProgress::~MpiProgress() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<PendingRequest> MpiProgress::track(MPI_Request request) {
  auto p = std::make_shared<PendingRequest>();
  p->request = request;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(p);
  }
  work_.notify_one();
  return p;
}

bool MpiProgress::wait_until(const PendingRequest& p,
                             std::chrono::steady_clock::time_point deadline) {
  waiters_.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(mutex_);
  const bool done =
      done_.wait_until(lock, deadline, [&] { return p.done.load(std::memory_order_acquire); });
  waiters_.fetch_sub(1, std::memory_order_relaxed);
  return done;
}

void MpiProgress::loop() {
  // Sleeps of a few tens of microseconds: the kernel's default timer slack (50 us) would
  // stretch each one to ~60 us.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  std::vector<std::shared_ptr<PendingRequest>> mine;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (stop_) return;
      mine = pending_;  // new requests join at the next round
    }
    bool completed = false;
    for (const auto& p : mine) {
      int flag = 0;
      const int rc = MPI_Test(&p->request, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) p->error = rc;
      if (flag || rc != MPI_SUCCESS) {
        p->done.store(true, std::memory_order_release);
        completed = true;
      }
    }
    if (completed) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                      [](const auto& p) { return p->done.load(); }),
                       pending_.end());
      }
      done_.notify_all();
    } else if (waiters_.load(std::memory_order_relaxed) > 0) {
      // The training thread is waiting, not computing: the core is this thread's.
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(poll_);
    }
  }
}

}  // namespace ddp
