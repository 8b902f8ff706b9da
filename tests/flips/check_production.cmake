cmake_minimum_required(VERSION 3.25)
# flips_not_in_production (tests/flips/CMakeLists.txt): the production libraries never consult the
# rule-flip selector (cachet/rule_flip.h: without CACHET_RULE_FLIPS, flipped() is a constant false
# and the compiler drops every flipped branch), while the flip builds do. NM, LIBS (production),
# FLIP_LIBS (flip builds).
foreach(lib IN LISTS LIBS FLIP_LIBS)
  execute_process(COMMAND ${NM} -C ${lib} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} ${lib} failed: ${err}")
  endif()
  string(REGEX MATCHALL "U cachet::active_rule_flip\\(\\)" refs "${out}")
  list(LENGTH refs n)
  if(lib IN_LIST LIBS AND n GREATER 0)
    message(FATAL_ERROR "${lib} calls cachet::active_rule_flip() from ${n} object(s): a production source "
            "was compiled with CACHET_RULE_FLIPS, or calls active_rule_flip() directly; only flipped() may be used")
  endif()
  if(lib IN_LIST FLIP_LIBS AND n EQUAL 0)
    message(FATAL_ERROR "${lib} never calls cachet::active_rule_flip(): the flip build applies no flip")
  endif()
  message(STATUS "${lib}: ${n} object(s) consult the rule flip")
endforeach()
