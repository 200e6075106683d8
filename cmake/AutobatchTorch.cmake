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
