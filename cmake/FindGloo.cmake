# Finds Gloo (Debian libgloo-dev) and hiredis (libhiredis-dev, which Gloo's Redis store and
# ckpt's RedisStore use). Defines Gloo_FOUND and the imported targets Gloo::gloo and
# Gloo::hiredis.
find_path(Gloo_INCLUDE_DIR NAMES gloo/rendezvous/context.h)
find_library(Gloo_LIBRARY NAMES gloo)
find_path(Gloo_HIREDIS_INCLUDE_DIR NAMES hiredis/hiredis.h)
find_library(Gloo_HIREDIS_LIBRARY NAMES hiredis)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Gloo
  REQUIRED_VARS Gloo_LIBRARY Gloo_INCLUDE_DIR Gloo_HIREDIS_LIBRARY Gloo_HIREDIS_INCLUDE_DIR)
if(Gloo_FOUND AND NOT TARGET Gloo::gloo)
  add_library(Gloo::hiredis UNKNOWN IMPORTED)
  set_target_properties(Gloo::hiredis PROPERTIES
    IMPORTED_LOCATION "${Gloo_HIREDIS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Gloo_HIREDIS_INCLUDE_DIR}")
  add_library(Gloo::gloo UNKNOWN IMPORTED)
  set_target_properties(Gloo::gloo PROPERTIES
    IMPORTED_LOCATION "${Gloo_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Gloo_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES Gloo::hiredis)
endif()
mark_as_advanced(Gloo_INCLUDE_DIR Gloo_LIBRARY Gloo_HIREDIS_INCLUDE_DIR Gloo_HIREDIS_LIBRARY)
