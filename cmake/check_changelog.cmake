# The changelog's newest release must be the version the header declares,
# so a release cannot ship without its entry. Run by ctest:
#   cmake -DCHANGELOG=... -DVERSION=... -P check_changelog.cmake
file(STRINGS "${CHANGELOG}" releases REGEX "^## \\[[0-9]+\\.[0-9]+\\.[0-9]+\\]")
if(NOT releases)
  message(FATAL_ERROR "${CHANGELOG}: no release heading \"## [MAJOR.MINOR.PATCH]\"")
endif()
list(GET releases 0 newest)
string(REGEX REPLACE "^## \\[([0-9.]+)\\].*" "\\1" newest "${newest}")
if(NOT newest STREQUAL VERSION)
  message(FATAL_ERROR "${CHANGELOG}: newest release ${newest}, the header declares ${VERSION}")
endif()
message(STATUS "CHANGELOG.md: ${newest}")
