// main() for tests run under mpirun: MPI for the whole process, full output from rank 0, and
// from other ranks only their failures (prefixed with the rank).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/mpi_test_env.h"

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      fmt::print(stderr, "[rank {}] {}:{}: failure\n{}\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ddp::MpiRuntime runtime(&argc, &argv);
  trainer_test::set_runtime(&runtime);
  const int rank = runtime.topology().rank;
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  trainer_test::set_runtime(nullptr);
  return rc;
}
