# CUDA Toolkit detection. Without it cachet still builds everything that needs no CUDA; the
# CUDA backends are then off, and we say so once. No target links libcuda: driver entry points
# are fetched at run time (cudaGetDriverEntryPointByVersion), so binaries start on machines
# without a driver and GPU tests skip there.
set(CACHET_HAVE_CUDA OFF)
if(NOT CACHET_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90-real;75-virtual")
    endif()
    if(NOT CMAKE_CUDA_HOST_COMPILER)
      set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
    endif()
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 flag.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    # Debian 12's CMake 3.25.1 FindCUDAToolkit sets a property on CUDA::nvToolsExt without checking
    # that the target exists when the project requires CMake >= 3.25; CUDA 12.9+ ships no
    # nvToolsExt, so configure fails ("set_property could not find TARGET CUDA::nvToolsExt").
    # The lookup runs under 3.24's policy reading of that check; nothing else in it depends on it.
    set(_cachet_min_version ${CMAKE_MINIMUM_REQUIRED_VERSION})
    if(CMAKE_VERSION VERSION_LESS 3.26)
      set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(CMAKE_MINIMUM_REQUIRED_VERSION ${_cachet_min_version})
    set(CACHET_HAVE_CUDA ON)
  elseif(CACHET_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CACHET_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
if(NOT CACHET_HAVE_CUDA)
  message(STATUS "cachet: CUDA Toolkit not found or disabled: CUDA backends are off; host backends only")
endif()
