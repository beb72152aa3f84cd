# Tests of what users of the library see rather than of what it computes:
# the shared library's exports and SONAME, the README's example and the
# version in the changelog (examples/CMakeLists.txt registers the examples'
# runs). Included from the top-level CMakeLists.txt when BUILD_TESTING is on.

if(CMAKE_NM AND CMAKE_OBJDUMP AND CMAKE_SHARED_LIBRARY_SUFFIX STREQUAL ".so")
  add_test(NAME package.exports
           COMMAND ${CMAKE_COMMAND} -DLIBRARY=$<TARGET_FILE:flashattn> -DHEADER=${CMAKE_SOURCE_DIR}/include/flashattn.h
                   -DNM=${CMAKE_NM} -DOBJDUMP=${CMAKE_OBJDUMP} -DMAJOR=${PROJECT_VERSION_MAJOR}
                   -P ${CMAKE_SOURCE_DIR}/cmake/check_exports.cmake)
  set_tests_properties(package.exports PROPERTIES LABELS host)
endif()

add_test(NAME package.readme_example
         COMMAND ${CMAKE_COMMAND} -DREADME=${CMAKE_SOURCE_DIR}/README.md -DEXAMPLE=${CMAKE_SOURCE_DIR}/examples/quickstart.c
                 -P ${CMAKE_SOURCE_DIR}/cmake/check_readme_example.cmake)
set_tests_properties(package.readme_example PROPERTIES LABELS host)
add_test(NAME package.readme_mpi_example
         COMMAND ${CMAKE_COMMAND} -DREADME=${CMAKE_SOURCE_DIR}/README.md
                 -DEXAMPLE=${CMAKE_SOURCE_DIR}/examples/mpi/ring_attention.c -DOCCURRENCE=2
                 -P ${CMAKE_SOURCE_DIR}/cmake/check_readme_example.cmake)
set_tests_properties(package.readme_mpi_example PROPERTIES LABELS host)

add_test(NAME package.changelog_version
         COMMAND ${CMAKE_COMMAND} -DCHANGELOG=${CMAKE_SOURCE_DIR}/CHANGELOG.md -DVERSION=${PROJECT_VERSION}
                 -P ${CMAKE_SOURCE_DIR}/cmake/check_changelog.cmake)
set_tests_properties(package.changelog_version PROPERTIES LABELS host)
