# Part of `cmake --install` (python/CMakeLists.txt sets CACHET_PY_SOURCE, the package directory
# python/cachet_torch, CACHET_PY_DIR and CACHET_LIBDIR first): installs the cachet_torch package
# (every .py file of it, and _startup/, configure_subprocess()'s start hook) into
# CACHET_PY_DIR/cachet_torch/, with the installed libraries' absolute paths written into its
# _library.py (_INSTALLED_LIB, _INSTALLED_C10_LIB), so cachet_torch.library_path() finds the
# library from any directory the package is installed to.
# A package installed before replaces the old one whole (stale modules and __pycache__ go), and a
# cachet_torch.py of an install before the package layout is removed. Honours --prefix and DESTDIR.
set(_lib "${CMAKE_INSTALL_PREFIX}/${CACHET_LIBDIR}/libcachet_torch.so")
set(_dir "${CACHET_PY_DIR}")
if(NOT IS_ABSOLUTE "${_dir}")
  set(_dir "${CMAKE_INSTALL_PREFIX}/${_dir}")
endif()
set(_dest "$ENV{DESTDIR}${_dir}/cachet_torch")
set(_state "${CACHET_PY_SOURCE}/_library.py")
file(READ "${_state}" _text)
set(_marker "_INSTALLED_LIB: Optional[str] = None")
string(FIND "${_text}" "${_marker}" _at)
if(_at LESS 0)
  message(FATAL_ERROR "cachet: ${_state} lacks the line '${_marker}' that install fills in")
endif()
string(REPLACE "${_marker}" "_INSTALLED_LIB: Optional[str] = \"${_lib}\"" _text "${_text}")
# The c10 backend (libcachet_c10.so, built only where a torch was found) goes to the same libdir;
# cachet_torch.c10_library_path() checks that it exists before using it.
set(_c10 "${CMAKE_INSTALL_PREFIX}/${CACHET_LIBDIR}/libcachet_c10.so")
set(_c10_marker "_INSTALLED_C10_LIB: Optional[str] = None")
string(FIND "${_text}" "${_c10_marker}" _at)
if(_at LESS 0)
  message(FATAL_ERROR "cachet: ${_state} lacks the line '${_c10_marker}' that install fills in")
endif()
string(REPLACE "${_c10_marker}" "_INSTALLED_C10_LIB: Optional[str] = \"${_c10}\"" _text "${_text}")

file(REMOVE_RECURSE "${_dest}")
file(REMOVE "$ENV{DESTDIR}${_dir}/cachet_torch.py")
file(GLOB _modules RELATIVE "${CACHET_PY_SOURCE}" "${CACHET_PY_SOURCE}/*.py" "${CACHET_PY_SOURCE}/_startup/*.py")
foreach(_m ${_modules})
  if(NOT _m STREQUAL "_library.py")
    get_filename_component(_sub "${_m}" DIRECTORY)
    file(COPY "${CACHET_PY_SOURCE}/${_m}" DESTINATION "${_dest}/${_sub}")
  endif()
endforeach()
message(STATUS "Installing: ${_dest}/ (the cachet_torch package: ${_modules}; library: ${_lib})")
file(WRITE "${_dest}/_library.py" "${_text}")
