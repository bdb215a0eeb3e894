# Third-party dependencies: libtorch from the project-local Python environment (PyPI torch wheel),
# everything else from Debian packages.

# STRATA_PYTHON is the interpreter whose torch we build against (scripts/bootstrap.sh makes .venv).
set(STRATA_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH "Python with torch installed")
if(NOT STRATA_FUZZ)  # the fuzz build's modules use neither libtorch nor CUDA
  if(NOT EXISTS "${STRATA_PYTHON}")
    message(FATAL_ERROR "STRATA_PYTHON=${STRATA_PYTHON} does not exist; run scripts/bootstrap.sh first")
  endif()
  execute_process(
    COMMAND "${STRATA_PYTHON}" -c "import torch; print(torch.utils.cmake_prefix_path, end='')"
    OUTPUT_VARIABLE STRATA_TORCH_PREFIX RESULT_VARIABLE torch_rc)
  if(NOT torch_rc EQUAL 0)
    message(FATAL_ERROR "could not import torch with ${STRATA_PYTHON}")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${STRATA_TORCH_PREFIX}")

  find_package(CUDAToolkit REQUIRED)
  # Without this, Caffe2's CMake tries to detect the GPUs of the build machine (there may be none).
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0" CACHE STRING "CUDA archs torch's CMake helpers target")
  find_package(Torch REQUIRED)
  # The OpenMP runtime the wheel's libtorch_cpu runs its intra-op threads on, linked by path so
  # that one runtime serves both: a thread of ours sets its own OpenMP thread count with it
  # (at::set_num_threads would also change the count every later thread starts with).
  find_library(STRATA_TORCH_GOMP NAMES libgomp.so.1 PATHS "${TORCH_INSTALL_PREFIX}/lib"
               NO_DEFAULT_PATH)
  if(NOT STRATA_TORCH_GOMP)
    message(FATAL_ERROR "no libgomp.so.1 beside libtorch in ${TORCH_INSTALL_PREFIX}/lib")
  endif()
endif()

find_package(Threads REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(spdlog REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(GTest REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG QUIET)
find_package(PkgConfig REQUIRED)
if(NOT gRPC_FOUND)
  pkg_check_modules(GRPCPP REQUIRED IMPORTED_TARGET grpc++)
  add_library(gRPC::grpc++ ALIAS PkgConfig::GRPCPP)
endif()
find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# Unicode normalization of HF tokenizers' normalizers.
pkg_check_modules(ICU REQUIRED IMPORTED_TARGET icu-uc)
# Debian's cpp-httplib is a header plus a shared library built with OpenSSL, zlib and Brotli
# support; its pkg-config file carries the defines that ABI needs.
pkg_check_modules(CPP_HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# xz-compressed data sets (strata bench).
pkg_check_modules(LZMA REQUIRED IMPORTED_TARGET liblzma)
# The KV store's lossless codec (zstd) at the storage boundary.
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
# The remote KV tier's Redis client.
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
