#include "train/report/tensorboard.h"

#include "io/output_dir.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>

#ifdef TRAINER_HAVE_TENSORBOARD
#include <boost/crc.hpp>

#include "train/report/tensorboard_event.pb.h"
#endif

namespace train {
namespace {

[[noreturn]] void throw_unavailable(const std::string& dir) {
  throw std::invalid_argument(fmt::format(
      "log.tensorboard = '{}': this trainer was built without TensorBoard support (protobuf and "
      "Boost were not found when it was built). Install libprotobuf-dev, protobuf-compiler and "
      "libboost-dev and rebuild, or leave log.tensorboard unset.",
      dir));
}

#ifdef TRAINER_HAVE_TENSORBOARD
double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// TFRecords are little-endian whatever the host.
void put_le(char* at, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) at[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}
#endif

}  // namespace

#ifdef TRAINER_HAVE_TENSORBOARD

uint32_t masked_crc32c(const void* data, size_t n) {
  // CRC-32C: the Castagnoli polynomial, reflected, initial and final XOR all ones.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, n);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

struct TensorBoardWriter::File {
  std::string path;
  std::ofstream out;
  bool failed = false;

  // One TFRecord: length, masked CRC of the length, the Event, masked CRC of the Event.
  void write(const tensorboard::Event& event) {
    if (failed) return;
    const std::string data = event.SerializeAsString();
    char header[12];
    put_le(header, data.size(), 8);
    put_le(header + 8, masked_crc32c(header, 8), 4);
    char footer[4];
    put_le(footer, masked_crc32c(data.data(), data.size()), 4);
    out.write(header, sizeof(header));
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.write(footer, sizeof(footer));
    out.flush();  // a live TensorBoard sees each step as it is logged
    if (!out) {
      failed = true;
      spdlog::warn("log.tensorboard: cannot write {}: {}; no more TensorBoard records this run",
                   path, std::strerror(errno));
    }
  }
};

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step)
    : file_(std::make_unique<File>()) {
  io::create_output_dir("log.tensorboard", dir);
  const double now = unix_seconds();
  const std::string name =
      fmt::format("{}/events.out.tfevents.{}.{}", dir, static_cast<int64_t>(now), hostname());
  // Two runs started in the same second (a quick resume) must not share a file.
  std::error_code ec;
  file_->path = std::filesystem::exists(name, ec) ? fmt::format("{}.{}", name, getpid()) : name;
  file_->out.open(file_->path, std::ios::out | std::ios::binary | std::ios::trunc);
  if (!file_->out) {
    throw std::invalid_argument(fmt::format("log.tensorboard = '{}': cannot write {}: {}", dir,
                                            file_->path, std::strerror(errno)));
  }
  tensorboard::Event version;
  version.set_wall_time(now);
  version.set_file_version("brain.Event:2");
  file_->write(version);
  tensorboard::Event start;
  start.set_wall_time(now);
  start.set_step(first_step);
  start.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  file_->write(start);
}

void TensorBoardWriter::write(int64_t step, const Scalars& scalars) {
  tensorboard::Event event;
  event.set_wall_time(unix_seconds());
  event.set_step(step);
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    tensorboard::Summary::Value* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));  // TensorBoard's scalars are float32
  }
  file_->write(event);
}

const std::string& TensorBoardWriter::path() const { return file_->path; }

bool tensorboard_available() { return true; }

#else  // built without protobuf

struct TensorBoardWriter::File {
  std::string path;
};

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t) { throw_unavailable(dir); }
void TensorBoardWriter::write(int64_t, const Scalars&) {}
const std::string& TensorBoardWriter::path() const { return file_->path; }
bool tensorboard_available() { return false; }

#endif

TensorBoardWriter::~TensorBoardWriter() = default;

void check_tensorboard_dir(const std::string& dir) {
  if (!tensorboard_available()) throw_unavailable(dir);
  io::check_output_dir("log.tensorboard", dir);  // the event file itself is the run's, opened later
}

}  // namespace train
