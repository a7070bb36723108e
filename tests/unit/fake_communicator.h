// A Communicator for one-process tests: it records every operation and behaves as if `world`
// identical ranks took part (SUM multiplies by world, AVG/MAX/MIN leave values unchanged).
// Operations complete when wait() is called, or at once with `complete_immediately`.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "ddp/communicator.h"

namespace trainer_test {

class FakeCommunicator final : public ddp::Communicator {
 public:
  struct Op {
    std::string kind;
    std::string what;
    int64_t numel;
  };

  explicit FakeCommunicator(int world = 1, int rank = 0) : world_(world), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  std::string_view backend() const override { return "fake"; }

  ddp::WorkPtr all_reduce_async(at::Tensor t, ddp::ReduceOp op, std::string_view what) override {
    ops.push_back({"all_reduce", std::string(what), t.numel()});
    const int w = world_;
    return std::make_unique<FakeWork>([t, op, w]() mutable {
      if (op == ddp::ReduceOp::kSum) t.mul_(w);
    });
  }
  ddp::WorkPtr broadcast_async(at::Tensor t, int, std::string_view what) override {
    ops.push_back({"broadcast", std::string(what), t.numel()});
    return std::make_unique<FakeWork>(nullptr);
  }
  ddp::WorkPtr all_gather_async(at::Tensor out, at::Tensor in, std::string_view what) override {
    ops.push_back({"all_gather", std::string(what), in.numel()});
    return std::make_unique<FakeWork>([out, in, w = world_]() mutable {
      for (int r = 0; r < w; ++r) out.narrow(0, r * in.numel(), in.numel()).copy_(in.reshape(-1));
    });
  }
  // Every rank's input is this one's: block `rank` summed over `world` ranks.
  ddp::WorkPtr reduce_scatter_async(at::Tensor out, at::Tensor in, ddp::ReduceOp op,
                                    std::string_view what) override {
    ops.push_back({"reduce_scatter", std::string(what), in.numel()});
    return std::make_unique<FakeWork>([out, in, op, w = world_, r = rank_]() mutable {
      out.copy_(in.reshape(-1).narrow(0, r * out.numel(), out.numel()).view_as(out));
      if (op == ddp::ReduceOp::kSum) out.mul_(w);
    });
  }
  ddp::WorkPtr barrier_async(std::string_view what) override {
    ops.push_back({"barrier", std::string(what), 0});
    return std::make_unique<FakeWork>(nullptr);
  }

  std::vector<Op> ops;

 private:
  class FakeWork final : public ddp::Work {
   public:
    explicit FakeWork(std::function<void()> complete) : complete_(std::move(complete)) {}
    bool is_completed() override {
      if (!done_ && complete_) complete_();
      done_ = true;
      return true;
    }
    void wait() override { is_completed(); }

   private:
    std::function<void()> complete_;
    bool done_ = false;
  };

  int world_;
  int rank_;
};

}  // namespace trainer_test
