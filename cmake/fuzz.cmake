# The libFuzzer target (tests/fuzz): -DFA_FUZZ=ON with clang builds fa-fuzz,
# the library instrumented for coverage, AddressSanitizer and UBSan. Included
# before the targets are defined, so the switches below reach all of them;
# the fuzzer itself is added once the library exists.
option(FA_FUZZ "Build the libFuzzer target fa-fuzz (clang only; implies FA_SANITIZE)" OFF)
if(FA_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FA_FUZZ=ON needs clang (-fsanitize=fuzzer); configure with CC=clang")
  endif()
  set(FA_SANITIZE ON)
  # The target drives the reference backend only: vendor backends would
  # add build time and no coverage.
  set(FA_OPENCL OFF)
  set(FA_CUDA OFF)
  set(FA_HIP OFF)

  function(fa_add_fuzz_target)
    target_compile_options(flashattn_objects PRIVATE -fsanitize=fuzzer-no-link)
    add_executable(fa-fuzz ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_api.c ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_gen.c
                           ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_input.c ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_oracle.c)
    target_link_libraries(fa-fuzz PRIVATE flashattn_static)
    target_compile_definitions(fa-fuzz PRIVATE _POSIX_C_SOURCE=200809L)
    target_compile_options(fa-fuzz PRIVATE ${FA_WARNINGS} -fsanitize=fuzzer)
    target_link_options(fa-fuzz PRIVATE -fsanitize=fuzzer)
  endfunction()
  cmake_language(DEFER CALL fa_add_fuzz_target)
endif()
