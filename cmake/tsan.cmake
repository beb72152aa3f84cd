# ThreadSanitizer and the concurrency tests.
#
# Tests named below get the ctest label "concurrency" in every build:
# threads sharing the library (the header's thread-safety section), the
# kernel cache filled by several processes. -DFA_TSAN=ON builds everything
# with -fsanitize=thread; the target concurrency-tests builds only the
# library and those tests' executables, which is all a TSan run needs:
#   cmake -S . -B build-tsan -DFA_TSAN=ON -DFA_CUDA=OFF -DFA_HIP=OFF
#   cmake --build build-tsan --target concurrency-tests
#   ctest --test-dir build-tsan -L concurrency
option(FA_TSAN "Build with ThreadSanitizer (for ctest -L concurrency)" OFF)
set(FA_CONCURRENCY_TESTS "^(concurrency|concurrency_opencl)\\.|^api\\.last_error_is_per_thread$|^kcache\\.concurrent_stores_of_one_key$"
    CACHE STRING "ctest names (a regular expression) labelled concurrency")

if(FA_TSAN)
  if(FA_SANITIZE)
    message(FATAL_ERROR "FA_TSAN=ON cannot be combined with FA_SANITIZE or FA_FUZZ (AddressSanitizer)")
  endif()
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()

function(fa_label_concurrency_tests)
  get_property(tests DIRECTORY PROPERTY TESTS)
  set(exes "")
  foreach(test ${tests})
    if(test MATCHES "${FA_CONCURRENCY_TESTS}")
      set_property(TEST ${test} APPEND PROPERTY LABELS concurrency)
      string(REGEX REPLACE "\\..*" "" area "${test}")
      list(APPEND exes test_${area})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES exes)
  if(exes)
    add_custom_target(concurrency-tests DEPENDS ${exes})
  endif()
endfunction()
cmake_language(DEFER CALL fa_label_concurrency_tests)
