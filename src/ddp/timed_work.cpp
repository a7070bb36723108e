#include "ddp/timed_work.h"

#include <fmt/format.h>

#include "ddp/errors.h"

namespace ddp {

std::string OpInfo::describe() const {
  return fmt::format("{} of {} ({} x {})", desync::kind_name(kind), what, numel,
                     c10::toString(dtype));
}

TimedWork::TimedWork(OpInfo info, const Communicator& comm,
                     std::shared_ptr<desync::Tracker> tracker)
    : TimedWork(std::move(info), comm, std::move(tracker), desync::OpRecord{}) {
  if (tracker_) record_ = tracker_->post(info_.kind, info_.what, step_);
}

TimedWork::TimedWork(OpInfo info, const Communicator& comm,
                     std::shared_ptr<desync::Tracker> tracker, desync::OpRecord record)
    : info_(std::move(info)), step_(comm.step()), rank_(comm.rank()), timeout_(comm.timeout()),
      tracker_(std::move(tracker)), record_(record), posted_(Clock::now()) {}

void TimedWork::wait() {
  const auto started = Clock::now();
  while (!is_completed()) {
    const auto now = Clock::now();
    if (now - posted_ > timeout_) timed_out(now);
    pause(now - started);
  }
}

void TimedWork::mark_completed() noexcept {
  done_ = true;
  if (tracker_) tracker_->complete(record_);
}

TimedWork::Clock::time_point TimedWork::deadline() const {
  return posted_ + std::chrono::duration_cast<Clock::duration>(timeout_);
}

void TimedWork::timed_out(Clock::time_point now) {
  const std::string action = on_timeout();
  const std::chrono::duration<double> waited = now - posted_;
  std::string message = fmt::format(
      "rank {}: {} did not complete {}: waited {:.1f} s, past ddp.timeout_s = {:.0f} s. Another "
      "rank is stalled, dead, or issuing different collectives.{}",
      rank_, info_.describe(), Communicator::when(step_), waited.count(), timeout_.count(), action);
  // The exchange runs over the MPI control plane, whatever the backend (ddp/desync.h).
  if (tracker_) message += desync::diagnose(*tracker_, record_, timeout_, waited);
  throw CommTimeout(message);
}

}  // namespace ddp
