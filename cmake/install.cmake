# Installation: public headers, libshoal, the shoalrun / shoal-bench tools,
# the CMake package (shoal::shoal via find_package(shoal)) and shoal.pc.
#
# Included at the end of the top-level CMakeLists.txt, after every target is
# defined, so if(TARGET ...) below sees the tools when they are built.
#
# What a consumer needs and does not need:
#  - libshoal is a SHARED library whose dependencies (fmt, UCX, Threads) are
#    all linked PRIVATE, and the public headers are plain C11 that include
#    only libc headers. So the exported target carries no link interface
#    beyond libshoal.so itself, shoalConfig.cmake has no find_dependency(),
#    and shoal.pc has no Requires. The dynamic loader finds libfmt / libucp
#    through libshoal.so's DT_NEEDED (and its RPATH, set below).
#  - The export still records fmt::fmt under IMPORTED_LINK_DEPENDENT_LIBRARIES
#    (a hint for -rpath-link); CMake ignores it when the consumer has no such
#    target, so it does not force find_package(fmt) on consumers.
#    tests/install checks all of this from a consumer that never looks for
#    fmt or UCX.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SHOAL_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/shoal"
  CACHE STRING "Where shoalConfig.cmake is installed, relative to the prefix")
mark_as_advanced(SHOAL_INSTALL_CMAKEDIR)

# ---- RPATH --------------------------------------------------------------
# Installed tools find the installed libshoal relative to themselves
# ($ORIGIN/../lib for the usual layout), so the prefix can be moved and
# nothing needs LD_LIBRARY_PATH. INSTALL_RPATH_USE_LINK_PATH additionally
# keeps the directories of dependencies found outside the system paths
# (e.g. UCX under $UCX_HOME), which would otherwise be stripped on install.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(_shoal_rpath "${CMAKE_INSTALL_LIBDIR}")
else()
  # Both are relative to the prefix, so a dummy root gives their relation.
  file(RELATIVE_PATH _shoal_bin_to_lib
    "/prefix/${CMAKE_INSTALL_BINDIR}" "/prefix/${CMAKE_INSTALL_LIBDIR}")
  set(_shoal_rpath "$ORIGIN/${_shoal_bin_to_lib}")
endif()

set_target_properties(shoal PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)

set(_shoal_tools "")
foreach(_tool shoalrun shoal-bench)
  if(TARGET ${_tool})
    list(APPEND _shoal_tools ${_tool})
    # Respect an INSTALL_RPATH the tool's owner may already have chosen.
    get_target_property(_tool_rpath ${_tool} INSTALL_RPATH)
    if(NOT _tool_rpath)
      set_target_properties(${_tool} PROPERTIES INSTALL_RPATH "${_shoal_rpath}")
    endif()
    set_target_properties(${_tool} PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  endif()
endforeach()

# ---- files ---------------------------------------------------------------
# install(TARGETS) on a versioned shared library installs libshoal.so.X.Y.Z
# plus the libshoal.so.X (SONAME) and libshoal.so (link-time) symlinks.
install(TARGETS shoal EXPORT shoalTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

if(_shoal_tools)
  install(TARGETS ${_shoal_tools} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# Only the public headers: include/shoal may one day hold other files.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/shoal
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")

# ---- CMake package: find_package(shoal) -> shoal::shoal ------------------
# The export names the target "shoal::shoal", matching the ALIAS used inside
# the build, so consumers write the same name either way.
install(EXPORT shoalTargets
  NAMESPACE shoal::
  FILE shoalTargets.cmake
  DESTINATION ${SHOAL_INSTALL_CMAKEDIR})

# configure_package_config_file makes the config file compute its prefix
# from its own location, so the installed tree is relocatable and
# `cmake --install --prefix DIR` works without reconfiguring.
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/shoalConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/shoalConfig.cmake
  INSTALL_DESTINATION ${SHOAL_INSTALL_CMAKEDIR})

# 0.x releases: SameMajorVersion accepts any 0.y >= the requested one. The
# C ABI is kept compatible within a major version (struct_size in
# shoal_config_t exists for that), matching the library's SOVERSION.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/shoalConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)

install(FILES
  ${PROJECT_BINARY_DIR}/cmake/shoalConfig.cmake
  ${PROJECT_BINARY_DIR}/cmake/shoalConfigVersion.cmake
  DESTINATION ${SHOAL_INSTALL_CMAKEDIR})

# ---- pkg-config: shoal.pc ------------------------------------------------
# The prefix is written relative to the .pc file (${pcfiledir}, understood by
# pkg-config and pkgconf), for the same reason as above: the prefix given to
# `cmake --install --prefix` is not known at configure time. Absolute
# install dirs (e.g. -DCMAKE_INSTALL_LIBDIR=/opt/lib) are written as given.
set(_shoal_pc_dir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(SHOAL_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _shoal_pc_to_prefix "/prefix/${_shoal_pc_dir}" "/prefix")
  string(REGEX REPLACE "/$" "" _shoal_pc_to_prefix "${_shoal_pc_to_prefix}")
  set(SHOAL_PC_PREFIX "\${pcfiledir}/${_shoal_pc_to_prefix}")
endif()
foreach(_dir INCLUDEDIR LIBDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_dir}}")
    set(SHOAL_PC_${_dir} "${CMAKE_INSTALL_${_dir}}")
  else()
    set(SHOAL_PC_${_dir} "\${prefix}/${CMAKE_INSTALL_${_dir}}")
  endif()
endforeach()

# Libs carries -Wl,-rpath,${libdir} unless libdir is one the loader searches
# anyway (/usr/lib, /lib, their 64/32 and multiarch forms), so that
# `cc app.c $(pkg-config --cflags --libs shoal)` makes a program that finds
# libshoal.so.0 in /opt/shoal or $HOME/.local without LD_LIBRARY_PATH or
# ldconfig. Which one applies is known only at install time (--prefix), so
# both variants are configured and the install script picks one.
set(SHOAL_PC_RPATH " -Wl,-rpath,\${libdir}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/shoal.pc.in
  ${PROJECT_BINARY_DIR}/cmake/shoal.pc @ONLY)
set(SHOAL_PC_RPATH "")
configure_file(${PROJECT_SOURCE_DIR}/cmake/shoal.pc.in
  ${PROJECT_BINARY_DIR}/cmake/shoal-system-libdir.pc @ONLY)
unset(SHOAL_PC_RPATH)
install(CODE "
  set(_shoal_libdir \"${CMAKE_INSTALL_LIBDIR}\")
  set(_shoal_pc_dest \"${_shoal_pc_dir}\")
  if(NOT IS_ABSOLUTE \"\${_shoal_libdir}\")
    set(_shoal_libdir \"\${CMAKE_INSTALL_PREFIX}/\${_shoal_libdir}\")
    set(_shoal_pc_dest \"\${CMAKE_INSTALL_PREFIX}/\${_shoal_pc_dest}\")
  endif()
  set(_shoal_pc \"${PROJECT_BINARY_DIR}/cmake/shoal.pc\")
  if(_shoal_libdir MATCHES \"^/(usr/)?lib(64|32)?(/[^/]+-linux-gnu[^/]*)?/?$\")
    set(_shoal_pc \"${PROJECT_BINARY_DIR}/cmake/shoal-system-libdir.pc\")
  endif()
  file(INSTALL DESTINATION \"\${_shoal_pc_dest}\" TYPE FILE RENAME shoal.pc FILES \"\${_shoal_pc}\")
")

unset(_shoal_rpath)
unset(_shoal_bin_to_lib)
unset(_shoal_tools)
unset(_tool_rpath)
unset(_shoal_pc_dir)
unset(_shoal_pc_to_prefix)
