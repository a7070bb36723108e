// Shared helpers of the config tests: a minimal valid file and the ConfigError of a bad one.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <typeinfo>
#include <vector>

#include "config/config.h"

namespace config_test {

using config::Config;
using config::ConfigError;
using config::parse_config;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The smallest valid file: lines 1-4. Tests append lines from 5 on.
inline const std::string kMinimal = "model:\n"                    // 1
                                    "  name: mlp\n"               // 2
                                    "train:\n"                    // 3
                                    "  global_batch_size: 64\n";  // 4

// The message of the ConfigError parse_config throws for `yaml`; "" and a failure when it throws
// none (or throws something else).
inline std::string config_error(const std::string& yaml,
                                const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "bad.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw " << typeid(e).name() << " instead of a ConfigError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "parse_config accepted:\n" << yaml;
  return "";
}

// `message` reports exactly one problem, found at `location`, and contains every fragment.
inline void expect_one_problem(const std::string& message, const std::string& location,
                               const std::vector<std::string>& fragments) {
  EXPECT_THAT(message, StartsWith(location + ": "));
  EXPECT_THAT(message, Not(HasSubstr("problems in the configuration")));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const auto& f : fragments) EXPECT_THAT(message, HasSubstr(f));
}

}  // namespace config_test
