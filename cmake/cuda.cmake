# The optional GPU build.
#   SHOAL_WITH_CUDA=AUTO|ON|OFF  CUDA kernels (device reducers, GPU compressors); AUTO = if nvcc is found
#   SHOAL_WITH_NCCL=AUTO|ON|OFF  the NCCL transport for CUDA tensors; needs CUDA
#   SHOAL_CUDA_ARCHITECTURES     default 90 (H100/H200); e.g. "80;90" adds A100
# Sets SHOAL_CUDA_ENABLED / SHOAL_NCCL_ENABLED for the rest of the build.
set(SHOAL_WITH_CUDA AUTO CACHE STRING "Build the CUDA kernels: AUTO, ON or OFF")
set(SHOAL_WITH_NCCL AUTO CACHE STRING "Build the NCCL transport: AUTO, ON or OFF (needs CUDA)")
set(SHOAL_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures to build for")
set_property(CACHE SHOAL_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
set_property(CACHE SHOAL_WITH_NCCL PROPERTY STRINGS AUTO ON OFF)

set(SHOAL_CUDA_ENABLED OFF)
set(SHOAL_NCCL_ENABLED OFF)
if(NOT SHOAL_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${SHOAL_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)  # CMake < 3.26 does not know nvcc's C++20 flag
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # CMake 3.25 knows no C++20 switch for nvcc (12+ has it): tell it.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(SHOAL_CUDA_ENABLED ON)
  elseif(SHOAL_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SHOAL_WITH_CUDA=ON but no CUDA compiler was found: install the CUDA toolkit "
                        "(nvcc in /usr/local/cuda/bin or on PATH) or configure with -DSHOAL_WITH_CUDA=OFF")
  endif()
endif()

if(SHOAL_CUDA_ENABLED AND NOT SHOAL_WITH_NCCL STREQUAL "OFF")
  find_package(NCCL)
  if(NCCL_FOUND)
    set(SHOAL_NCCL_ENABLED ON)
  elseif(SHOAL_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "SHOAL_WITH_NCCL=ON but NCCL was not found: set NCCL_HOME to its prefix")
  endif()
elseif(SHOAL_WITH_NCCL STREQUAL "ON")
  message(FATAL_ERROR "SHOAL_WITH_NCCL=ON needs CUDA (SHOAL_WITH_CUDA is ${SHOAL_WITH_CUDA} or nvcc was not found)")
endif()
# Recorded in the cache so scripts can read what this build directory has.
set(SHOAL_CUDA_ENABLED ${SHOAL_CUDA_ENABLED} CACHE INTERNAL "CUDA kernels built")
set(SHOAL_NCCL_ENABLED ${SHOAL_NCCL_ENABLED} CACHE INTERNAL "NCCL transport built")
message(STATUS "shoal: CUDA ${SHOAL_CUDA_ENABLED} (architectures ${CMAKE_CUDA_ARCHITECTURES}), NCCL ${SHOAL_NCCL_ENABLED} ${NCCL_VERSION}")

# Sources that exist only in the GPU build. Convention:
#   lib/gpu/cuda/*.{cc,cu}        device runtime glue (streams, device memory, pack/unpack)
#   collectives/*/*.cu            device reducers
#   compressors/*/*.cu            GPU compressor kernels (per-element logic in *_math.h, shared with the CPU)
#   lib/gpu/nccl/*.cc             the NCCL communicator (SHOAL_NCCL_ENABLED only)
# Host code calls them only under #if SHOAL_WITH_CUDA / SHOAL_WITH_NCCL.
set(SHOAL_GPU_SOURCES "")
if(SHOAL_CUDA_ENABLED)
  file(GLOB SHOAL_GPU_SOURCES CONFIGURE_DEPENDS
    lib/gpu/cuda/*.cc lib/gpu/cuda/*.cu collectives/*/*.cu compressors/*/*.cu)
  list(FILTER SHOAL_GPU_SOURCES EXCLUDE REGEX "compressors/example_plugin/")
  if(SHOAL_NCCL_ENABLED)
    file(GLOB _nccl_sources CONFIGURE_DEPENDS lib/gpu/nccl/*.cc)
    list(APPEND SHOAL_GPU_SOURCES ${_nccl_sources})
  endif()
endif()

# Applies the GPU build's definitions and libraries to a target built from SHOAL_SOURCES.
function(shoal_add_gpu target visibility)
  if(SHOAL_CUDA_ENABLED)
    target_compile_definitions(${target} ${visibility} SHOAL_WITH_CUDA=1)
    target_link_libraries(${target} ${visibility} CUDA::cudart CUDA::cublas CUDA::cusolver)
    set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
  endif()
  if(SHOAL_NCCL_ENABLED)
    target_compile_definitions(${target} ${visibility} SHOAL_WITH_NCCL=1)
    target_link_libraries(${target} ${visibility} NCCL::nccl)
  endif()
endfunction()
