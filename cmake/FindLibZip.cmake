# Finds libzip. Debian's libzip-dev ships a CMake config that fails unless its command-line
# tools are installed too, so this looks for the header and library directly.
# Defines LibZip_FOUND and the imported target LibZip::zip.
find_path(LibZip_INCLUDE_DIR NAMES zip.h)
find_library(LibZip_LIBRARY NAMES zip)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(LibZip REQUIRED_VARS LibZip_LIBRARY LibZip_INCLUDE_DIR)
if(LibZip_FOUND AND NOT TARGET LibZip::zip)
  add_library(LibZip::zip UNKNOWN IMPORTED)
  set_target_properties(LibZip::zip PROPERTIES
    IMPORTED_LOCATION "${LibZip_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${LibZip_INCLUDE_DIR}")
endif()
mark_as_advanced(LibZip_INCLUDE_DIR LibZip_LIBRARY)
