# The README's C example must be examples/quickstart.c, character for
# character, so the code a reader copies is the code that CI compiles and
# runs. Run by ctest: cmake -DREADME=... -DEXAMPLE=... -P check_readme_example.cmake
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "```c\n" start)
if(start EQUAL -1)
  message(FATAL_ERROR "${README}: no ```c code block")
endif()
math(EXPR start "${start} + 5")
string(SUBSTRING "${readme}" ${start} -1 rest)
string(FIND "${rest}" "```\n" length)
if(length EQUAL -1)
  message(FATAL_ERROR "${README}: the ```c code block is not closed")
endif()
string(SUBSTRING "${rest}" 0 ${length} block)
if(NOT block STREQUAL example)
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/readme_example.c" "${block}")
  message(FATAL_ERROR "the README's C example differs from ${EXAMPLE}; the README's block is in "
          "${CMAKE_CURRENT_BINARY_DIR}/readme_example.c (diff the two)")
endif()
message(STATUS "README example = ${EXAMPLE}")
