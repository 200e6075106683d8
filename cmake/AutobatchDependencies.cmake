# Dependency checks that say what to install before anything is built (issue 29: a user running
# pip install . gets the package to install, not a CMake backtrace).

# find_package(NAME [VERSION]) or stop, naming the Debian package that provides NAME.
macro(autobatch_require name debian)
  find_package(${name} ${ARGN} QUIET)
  if(NOT ${name}_FOUND)
    message(FATAL_ERROR "autobatch needs ${name} (C++ headers and CMake config) and did not find "
      "it. On Debian/Ubuntu: sudo apt-get install ${debian} (scripts/bootstrap.sh installs every "
      "package the build needs: cmake ninja-build g++ libspdlog-dev libfmt-dev libcxxopts-dev "
      "nlohmann-json3-dev zlib1g-dev); elsewhere, install ${name} and put its prefix on "
      "CMAKE_PREFIX_PATH.")
  endif()
endmacro()

# nlohmann-json (header-only): its CMake config where installed (Debian's nlohmann-json3-dev), else
# the headers of the PyPI package nlohmann_json in the Python that builds (pyproject.toml's build
# requirements; that package ships no CMake config, so the target is made here from the folder its
# get_include() reports). Defines the target nlohmann_json::nlohmann_json.
macro(autobatch_require_json)
  find_package(nlohmann_json 3 QUIET)
  if(NOT nlohmann_json_FOUND AND Python_EXECUTABLE)
    execute_process(COMMAND "${Python_EXECUTABLE}" -c
      "import nlohmann_json; print(nlohmann_json.get_include())"
      OUTPUT_VARIABLE _autobatch_json_include OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _autobatch_json_rc ERROR_QUIET)
    if(_autobatch_json_rc EQUAL 0 AND EXISTS "${_autobatch_json_include}/nlohmann/json.hpp")
      add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
      set_target_properties(nlohmann_json::nlohmann_json PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${_autobatch_json_include}")
      set(nlohmann_json_FOUND TRUE)
      message(STATUS "autobatch: nlohmann-json from the Python package nlohmann_json "
        "(${_autobatch_json_include})")
    endif()
  endif()
  if(NOT nlohmann_json_FOUND)
    message(FATAL_ERROR "autobatch needs nlohmann-json (C++ headers) and did not find it. pip "
      "install . brings it from PyPI (the build requirement nlohmann_json); with "
      "--no-build-isolation install it into the building Python first (python -m pip install "
      "nlohmann_json); for the command's CMake build: sudo apt-get install nlohmann-json3-dev "
      "(scripts/bootstrap.sh installs every package that build needs), or put its prefix on "
      "CMAKE_PREFIX_PATH.")
  endif()
endmacro()

# LibTorch from the torch of `python` (torch.utils.cmake_prefix_path), unless Torch_DIR is set.
function(autobatch_torch_from_python python)
  if(DEFINED Torch_DIR OR DEFINED ENV{Torch_DIR})
    return()
  endif()
  execute_process(COMMAND "${python}" -c
    "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.__version__)"
    OUTPUT_VARIABLE _out OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "autobatch builds against the torch of the environment that installs "
      "it, and the Python running this build (${python}) cannot import torch. If you ran pip "
      "install without --no-build-isolation, pip built in an isolated environment of its own, "
      "which has no torch: run pip install --no-build-isolation . instead. Otherwise install torch "
      "into this environment first (pip install torch).\n${_err}")
  endif()
  string(REPLACE "\n" ";" _lines "${_out}")
  list(GET _lines 0 _prefix)
  list(GET _lines 1 _version)
  message(STATUS "autobatch: building against torch ${_version} (${_prefix})")
  list(APPEND CMAKE_PREFIX_PATH "${_prefix}")
  set(CMAKE_PREFIX_PATH "${CMAKE_PREFIX_PATH}" PARENT_SCOPE)
endfunction()

# A CUDA build of LibTorch (libtorch_cuda.so beside libtorch_cpu.so) has a CMake config
# (Caffe2Config.cmake) that runs find_package(CUDAToolkit) and stops without one: say what to do.
function(autobatch_check_cuda_toolkit)
  find_path(_autobatch_torch_lib libtorch_cpu.so PATH_SUFFIXES lib ../../lib
    NO_CACHE NO_DEFAULT_PATH PATHS ${CMAKE_PREFIX_PATH} "${Torch_DIR}/../../.." "$ENV{Torch_DIR}/../../..")
  if(NOT _autobatch_torch_lib OR NOT EXISTS "${_autobatch_torch_lib}/libtorch_cuda.so")
    return()
  endif()
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    message(FATAL_ERROR "The torch found in ${_autobatch_torch_lib} is a CUDA build "
      "(libtorch_cuda.so), and its CMake config (Caffe2Config.cmake) needs the CUDA toolkit "
      "(nvcc, headers and libraries of the CUDA version torch was built for: python -c 'import "
      "torch; print(torch.version.cuda)'), which was not found. Install that toolkit and put "
      "nvcc on PATH (or set CUDAToolkit_ROOT to it); or build against a CPU-only torch (pip install "
      "torch --index-url https://download.pytorch.org/whl/cpu), which needs none.")
  endif()
endfunction()
