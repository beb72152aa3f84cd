# Installation: the public header, the shared library (SONAME
# libflashattn.so.MAJOR) and the static archive, the command-line tools, a
# CMake package (find_package(flashattn CONFIG) gives flashattn::flashattn
# and flashattn::flashattn_static) and flashattn.pc for pkg-config. Kernel
# sources are embedded in the library and vendor runtimes are loaded at run
# time, so nothing else is needed at the prefix.
#
# Under scikit-build-core (pip install .) only the shared library is
# installed, into the Python package's folder, as component "python".

include(CMakePackageConfigHelpers)

if(SKBUILD)
  # One file, no symlinks (a wheel cannot hold them); the Python package
  # loads it by path, so the SONAME does not matter there.
  install(FILES $<TARGET_FILE:flashattn> DESTINATION flashattn COMPONENT python
          RENAME ${CMAKE_SHARED_LIBRARY_PREFIX}flashattn${CMAKE_SHARED_LIBRARY_SUFFIX})
endif()

set(FA_CMAKE_PACKAGE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashattn)

install(FILES ${CMAKE_SOURCE_DIR}/include/flashattn.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
install(TARGETS flashattn flashattn_static EXPORT flashattn-targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS fa-info fa-run fa-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)

install(EXPORT flashattn-targets NAMESPACE flashattn:: FILE flashattnTargets.cmake
        DESTINATION ${FA_CMAKE_PACKAGE_DIR} COMPONENT development)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/flashattnConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/flashattnConfig.cmake
                              INSTALL_DESTINATION ${FA_CMAKE_PACKAGE_DIR})
# 0.x releases keep the ABI within a major version, as the SONAME says.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/flashattnConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/flashattnConfig.cmake ${CMAKE_BINARY_DIR}/flashattnConfigVersion.cmake
        DESTINATION ${FA_CMAKE_PACKAGE_DIR} COMPONENT development)

# pkg-config: paths relative to the .pc file, so the tree can be installed
# with any --prefix (or moved) and still be found.
set(FA_PKGCONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "flashattn.pc needs CMAKE_INSTALL_LIBDIR and CMAKE_INSTALL_INCLUDEDIR relative to the prefix")
endif()
file(RELATIVE_PATH FA_PC_TO_PREFIX /prefix/${FA_PKGCONFIG_DIR} /prefix)
string(REGEX REPLACE "/$" "" FA_PC_TO_PREFIX "${FA_PC_TO_PREFIX}")
set(FA_PC_LIBS_PRIVATE "")
foreach(lib ${CMAKE_DL_LIBS} ${CMAKE_THREAD_LIBS_INIT} m)
  if(lib MATCHES "^-")
    string(APPEND FA_PC_LIBS_PRIVATE " ${lib}")
  else()
    string(APPEND FA_PC_LIBS_PRIVATE " -l${lib}")
  endif()
endforeach()
string(STRIP "${FA_PC_LIBS_PRIVATE}" FA_PC_LIBS_PRIVATE)
configure_file(${CMAKE_SOURCE_DIR}/cmake/flashattn.pc.in ${CMAKE_BINARY_DIR}/flashattn.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/flashattn.pc DESTINATION ${FA_PKGCONFIG_DIR} COMPONENT development)

# libflashattn_mpi, where it was built: its header, both libraries, a
# targets file of its own (loaded by the package's "mpi" component, so that
# find_package(flashattn) needs no MPI where it is not asked for) and
# flashattn_mpi.pc, which names the MPI it was built with.
if(FA_MPI_ENABLED)
  install(FILES ${CMAKE_SOURCE_DIR}/mpi/flashattn_mpi.h
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
  install(TARGETS flashattn_mpi flashattn_mpi_static EXPORT flashattn_mpi-targets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  install(EXPORT flashattn_mpi-targets NAMESPACE flashattn:: FILE flashattn_mpiTargets.cmake
          DESTINATION ${FA_CMAKE_PACKAGE_DIR} COMPONENT development)
  set(FA_MPI_PC_CFLAGS "")
  foreach(dir ${MPI_C_INCLUDE_DIRS})
    string(APPEND FA_MPI_PC_CFLAGS " -I${dir}")
  endforeach()
  foreach(flag ${MPI_C_COMPILE_OPTIONS})
    string(APPEND FA_MPI_PC_CFLAGS " ${flag}")
  endforeach()
  foreach(def ${MPI_C_COMPILE_DEFINITIONS})
    string(APPEND FA_MPI_PC_CFLAGS " -D${def}")
  endforeach()
  set(FA_MPI_PC_LIBS "")
  foreach(flag ${MPI_C_LINK_FLAGS})
    string(APPEND FA_MPI_PC_LIBS " ${flag}")
  endforeach()
  foreach(lib ${MPI_C_LIBRARIES})
    if(lib MATCHES "^-" OR IS_ABSOLUTE "${lib}")
      string(APPEND FA_MPI_PC_LIBS " ${lib}")
    else()
      string(APPEND FA_MPI_PC_LIBS " -l${lib}")
    endif()
  endforeach()
  configure_file(${CMAKE_SOURCE_DIR}/cmake/flashattn_mpi.pc.in ${CMAKE_BINARY_DIR}/flashattn_mpi.pc @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/flashattn_mpi.pc DESTINATION ${FA_PKGCONFIG_DIR} COMPONENT development)
endif()
