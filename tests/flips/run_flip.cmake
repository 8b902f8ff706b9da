cmake_minimum_required(VERSION 3.25)
# One rule flip against the recordings that must kill it (tests/flips/CMakeLists.txt). Run as
#   cmake -DBIN=<cachet-flips> -DFLIP=<name> "-DRECS=<res_a.json.gz>;<res_b.json.gz>" -P run_flip.cmake
# For each recording, `cachet-flips conform <rec> --engine model` and `--engine impl` run with
# CACHET_RULE_FLIP=<name>. The flip is killed by a recording when both engines report mismatches
# (exit 1); their first mismatches are printed (they need not read alike: the model checks every
# device call against the recording's trace as it goes, gpu/'s host backend only hands out the
# recorded addresses, so gpu/ often shows a divergence later, as a stat or a trace row). Passes
# only when every listed recording kills the flip in both engines; anything else fails, saying why.
foreach(var BIN FLIP RECS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_flip.cmake: -D${var}=... is required")
  endif()
endforeach()
set(failures "")
foreach(rec IN LISTS RECS)
  get_filename_component(rec_name ${rec} NAME)
  set(first_model "")
  set(first_impl "")
  foreach(engine model impl)
    execute_process(
      COMMAND ${CMAKE_COMMAND} -E env CACHET_RULE_FLIP=${FLIP} ${BIN} conform ${rec} --engine ${engine} --max-report 1
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(rc EQUAL 0)
      string(APPEND failures "  ${rec_name}: the ${engine} engine replays it exactly under the flip: not killed\n")
      continue()
    elseif(NOT rc EQUAL 1)
      string(APPEND failures "  ${rec_name}: ${engine} engine: exit ${rc}, not a mismatch: ${err}${out}\n")
      continue()
    endif()
    string(REGEX MATCH "\\[${engine}\\] [^\n]*" line "${out}")
    string(REGEX REPLACE "^\\[${engine}\\] " "" line "${line}")
    string(REGEX MATCH "conform: [0-9]+ ops, [0-9]+ mismatches" summary "${out}")
    set(first_${engine} "${line}")
    set(summary_${engine} "${summary}")
  endforeach()
  if(first_model STREQUAL "" OR first_impl STREQUAL "")
    continue()
  endif()
  message(STATUS "flip ${FLIP} killed by ${rec_name}:\n   model (${summary_model}): ${first_model}\n"
                 "   impl  (${summary_impl}): ${first_impl}")
endforeach()
if(NOT failures STREQUAL "")
  message(FATAL_ERROR "flip ${FLIP} (CACHET_RULE_FLIP=${FLIP}, cachet/rule_flip.h):\n${failures}"
          "Each recording listed for a flip in tests/flips/CMakeLists.txt and docs/verification.md must kill it.")
endif()
