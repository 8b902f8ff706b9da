# `cmake --install` installs headers, libraries, the `cachet` command and a CMake package:
# find_package(cachet) gives cachet::cachet (the allocator and its vocabulary) and the
# component targets cachet::common, cachet::model, cachet::gpu, cachet::io.
include(CMakePackageConfigHelpers)

add_library(cachet_all INTERFACE)
set_target_properties(cachet_all PROPERTIES EXPORT_NAME cachet)
add_library(cachet::cachet ALIAS cachet_all)

set(_cachet_export_targets cachet_all cachet_warnings)
foreach(t cachet_common cachet_model cachet_gpu cachet_io)
  if(TARGET ${t})
    list(APPEND _cachet_export_targets ${t})
  endif()
endforeach()
if(TARGET cachet_gpu)
  target_link_libraries(cachet_all INTERFACE cachet_gpu cachet_common)
else()
  target_link_libraries(cachet_all INTERFACE cachet_common)
endif()

install(TARGETS ${_cachet_export_targets} EXPORT cachetTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(dir common/include tools/io/include model/include gpu/include)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${dir})
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
endforeach()
install(EXPORT cachetTargets NAMESPACE cachet:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cachet)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/cachetConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cachetConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cachet)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cachetConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cachetConfig.cmake ${PROJECT_BINARY_DIR}/cachetConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cachet)
