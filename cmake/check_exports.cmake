# The shared library must export exactly the functions the public header
# marks FA_API: a missing export breaks every application that calls it, an
# extra one leaks an internal name that applications could come to depend on.
# Also checks the SONAME. Run by ctest:
#   cmake -DLIBRARY=... -DHEADER=... -DNM=... -DOBJDUMP=... -DMAJOR=... -P check_exports.cmake
# For another library of the project, -DAPI_MACRO= names its export macro
# (default FA_API) and -DNAME= its name (default flashattn: SONAME
# libflashattn.so.MAJOR).

foreach(var LIBRARY HEADER NM OBJDUMP MAJOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_exports.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT API_MACRO)
  set(API_MACRO FA_API)
endif()
if(NOT NAME)
  set(NAME flashattn)
endif()

# Declared: every "FA_API <type> name(" of the header (a declaration may
# span lines, but the name always follows FA_API on the same line).
file(STRINGS "${HEADER}" api_lines REGEX "^${API_MACRO} ")
set(declared "")
foreach(line IN LISTS api_lines)
  if(NOT line MATCHES "^${API_MACRO} [^(]*[ *]([A-Za-z_][A-Za-z0-9_]*)\\(")
    message(FATAL_ERROR "cannot read a function name from the declaration: ${line}")
  endif()
  list(APPEND declared ${CMAKE_MATCH_1})
endforeach()
list(LENGTH declared declared_count)
list(REMOVE_DUPLICATES declared)
list(LENGTH declared unique_count)
if(NOT declared_count EQUAL unique_count OR declared_count EQUAL 0)
  message(FATAL_ERROR "${HEADER}: ${declared_count} ${API_MACRO} declarations, ${unique_count} distinct names")
endif()

# Exported: the defined symbols of the dynamic symbol table.
execute_process(COMMAND "${NM}" -D --defined-only "${LIBRARY}"
                OUTPUT_VARIABLE nm_out RESULT_VARIABLE nm_rc ERROR_VARIABLE nm_err)
if(NOT nm_rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIBRARY} failed: ${nm_err}")
endif()
string(REPLACE "\n" ";" nm_lines "${nm_out}")
set(exported "")
foreach(line IN LISTS nm_lines)
  if(line MATCHES "^[0-9a-fA-F]* *[A-Za-z] ([^ @]+)")
    list(APPEND exported ${CMAKE_MATCH_1})
  endif()
endforeach()
list(LENGTH exported exported_count)

set(missing ${declared})
list(REMOVE_ITEM missing ${exported})
set(extra ${exported})
list(REMOVE_ITEM extra ${declared})
message(STATUS "header: ${declared_count} ${API_MACRO} functions; ${LIBRARY}: ${exported_count} exported symbols")
if(missing OR extra)
  list(JOIN missing " " missing_text)
  list(JOIN extra " " extra_text)
  message(FATAL_ERROR "declared but not exported: [${missing_text}]\nexported but not declared: [${extra_text}]")
endif()

execute_process(COMMAND "${OBJDUMP}" -p "${LIBRARY}" OUTPUT_VARIABLE dump RESULT_VARIABLE dump_rc)
if(NOT dump_rc EQUAL 0 OR NOT dump MATCHES "SONAME +([^\n ]+)")
  message(FATAL_ERROR "${OBJDUMP} -p ${LIBRARY}: no SONAME")
endif()
if(NOT CMAKE_MATCH_1 STREQUAL "lib${NAME}.so.${MAJOR}")
  message(FATAL_ERROR "SONAME is ${CMAKE_MATCH_1}, expected lib${NAME}.so.${MAJOR}")
endif()
message(STATUS "SONAME ${CMAKE_MATCH_1}")
