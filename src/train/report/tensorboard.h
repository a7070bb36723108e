// TensorBoardWriter: TensorBoard event files (log.tensorboard), so that `tensorboard --logdir DIR`
// shows a run's curves, live: each write reaches the file before the next step.
//
// One file per run: DIR/events.out.tfevents.<unix time>.<hostname> (".<pid>" added if that name
// is taken). A resumed run opens a new file beside the old ones; TensorBoard reads them all, and
// the steps continue from the checkpoint's. A file is a sequence of TFRecords (the length, its
// masked CRC-32C, an Event in protobuf, its masked CRC-32C); the first Event carries the file
// version, the second a SessionLog START at the run's first step, each later one the scalars of
// one step. The START tells TensorBoard to drop what older files hold at and past that step (a
// resumed run trains those steps again), as the metrics file drops their records. The messages
// are compiled by Debian's protobuf from tensorboard_event.proto (upstream's names and numbers).
//
// Only rank 0 writes (RunReport owns the writer). Not thread-safe. This library is built apart
// from LibTorch (src/train/report/CMakeLists.txt); in a build without protobuf
// (TRAINER_HAVE_TENSORBOARD unset) check_tensorboard_dir() says so at start-up and the
// constructor throws the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace train {

using Scalars = std::vector<std::pair<std::string, double>>;  // (tag, value)

class TensorBoardWriter {
 public:
  // Creates `dir` if missing and starts a new event file in it, for a run whose first step is
  // `first_step` (1, or a resumed run's). Throws std::invalid_argument naming log.tensorboard
  // when it cannot.
  TensorBoardWriter(const std::string& dir, int64_t first_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event at `step` with every scalar of `scalars`, flushed. A failed write (a full disk)
  // is logged once as a warning and ends the file's records; training goes on.
  void write(int64_t step, const Scalars& scalars);

  const std::string& path() const;

 private:
  struct File;
  std::unique_ptr<File> file_;
};

// Whether this build can write event files (it found protobuf).
bool tensorboard_available();

// Start-up check (rank 0): this build writes event files and `dir` can be created and written
// in. Throws std::invalid_argument naming log.tensorboard, so the job stops before step 1 with
// exit code 2.
void check_tensorboard_dir(const std::string& dir);

// TFRecord's checksum: CRC-32C (Castagnoli) of `n` bytes, rotated and offset ("masked") so that
// a CRC of data holding CRCs stays well distributed. Defined only where tensorboard_available().
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace train
