# Mutants (label mutants): props_mutants is the property binary linked with cachet_gpu_mutants
# (gpu/src/mutant.h); the ctests props_mutant_<n>_<check> run it under CACHET_MUTANT=<n>. Each runs it with a fixed seed and ONE check
# (CACHET_PROPS_CHECKS), the lockstep comparison off, and passes only when that check failed
# ("property failed: <check>" in the output): the table below is which check kills which mutant.
# An entry "<n>:sut-invariants:<ID>" also requires that gpu's invariants() reported [<ID>] (an ID
# of docs/invariants.md) in that failure.
# An entry "<n>:lockstep:trace" requires that the lockstep failure was the trace-event order
# ("trace events differ": cachet/lockstep.h compares each op's trace events in order).
# Mutants 17-23 (policy:cachet) run `props_mutants --policy cachet`: the same properties
# against model::CachetPolicy. Mutants 25-26 are policy:pytorch's private pools: killed in the
# machine's cases that generate pool and capture ops (props/README.md). Mutants 29-30 are
# sleep's (an allocation placed in a sleeping range; a backup not restored): killed in the
# cases under cachet_sleep:True, which draw tag, sleep and wake ops.
# props_mutant_<n>_regressions (CACHET_PROPS_MUTANT_REGRESSIONS "<n>:<file>") replays a case of
# props/regressions with the mutant: it must fail the lockstep check (the case catches the bug),
# with the given first line of the report.
if(NOT CACHET_MUTANTS)
  return()
endif()
set(CACHET_PROPS_MUTANT_KILLS
  "1:coalescing" "1:lockstep"
  "2:split-limit" "2:lockstep"
  "3:rounding" "3:lockstep"
  "4:stats-recount" "4:lockstep"
  "5:stream" "5:lockstep"
  "6:pending-event" "6:lockstep"
  "7:split-limit" "7:lockstep"
  "1:sut-invariants:INV-MERGE-1"
  "8:no-overlap" "8:tiling" "8:sut-invariants:INV-SEG-1"
  "9:memory-cap" "9:lockstep"
  "10:sut-invariants:INV-CAP-1" "10:lockstep"
  "11:sut-invariants:INV-SEG-2"
  "12:sut-invariants:INV-EVENT-2" "12:replay" "12:lockstep"
  "13:sut-invariants:INV-SIZE-2" "13:lockstep"
  "14:sut-invariants:INV-STATS-1"
  "15:sut-invariants:INV-POOL-1" "15:lockstep"
  "16:sut-invariants:INV-SEG-3"
  "24:lockstep:trace"
  "17:lockstep" "18:lockstep" "19:lockstep:trace" "20:lockstep" "20:stats-recount" "20:memory-cap"
  "21:lockstep" "21:memory-cap" "22:lockstep" "22:pending-event" "23:lockstep"
  "25:lockstep" "26:lockstep"
  "29:sleeping-range" "29:lockstep" "30:lockstep")
set(CACHET_PROPS_MUTANT_REGRESSIONS "24:gc_largest_first.ops:trace events differ"
  "23:cachet_retry_skips_best_fit.ops:device calls differ"
  "25:private_block_to_default.ops:result differs" "26:release_frees_live_block.ops:trace events differ")
cachet_props_binary(props_mutants ${CACHET_GPU_MUTANTS_TARGET})
foreach(pair IN LISTS CACHET_PROPS_MUTANT_KILLS)
  string(REPLACE ":" ";" pl "${pair}")
  list(GET pl 0 n)
  list(GET pl 1 check)
  set(inv "")
  set(name ${check})
  set(expect "property failed: ${check}\n")
  list(LENGTH pl len)
  if(len GREATER 2)
    list(GET pl 2 inv)
    set(name ${check}_${inv})
    if(inv STREQUAL "trace")
      set(expect "property failed: lockstep\ntrace events differ")
    else()
      # ... and [<ID>] among the violations listed right after it.
      set(expect "property failed: ${check}\nsut invariants\\(\\) violated\n(  [^\n]*\n)*  \\[${inv}\\]")
    endif()
  endif()
  # Mutants 17-23 are policy:cachet's (gpu/src/mutant.h): its properties run them.
  set(policy_args "")
  if(n GREATER_EQUAL 17 AND n LESS_EQUAL 23)
    set(policy_args --policy cachet)
  endif()
  cachet_mutant_test(props_mutant_${n}_${name} ${n} COMMAND props_mutants ${policy_args}
    ENVIRONMENT "RC_PARAMS=seed=20250501 max_success=1000 max_size=300" CACHET_PROPS_CHECKS=${check} CACHET_PROPS_SKIP=coverage
    PROPERTIES TIMEOUT 600 PASS_REGULAR_EXPRESSION "${expect}")
endforeach()
foreach(pair IN LISTS CACHET_PROPS_MUTANT_REGRESSIONS)
  string(REPLACE ":" ";" pl "${pair}")
  list(GET pl 0 n)
  list(GET pl 1 file)
  list(GET pl 2 first_line)
  cachet_mutant_test(props_mutant_${n}_regressions ${n}
    COMMAND props_mutants --replay ${PROJECT_SOURCE_DIR}/props/regressions/${file}
    ENVIRONMENT CACHET_PROPS_CHECKS=lockstep
    PROPERTIES TIMEOUT 600 PASS_REGULAR_EXPRESSION "property failed: lockstep\n${first_line}")
endforeach()
