# Warnings for every cachet target: -Wall -Wextra -Wpedantic, clean.
add_library(cachet_warnings INTERFACE)
target_compile_options(cachet_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${CACHET_WARNINGS_AS_ERRORS}>>:-Werror>)
