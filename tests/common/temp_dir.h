// TempDir: a fresh directory under $TMPDIR for one test, removed with its files at the end.
//
// Cleanup uses POSIX calls, not std::filesystem::remove_all: the libtorch.so of the LibTorch wheel
// exports its own copy of that function, which the dynamic linker binds to and which crashes.
// Files and one level of subdirectories (a sharded checkpoint's step directories) are cleaned up.
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
  ~TempDir() { remove_flat(path_, /*depth=*/1); }

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  // Removes `dir`'s files, its subdirectories (a sharded checkpoint's step directory) to `depth`
  // levels, and `dir`.
  static void remove_flat(const std::string& dir, int depth) {
    if (DIR* d = ::opendir(dir.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name == "." || name == "..") continue;
        const std::string path = dir + "/" + name;
        if (::unlink(path.c_str()) != 0 && depth > 0) remove_flat(path, depth - 1);
      }
      ::closedir(d);
    }
    ::rmdir(dir.c_str());
  }

  std::string path_;
};

}  // namespace test
