# Use ccache for our compiles when it is installed (LibTorch-heavy files take 20-30 s each).
find_program(AUTOBATCH_CCACHE ccache)
if(AUTOBATCH_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER "${AUTOBATCH_CCACHE}")
endif()
