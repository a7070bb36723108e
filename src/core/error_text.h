// Error texts in log lines and agreed messages: an exception's first line (LibTorch appends a
// backtrace to its what() after the first line).
#pragma once

#include <string>

namespace core {

inline std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace core
