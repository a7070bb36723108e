#include "data/loader.h"

#include <ATen/ATen.h>

#include <chrono>
#include <utility>
#include <vector>

#ifdef TRAINER_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace data {

Loader::Loader(const Dataset& dataset, std::function<at::Tensor(int64_t)> indices_of,
               LoaderOptions options)
    : dataset_(dataset), indices_of_(std::move(indices_of)), options_(options) {
  if (options_.prefetch < 1) options_.prefetch = 1;
  for (int64_t i = 0; i < options_.workers; ++i) threads_.emplace_back([this] { work(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_workers_.notify_all();
  for (auto& t : threads_) t.join();
}

int64_t Loader::buffer_bytes(const LoaderOptions& options, int64_t step_bytes) {
  const int64_t ahead = options.workers > 0 ? std::max<int64_t>(1, options.prefetch) : 0;
  return (ahead + 1) * step_bytes;
}

Batch Loader::read(const at::Tensor& indices) const {
  if (options_.read_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.read_delay_ms));
  }
  ++reads_;
  Batch b = dataset_.get(indices);
  if (options_.pin_memory) {
    b.inputs = b.inputs.pin_memory();
    b.targets = b.targets.pin_memory();
    if (b.positions.defined()) b.positions = b.positions.pin_memory();
  }
  return b;
}

void Loader::restart_locked(int64_t step) {
  // Reads in flight for dropped steps finish into slots nobody waits for; they are erased when
  // their worker returns (it finds no slot) or here.
  slots_.clear();
  next_to_schedule_ = step;
}

void Loader::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_workers_.wait(
        lock, [&] { return stopping_ || next_to_schedule_ <= current_ + options_.prefetch; });
    if (stopping_) return;
    const int64_t step = next_to_schedule_++;
    slots_[step];  // scheduled
    Slot result;
    try {
      // Indices are taken under the lock, in step order (the sampler reuses its storage).
      const at::Tensor indices = indices_of_(step).clone();
      lock.unlock();
      result.batch = read(indices);
    } catch (...) {
      result.error = std::current_exception();
    }
    if (lock.owns_lock()) lock.unlock();
    result.done = true;
    lock.lock();
    auto it = slots_.find(step);
    if (it != slots_.end() && !it->second.done) {
      it->second = std::move(result);
      wake_consumer_.notify_all();
    }
  }
}

Batch Loader::get(int64_t step) {
  if (step == current_ && current_batch_.inputs.defined()) return current_batch_;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  if (threads_.empty()) {
    current_batch_ = read(indices_of_(step));
    waited_s_ += std::chrono::duration<double>(Clock::now() - start).count();
    current_ = step;
    return current_batch_;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  // Neither read ahead nor next in line (a jump back or ahead): read ahead from here.
  if (slots_.count(step) == 0 && step != next_to_schedule_) restart_locked(step);
  // Let workers read up to step + prefetch while this one is awaited.
  current_ = step - 1;
  wake_workers_.notify_all();
  wake_consumer_.wait(lock, [&] {
    auto it = slots_.find(step);
    return it != slots_.end() && it->second.done;
  });
  waited_s_ += std::chrono::duration<double>(Clock::now() - start).count();
  Slot slot = std::move(slots_.at(step));
  slots_.erase(step);
  current_ = step;
  // Steps before this one are not wanted any more.
  while (!slots_.empty() && slots_.begin()->first < step) slots_.erase(slots_.begin());
  wake_workers_.notify_all();
  lock.unlock();
  if (slot.error) {
    current_batch_ = Batch{};
    std::rethrow_exception(slot.error);
  }
  current_batch_ = std::move(slot.batch);
  return current_batch_;
}

Batch to_device(const Batch& batch, int64_t offset, int64_t n, c10::Device device) {
  Batch micro{batch.inputs.narrow(0, offset, n), batch.targets.narrow(0, offset, n),
              batch.positions.defined() ? batch.positions.narrow(0, offset, n) : at::Tensor(),
              batch.pairs.defined() ? batch.pairs.narrow(0, offset, n) : at::Tensor()};
  if (device.is_cpu()) return micro;
  std::vector<at::Tensor*> parts{&micro.inputs, &micro.targets};
  if (micro.positions.defined()) parts.push_back(&micro.positions);
  if (micro.pairs.defined()) parts.push_back(&micro.pairs);
#ifdef TRAINER_HAVE_CUDA
  if (device.is_cuda()) {
    const auto compute = c10::cuda::getCurrentCUDAStream(device.index());
    const auto copy = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    {
      c10::cuda::CUDAStreamGuard on_copy(copy);
      for (at::Tensor* t : parts) *t = t->to(device, /*non_blocking=*/true);
    }
    at::cuda::CUDAEvent copied;
    copied.record(copy);
    copied.block(compute);  // the compute stream waits; the host does not
    // Allocated on the copy stream, used on the compute one: the allocator must not reuse the
    // memory before the compute stream is done with it.
    for (at::Tensor* t : parts) {
      c10::cuda::CUDACachingAllocator::recordStream(t->storage().data_ptr(), compute);
    }
    return micro;
  }
#endif
  for (at::Tensor* t : parts) *t = t->to(device);
  return micro;
}

}  // namespace data
