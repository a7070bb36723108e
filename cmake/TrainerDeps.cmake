# Every external dependency, found once. All come from Debian packages or the LibTorch wheel, but
# barkeep's header (a PyPI sdist, pinned by hash, below).

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_C_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()

# LibTorch's CMake probes the local GPU for an arch list unless one is given; that probe fails
# with CMake 3.25 and nvcc 13 (and there is no GPU here). We compile no .cu files, so the arch
# list only silences the probe. Hopper (9.0) is what the GPU machines have.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
endif()
find_package(Torch REQUIRED)
message(STATUS "LibTorch ${Torch_VERSION} from ${Torch_DIR}")
# The Python interpreter of the environment LibTorch came from (the wheel's virtualenv:
# <venv>/lib/pythonX.Y/site-packages/torch/share/cmake/Torch): it runs the PyTorch reference
# models in the tests and the peers in the benchmarks.
find_program(TRAINER_PYTHON NAMES python3 python
  HINTS ${Torch_DIR}/../../../../../../../bin NO_DEFAULT_PATH)
if(NOT TRAINER_PYTHON)
  find_program(TRAINER_PYTHON NAMES python3 REQUIRED)
endif()
message(STATUS "Python for reference tests: ${TRAINER_PYTHON}")

find_package(MPI REQUIRED COMPONENTS C)
find_package(yaml-cpp REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(PNG REQUIRED)
find_package(ZLIB REQUIRED)
find_package(GTest REQUIRED)
find_package(benchmark QUIET)
# PCRE2 (Debian libpcre2-dev): GPT-2's pre-tokenizer pattern in data/gpt2_tokenizer.cpp. Found by
# file rather than pkg-config so the GPU machines' unpacked packages (CMAKE_PREFIX_PATH) serve too.
find_path(PCRE2_INCLUDE_DIR pcre2.h REQUIRED)
find_library(PCRE2_LIBRARY pcre2-8 REQUIRED)

# CUDA runtime and NCCL: compiled on every build where the toolkit exists (also without a GPU),
# so CI catches compile errors in those paths. The CUDA build of LibTorch brings the toolkit in.
set(TRAINER_HAVE_CUDA OFF)
if(TARGET CUDA::cudart)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  # Prefer the NCCL that LibTorch itself loads (the wheel's), so the process holds one copy.
  get_filename_component(_torch_lib_dir "${TORCH_LIBRARY}" DIRECTORY)
  find_library(NCCL_LIBRARY NAMES libnccl.so.2 nccl NAMES_PER_DIR
    HINTS ${_torch_lib_dir}/../../nvidia/nccl/lib ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(TRAINER_HAVE_CUDA ON)
  endif()
endif()
message(STATUS "CUDA/NCCL code paths: ${TRAINER_HAVE_CUDA} (nccl: ${NCCL_LIBRARY})")

# LibTorch's include directory carries its own fmt (12.x) headers, which would shadow the fmt 9
# that Debian's spdlog is built against (and break spdlog). Our translation units search a
# directory holding only a link to the system fmt first, so every one of them sees one fmt.
# (LibTorch's own headers that include fmt are CUDA-tunable and MPS ones we never include.)
get_target_property(_fmt_includes fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
find_path(TRAINER_FMT_INCLUDE fmt/core.h HINTS ${_fmt_includes} /usr/include NO_CMAKE_PATH NO_CMAKE_ENVIRONMENT_PATH)
set(TRAINER_FMT_SHIM ${CMAKE_BINARY_DIR}/fmt-shim)
file(MAKE_DIRECTORY ${TRAINER_FMT_SHIM})
file(CREATE_LINK ${TRAINER_FMT_INCLUDE}/fmt ${TRAINER_FMT_SHIM}/fmt SYMBOLIC)

# barkeep: the progress bar of log.progress (header-only, Apache-2.0, maintained; no C++ progress
# bar is packaged in Debian 12). The header comes from its PyPI sdist, pinned by hash; the copy
# scripts/device-deps.sh puts in .device/ serves machines without network. Only
# train/report/progress.cpp sees its directory (src/train/report/CMakeLists.txt), and formats
# with fmt (BARKEEP_ENABLE_FMT_FORMAT there: the system fmt 9, through the shim above, as
# everywhere else).
include(FetchContent)
set(TRAINER_BARKEEP_URL https://files.pythonhosted.org/packages/86/6e/7d04a6cef6174ba7aa0d4e99eabd11c82f55d7454bb08e270c6ca2699aa4/barkeep-0.1.6.tar.gz)
if(EXISTS ${PROJECT_SOURCE_DIR}/.device/barkeep-0.1.6.tar.gz)
  set(TRAINER_BARKEEP_URL ${PROJECT_SOURCE_DIR}/.device/barkeep-0.1.6.tar.gz)
endif()
FetchContent_Declare(barkeep
  URL ${TRAINER_BARKEEP_URL}
  URL_HASH SHA256=2d742d1608861a39040ebddf645fcc7c948f8429651e850b31942ac54b9f1eb7
  DOWNLOAD_EXTRACT_TIMESTAMP TRUE)
FetchContent_MakeAvailable(barkeep)  # the sdist has no CMakeLists.txt: this only unpacks it
set(TRAINER_BARKEEP_INCLUDE ${barkeep_SOURCE_DIR})  # holds barkeep/barkeep.h

# TensorBoard event files (log.tensorboard): Debian's protobuf compiles TensorBoard's Event and
# Summary messages (src/train/report/tensorboard_event.proto) and Boost.CRC frames the records.
# Optional: without them (the GPU machines build with few packages) the trainer still builds, and
# a run that sets log.tensorboard stops at start-up saying so.
find_package(Protobuf QUIET)
find_package(Boost QUIET)
set(TRAINER_HAVE_TENSORBOARD OFF)
if(Protobuf_FOUND AND Protobuf_PROTOC_EXECUTABLE AND TARGET protobuf::libprotobuf-lite AND TARGET Boost::headers)
  set(TRAINER_HAVE_TENSORBOARD ON)
endif()
message(STATUS "TensorBoard event files: ${TRAINER_HAVE_TENSORBOARD} (protobuf ${Protobuf_VERSION})")
