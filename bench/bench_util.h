// What every benchmark here shares: command-line parsing that ends the process for --help and
// throws for a bad argument, and the median the tables report.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace bench {

// Parses into `app`'s options; prints help and exits for --help, throws std::invalid_argument
// (the caller prints it) for a bad argument.
inline void parse_or_exit(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) std::exit(app.exit(e));
    throw std::invalid_argument(e.what());
  }
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace bench
