# Compiler, language standard, CUDA architectures, warnings and ccache.
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
# CMake 3.25 does not know nvcc's C++20 flag; kernels are plain C++17 anyway.
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)

if(NOT CMAKE_BUILD_TYPE)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type" FORCE)
endif()

# A100 (sm_80) and H100/H200 (sm_90). Override with -DCMAKE_CUDA_ARCHITECTURES=... for a quicker
# single-architecture build on a known device.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "52")
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
endif()

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()

# Warnings for our own targets (not for third-party headers, which come in as SYSTEM).
add_library(strata_warnings INTERFACE)
target_compile_options(strata_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)

# Warnings for our CUDA sources (linked PRIVATE by strata_kernels; docs/kernels/static-checks.md):
# the C++ warning set for the host side of .cu files, and ptxas warnings for register spills,
# local memory and double-precision instructions. With STRATA_CUDA_WERROR (default ON) nvcc's
# front end, the host compiler and ptxas all treat warnings as errors (--Werror=all-warnings also
# passes -Werror to the host compiler and --warning-as-error to ptxas; the -Xptxas one says so).
option(STRATA_CUDA_WERROR "Kernel warnings (nvcc, host compiler, ptxas) are errors" ON)
set(strata_cuda_warning_flags
  -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter
  -Xptxas=-warn-spills,-warn-lmem-usage,-warn-double-usage)
if(STRATA_CUDA_WERROR)
  list(APPEND strata_cuda_warning_flags --Werror=all-warnings -Xptxas=--warning-as-error)
endif()
add_library(strata_cuda_warnings INTERFACE)
target_compile_options(strata_cuda_warnings INTERFACE
  "$<$<COMPILE_LANGUAGE:CUDA>:${strata_cuda_warning_flags}>")
