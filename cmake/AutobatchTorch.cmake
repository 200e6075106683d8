# Finds LibTorch (the PyPI torch wheel's, or a LibTorch of the user's through Torch_DIR).
# Used by our build and by the installed package config, so a launcher gets the same defaults.
#
# A CUDA-built LibTorch's config runs a GPU-detection try_run when TORCH_CUDA_ARCH_LIST is unset,
# and that fails on a machine without a GPU. Default it to the data-centre generations (Ampere,
# Hopper); autobatch compiles no CUDA kernels of its own, so the value only silences detection.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0" CACHE STRING "CUDA architectures for LibTorch's config")
endif()
# Note: no global CMAKE_CXX_STANDARD may be set before this point: the CUDA try_run of LibTorch's
# config would then ask for a "CUDA20" dialect and fail. Targets ask for C++20 themselves.
if(AUTOBATCH_TORCH_AS_DEPENDENCY)
  find_dependency(Torch)  # from autobatchConfig.cmake: a missing LibTorch fails find_package(autobatch)
else()
  find_package(Torch REQUIRED)
endif()

# The command and the C++ library use LibTorch internals with no stable API (torch/csrc/jit, the
# AOTInductor runner, c10d's TCPStore, CUDAAllocatorConfig): the versions CI builds and tests are
# the range below (the pin in requirements.txt and the newest in requirements-newest.txt). Another
# version is refused before anything compiles, rather than failing deep in a compile or, worse,
# building code whose internals changed meaning; AUTOBATCH_ALLOW_ANY_TORCH=ON tries it anyway.
set(AUTOBATCH_TORCH_TESTED_MIN 2.11)
set(AUTOBATCH_TORCH_TESTED_BELOW 2.16)
option(AUTOBATCH_ALLOW_ANY_TORCH "Build against a LibTorch outside the versions CI tests" OFF)
if(DEFINED Torch_VERSION AND NOT AUTOBATCH_ALLOW_ANY_TORCH AND
   (Torch_VERSION VERSION_LESS AUTOBATCH_TORCH_TESTED_MIN OR
    NOT Torch_VERSION VERSION_LESS AUTOBATCH_TORCH_TESTED_BELOW))
  message(FATAL_ERROR "autobatch's C++ build needs LibTorch ${AUTOBATCH_TORCH_TESTED_MIN} to "
    "below ${AUTOBATCH_TORCH_TESTED_BELOW} (the versions CI builds; the command uses LibTorch "
    "internals that change between releases), and found ${Torch_VERSION} "
    "(${Torch_DIR}). Use torch 2.11 (pip install torch==2.11.0, requirements.txt) or up to 2.15, "
    "or configure with -DAUTOBATCH_ALLOW_ANY_TORCH=ON to try this one. The Python package alone "
    "(pip install .) needs no LibTorch build and supports more versions (docs/python.md).")
endif()
