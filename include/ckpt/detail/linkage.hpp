#pragma once
// Header-only or compiled, the user's choice (as spdlog's SPDLOG_COMPILED_LIB and Asio's
// BOOST_ASIO_SEPARATE_COMPILATION). By default every function is defined in the headers.
// With CKPT_SEPARATE_COMPILATION defined (CMake: link ckpt::ckpt_compiled), the headers only
// declare the library's non-template work, which src/ckpt.cpp compiles once: a file that
// includes ckpt then parses no Boost.Serialization header and compiles none of that code.
// One program uses one mode: every file of it defines the macro, or none does.
//
// CKPT_INLINE marks the definitions in include/ckpt/impl/*.ipp: inline when they are
// compiled in every file that includes them, ordinary functions when compiled once.

#ifdef CKPT_SEPARATE_COMPILATION
#define CKPT_INLINE
#else
#define CKPT_INLINE inline
#endif
