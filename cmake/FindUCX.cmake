# FindUCX: UCX's UCP library, via pkg-config (Debian libucx-dev ships ucx.pc).
# Defines UCX::ucp.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PC_UCX QUIET ucx)
endif()
find_path(UCX_INCLUDE_DIR ucp/api/ucp.h HINTS ${PC_UCX_INCLUDE_DIRS} $ENV{UCX_HOME}/include)
find_library(UCX_UCP_LIBRARY ucp HINTS ${PC_UCX_LIBRARY_DIRS} $ENV{UCX_HOME}/lib)
find_library(UCX_UCS_LIBRARY ucs HINTS ${PC_UCX_LIBRARY_DIRS} $ENV{UCX_HOME}/lib)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(UCX REQUIRED_VARS UCX_UCP_LIBRARY UCX_UCS_LIBRARY UCX_INCLUDE_DIR
  VERSION_VAR PC_UCX_VERSION)
if(UCX_FOUND AND NOT TARGET UCX::ucp)
  add_library(UCX::ucp INTERFACE IMPORTED)
  set_target_properties(UCX::ucp PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${UCX_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${UCX_UCP_LIBRARY};${UCX_UCS_LIBRARY}")
endif()
mark_as_advanced(UCX_INCLUDE_DIR UCX_UCP_LIBRARY UCX_UCS_LIBRARY)
