# autobatch_unity(target batch_size): compile the target's files as few units (CMake's UNITY_BUILD;
# batch_size files per unit, 0: all in one). LibTorch's headers cost 20 to 35 s of parsing per
# unit on a 2-core machine, more than most of our files' own code (issue 41: the 16 LibTorch test
# files took about 16 min of CPU as 16 units, about 1 min as one). Each file keeps its helpers in
# its own anonymous namespace, which one unit shares: two files of a target that define the same
# name there fail to compile, and a helper they both need belongs in an internal header.
# AUTOBATCH_UNITY_BUILD=OFF compiles file by file (faster rebuilds of one file while developing).
option(AUTOBATCH_UNITY_BUILD "Compile each target's files as few units (faster full builds)" ON)

function(autobatch_unity target batch_size)
  if(NOT AUTOBATCH_UNITY_BUILD)
    return()
  endif()
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${batch_size})
  # GCC takes an included .cpp file for a header and warns where a class outside the anonymous
  # namespace holds a type from it (-Wsubobject-linkage); in one .cpp file that is fine.
  target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-Wno-subobject-linkage>)
endfunction()
