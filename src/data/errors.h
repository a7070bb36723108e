// DataError: input data a user gave that cannot be used (a missing, empty, truncated or malformed
// file, a window longer than the data). The message names the file and, where it applies, the
// line or byte offset. A std::invalid_argument, so the launcher treats it as a user mistake
// (exit code 2) at start-up and during training alike.
#pragma once

#include <stdexcept>

namespace data {

class DataError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace data
