// TempDir: a fresh directory under $TMPDIR for one test, removed with its files at the end.
//
// Cleanup uses POSIX calls, not std::filesystem::remove_all: the libtorch.so of the LibTorch wheel
// exports its own copy of that function, which the dynamic linker binds to and which crashes.
// Only a flat directory (files, no subdirectories) is cleaned up.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

#include <dirent.h>
#include <unistd.h>

namespace test {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/trainer_test_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::runtime_error("mkdtemp failed: " + pattern);
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    if (DIR* d = ::opendir(path_.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") ::unlink((path_ + "/" + name).c_str());
      }
      ::closedir(d);
    }
    ::rmdir(path_.c_str());
  }

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace test
