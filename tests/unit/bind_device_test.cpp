// Device binding (launcher/device.h): train.device against the GPUs a node has and its local ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "launcher/device.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;
using ::testing::Not;

using launcher::bind_device;
using launcher::DeviceBinding;
using launcher::DeviceError;

std::string device_error(const std::string& requested, int local_rank, int local_size, int visible,
                         const std::optional<std::string>& cuda_visible) {
  try {
    bind_device(requested, local_rank, local_size, visible, cuda_visible);
  } catch (const DeviceError& e) {
    return e.what();
  }
  ADD_FAILURE() << "bind_device accepted " << requested << " with " << local_size
                << " local ranks and " << visible << " GPU(s)";
  return "";
}

TEST(BindDevice, CpuIsCpuEvenWithGpus) {
  const DeviceBinding b = bind_device("cpu", 1, 2, 4, "0,1,2,3");
  EXPECT_EQ(b.device, c10::Device(c10::kCPU));
  EXPECT_EQ(b.description, "cpu");
}

TEST(BindDevice, AutoWithoutGpusIsCpu) {
  const DeviceBinding b = bind_device("auto", 0, 1, 0, std::nullopt);
  EXPECT_EQ(b.device, c10::Device(c10::kCPU));
  EXPECT_EQ(b.description, "cpu");
}

TEST(BindDevice, CudaWithoutGpusIsAnError) {
  const std::string unset = device_error("cuda", 0, 1, 0, std::nullopt);
  EXPECT_THAT(unset, HasSubstr("train.device is 'cuda' but this process sees no CUDA device"));
  EXPECT_THAT(unset, HasSubstr("CUDA_VISIBLE_DEVICES unset"));
  const std::string hidden = device_error("cuda", 0, 1, 0, "-1");
  EXPECT_THAT(hidden, HasSubstr("CUDA_VISIBLE_DEVICES=-1"));
}

// Set but empty is not unset: the CUDA runtime then sees no GPU at all.
TEST(BindDevice, EmptyCudaVisibleDevicesIsNoGpuNotUnset) {
  const std::string empty = device_error("cuda", 0, 1, 0, "");
  EXPECT_THAT(empty, HasSubstr("CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible"));
  EXPECT_THAT(empty, Not(HasSubstr("unset")));
}

TEST(BindDevice, MoreLocalRanksThanGpusIsAnError) {
  const std::string message = device_error("cuda", 3, 4, 2, "0,1");
  EXPECT_THAT(message,
              HasSubstr("4 ranks were started on this node but only 2 GPU(s) are visible"));
  EXPECT_THAT(message, HasSubstr("CUDA_VISIBLE_DEVICES=0,1"));
  EXPECT_THAT(message, HasSubstr("Start at most 2 rank(s) per node"));
}

TEST(BindDevice, OneGpuPerLocalRank) {
  const DeviceBinding first = bind_device("cuda", 0, 2, 2, std::nullopt);
  EXPECT_EQ(first.device, c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(first.description, "cuda:0 (of 2 visible, CUDA_VISIBLE_DEVICES unset)");
  const DeviceBinding second = bind_device("cuda", 1, 2, 2, std::nullopt);
  EXPECT_EQ(second.device, c10::Device(c10::kCUDA, 1));
  EXPECT_EQ(second.description, "cuda:1 (of 2 visible, CUDA_VISIBLE_DEVICES unset)");
}

TEST(BindDevice, AutoWithEnoughGpusIsCuda) {
  const DeviceBinding b = bind_device("auto", 1, 2, 4, "2,3,4,5");
  EXPECT_EQ(b.device, c10::Device(c10::kCUDA, 1));
  EXPECT_EQ(b.description, "cuda:1 (of 4 visible, CUDA_VISIBLE_DEVICES=2,3,4,5)");
}

}  // namespace TRAINER_UNITY_ID
