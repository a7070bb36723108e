// error_of<Error>(fn): the message of the Error that fn throws, or "(no error)" when it throws
// none, for tests that check what a message names (EXPECT_THAT(error_of<...>(fn), HasSubstr(...))).
// Another exception passes through and fails the test.
#pragma once

#include <functional>
#include <string>

namespace test {

template <class Error>
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace test
