# Part of `cmake --install` (python/CMakeLists.txt sets CACHET_PY_SOURCE, CACHET_PY_DIR and
# CACHET_LIBDIR first): installs cachet_torch.py with the installed libcachet_torch.so's absolute
# path written into it (_INSTALLED_LIB), so cachet_torch.library_path() finds the library from any
# directory the module is installed to. Honours --prefix and DESTDIR.
set(_lib "${CMAKE_INSTALL_PREFIX}/${CACHET_LIBDIR}/libcachet_torch.so")
set(_dir "${CACHET_PY_DIR}")
if(NOT IS_ABSOLUTE "${_dir}")
  set(_dir "${CMAKE_INSTALL_PREFIX}/${_dir}")
endif()
file(READ "${CACHET_PY_SOURCE}" _text)
set(_marker "_INSTALLED_LIB: Optional[str] = None")
string(FIND "${_text}" "${_marker}" _at)
if(_at LESS 0)
  message(FATAL_ERROR "cachet: ${CACHET_PY_SOURCE} lacks the line '${_marker}' that install fills in")
endif()
string(REPLACE "${_marker}" "_INSTALLED_LIB: Optional[str] = \"${_lib}\"" _text "${_text}")
# The c10 backend (libcachet_c10.so, built only where a torch was found) goes to the same libdir;
# cachet_torch.c10_library_path() checks that it exists before using it.
set(_c10 "${CMAKE_INSTALL_PREFIX}/${CACHET_LIBDIR}/libcachet_c10.so")
set(_c10_marker "_INSTALLED_C10_LIB: Optional[str] = None")
string(FIND "${_text}" "${_c10_marker}" _at)
if(_at LESS 0)
  message(FATAL_ERROR "cachet: ${CACHET_PY_SOURCE} lacks the line '${_c10_marker}' that install fills in")
endif()
string(REPLACE "${_c10_marker}" "_INSTALLED_C10_LIB: Optional[str] = \"${_c10}\"" _text "${_text}")
message(STATUS "Installing: $ENV{DESTDIR}${_dir}/cachet_torch.py (library: ${_lib})")
file(WRITE "$ENV{DESTDIR}${_dir}/cachet_torch.py" "${_text}")
