# ctest script (cmake -P): fails if anything under gpu/ includes a model/ header
# (docs/layers.md: gpu/ never includes or links model/, so no bug is shared between the
# specification and the implementation).
#   -DGPU_DIR=<source>/gpu  -DGPU_LINKS="<cachet_gpu LINK_LIBRARIES at configure time>"
file(GLOB_RECURSE files "${GPU_DIR}/*.h" "${GPU_DIR}/*.hpp" "${GPU_DIR}/*.cpp" "${GPU_DIR}/*.cu" "${GPU_DIR}/*.cuh"
     "${GPU_DIR}/CMakeLists.txt")
set(bad "")
foreach(f ${files})
  file(STRINGS "${f}" lines REGEX "(#[ \t]*include[ \t]*[<\"](cachet/model|model/))|cachet_model")
  if(lines)
    list(APPEND bad "${f}: ${lines}")
  endif()
endforeach()
if(bad)
  string(REPLACE ";" "\n  " bad "${bad}")
  message(FATAL_ERROR "gpu/ must not include or link model/ (docs/layers.md):\n  ${bad}")
endif()
# Inside gpu/src, the layers (gpu/README.md): backends/ below shell/, shell/ below the policies,
# the policies below api/; a policy never includes the other. Headers are named from gpu/src.
set(_layer_rules
  "backends:api/|shell/|policy_pytorch/|policy_cachet/"
  "shell:api/|policy_pytorch/|policy_cachet/"
  "policy_pytorch:api/|policy_cachet/"
  "policy_cachet:api/|policy_pytorch/")
foreach(rule ${_layer_rules})
  string(REPLACE ":" ";" rule "${rule}")
  list(GET rule 0 layer)
  list(GET rule 1 banned)
  file(GLOB_RECURSE layer_files "${GPU_DIR}/src/${layer}/*.h" "${GPU_DIR}/src/${layer}/*.cpp")
  foreach(f ${layer_files})
    file(STRINGS "${f}" lines REGEX "#[ \t]*include[ \t]*\"(${banned})")
    if(lines)
      list(APPEND bad "${f} (layer ${layer}): ${lines}")
    endif()
  endforeach()
endforeach()
if(bad)
  string(REPLACE ";" "\n  " bad "${bad}")
  message(FATAL_ERROR "gpu/src includes across its layers (gpu/README.md):\n  ${bad}")
endif()
if(GPU_LINKS MATCHES "cachet_model|cachet::model")
  message(FATAL_ERROR "cachet_gpu links the model (${GPU_LINKS}); gpu/ may link cachet_common only")
endif()
list(LENGTH files n)
message(STATUS "gpu layering: ${n} files checked, no model/ includes; links: ${GPU_LINKS}")
