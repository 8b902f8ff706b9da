# Runs as `cmake -P`: install the build tree, configure/build/run the consumer against it.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f bin/cachet include/cachet/types.h include/cachet/config.h lib/cmake/cachet/cachetConfig.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

# The installed command works on its own.
execute_process(COMMAND ${prefix}/bin/cachet check-conf "max_split_size_mb:128,expandable_segments:True"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "max_split_size_mb:128")
  message(FATAL_ERROR "the installed cachet check-conf failed (${rc}): ${out}${err}")
endif()

# With CUDA, the plug-in: the library in lib/, the cachet_torch package in lib/cachet/python, and
# the package finds the installed library from a directory that is neither the source nor the
# build tree, without importing torch.
if(PLUGIN)
  set(lib ${prefix}/${LIBDIR}/libcachet_torch.so)
  set(module ${prefix}/${LIBDIR}/cachet/python/cachet_torch/__init__.py)
  foreach(f ${lib} ${module})
    if(NOT EXISTS ${f})
      message(FATAL_ERROR "not installed: ${f}")
    endif()
  endforeach()
  if(PYTHON)
    execute_process(
      COMMAND ${CMAKE_COMMAND} -E env --unset=CACHET_TORCH_LIB PYTHONPATH=${prefix}/${LIBDIR}/cachet/python
        ${PYTHON} -c "import sys, cachet_torch, ctypes; p = cachet_torch.library_path(); lib = cachet_torch.load(); assert 'torch' not in sys.modules; print(p); print(cachet_torch.__file__)"
      WORKING_DIRECTORY ${WORK_DIR}
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "the installed cachet_torch did not load its library (${rc}):\n${out}\n${err}")
    endif()
    string(STRIP "${out}" out)
    if(NOT out STREQUAL "${lib}\n${module}")
      message(FATAL_ERROR "the installed cachet_torch found '${out}', expected '${lib}' and '${module}'")
    endif()
    message(STATUS "plug-in installed and found: ${out}")
  endif()
else()
  message(STATUS "no CUDA: the plug-in is not built, its install is not checked")
endif()

# The c10 backend, where it was built: next to the plug-in, and none of torch's libraries with it
# (libc10 and libc10_cuda come from the torch the process imported).
if(C10)
  set(c10lib ${prefix}/${LIBDIR}/libcachet_c10.so)
  if(NOT EXISTS ${c10lib})
    message(FATAL_ERROR "not installed: ${c10lib} (expected next to libcachet_torch.so)")
  endif()
  file(GLOB_RECURSE torch_libs ${prefix}/libc10*.so*)
  if(torch_libs)
    message(FATAL_ERROR "torch's libraries were installed with cachet: ${torch_libs}")
  endif()
  find_program(READELF readelf)
  if(READELF)
    execute_process(COMMAND ${READELF} -d ${c10lib} OUTPUT_VARIABLE dyn)
    string(REGEX MATCH "R(UN)?PATH[^\n]*" rpath "${dyn}")
    if(rpath MATCHES "torch")
      message(FATAL_ERROR "the installed libcachet_c10.so names a torch directory in its run path: ${rpath}")
    endif()
  endif()
  message(STATUS "c10 backend installed: ${c10lib}")
else()
  message(STATUS "the c10 backend is not built (no torch found): its install is not checked")
endif()

# The consumer finds cachet in the prefix, and cachet's dependencies where this build found them
# (this build's CMAKE_PREFIX_PATH, '|'-separated here, given through the environment; empty when
# they are system packages).
if(DEP_PREFIX_PATH)
  string(REPLACE "|" ":" deps "${DEP_PREFIX_PATH}")
  set(ENV{CMAKE_PREFIX_PATH} "${deps}")
endif()
run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix}
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${LINK_FLAGS}")
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
