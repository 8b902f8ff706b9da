# cachet_add_test(NAME name SOURCES ... LIBS ... LABELS ... [ARGS ...] [TIMEOUT s])
# One gtest binary registered as one ctest entry (gtest's own filters stay available).
# GPU tests exit 77 when no device or driver is found; ctest reports them skipped.
function(cachet_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main cachet_warnings)
  target_compile_definitions(${T_NAME} PRIVATE
    CACHET_SOURCE_DIR="${PROJECT_SOURCE_DIR}" CACHET_TEST_DATA="${PROJECT_SOURCE_DIR}/tests/data")
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    SKIP_RETURN_CODE 77)
endfunction()
