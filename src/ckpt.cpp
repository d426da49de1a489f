// The compiled part of ckpt (target ckpt::ckpt_compiled, CKPT_SEPARATE_COMPILATION): the
// library's non-template work, defined once here instead of in every file that includes the
// headers (include/ckpt/detail/linkage.hpp).
#ifndef CKPT_SEPARATE_COMPILATION
#error "src/ckpt.cpp is compiled with CKPT_SEPARATE_COMPILATION (CMake target ckpt::ckpt_compiled)"
#endif

#include "../include/ckpt/impl/checkpoint.ipp"
#include "../include/ckpt/manager.hpp"

#define CKPT_INSTANCE
#include "../include/ckpt/impl/manager_instances.ipp"
