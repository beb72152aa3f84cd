# HIP attention kernels: the CI compile check's compiler, and the mapping of
# the HIP calls the backend makes onto CUDA (FA_HIP_NVIDIA), so that the HIP
# kernels run on an NVIDIA GPU. Included by the top-level CMakeLists.txt
# after the library, the tools and the tests are defined.

option(FA_HIP_NVIDIA "Build libfa_hip_on_cuda (HIP runtime and hiprtc calls mapped onto the CUDA driver and NVRTC) and make the HIP backend load it by default" OFF)

# The compile check (tests/test_hip_compile.c) runs hipcc; FA_HIPCC at run
# time overrides what was found here.
find_program(FA_HIPCC hipcc)
if(TARGET test_hip_compile AND FA_HIPCC)
  target_compile_definitions(test_hip_compile PRIVATE FA_HIPCC_PATH="${FA_HIPCC}")
endif()

if(FA_HIP_NVIDIA)
  if(NOT FA_HIP_ENABLED)
    message(FATAL_ERROR "FA_HIP_NVIDIA=ON needs the HIP backend: point FA_HIP_INCLUDE at HIP headers (hip/hip_runtime_api.h)")
  endif()
  if(NOT FA_CUDA_HEADERS)
    message(FATAL_ERROR "FA_HIP_NVIDIA=ON needs cuda.h and nvrtc.h: set FA_CUDA_ROOT")
  endif()
  add_library(fa_hip_on_cuda SHARED ${CMAKE_SOURCE_DIR}/backends/hip_nvidia/hip_on_cuda.c)
  target_include_directories(fa_hip_on_cuda SYSTEM PRIVATE ${FA_HIP_INCLUDE} ${FA_CUDA_INCLUDE} ${FA_NVRTC_INCLUDE})
  target_compile_definitions(fa_hip_on_cuda PRIVATE _POSIX_C_SOURCE=200809L __HIP_PLATFORM_AMD__)
  target_compile_options(fa_hip_on_cuda PRIVATE ${FA_WARNINGS})
  target_link_libraries(fa_hip_on_cuda PRIVATE ${CMAKE_DL_LIBS} Threads::Threads)

  set(FA_HIP_ON_CUDA_FILE "$<TARGET_FILE:fa_hip_on_cuda>")
  target_compile_definitions(flashattn_objects PRIVATE FA_HIP_DEFAULT_LIBRARY="${FA_HIP_ON_CUDA_FILE}")
  add_dependencies(flashattn_objects fa_hip_on_cuda)
  message(STATUS "flashattn: HIP on NVIDIA through libfa_hip_on_cuda")

  if(BUILD_TESTING)
    if(TARGET test_hip_compile)
      target_compile_definitions(test_hip_compile PRIVATE FA_HIP_ON_CUDA_LIBRARY="${FA_HIP_ON_CUDA_FILE}")
    endif()
    # The HIP device tests load the mapping (FLASHATTN_HIP_LIBRARY), also
    # where the backend's own default list does not name it; so do the
    # tests that run every backend and open the HIP runtime themselves.
    foreach(hip_area hip_attention native_queue dropout_seed ring_device kvcache)
      if(EXISTS ${CMAKE_SOURCE_DIR}/tests/test_${hip_area}.c)
        file(STRINGS ${CMAKE_SOURCE_DIR}/tests/test_${hip_area}.c hip_case_lines REGEX "^FA_TEST\\([A-Za-z0-9_]+\\)")
        foreach(line ${hip_case_lines})
          string(REGEX REPLACE "^FA_TEST\\(([A-Za-z0-9_]+)\\).*" "\\1" hip_case ${line})
          set_property(TEST ${hip_area}.${hip_case} APPEND PROPERTY ENVIRONMENT
                       "FLASHATTN_HIP_LIBRARY=${FA_HIP_ON_CUDA_FILE}")
        endforeach()
      endif()
    endforeach()
  endif()
endif()
