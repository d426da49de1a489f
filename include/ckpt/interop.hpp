#pragma once
// Exchange with other frameworks: safetensors, NumPy's npz, and reading PyTorch's torch.save
// files, one header each under interop/; this one includes them all. Not part of ckpt.hpp:
// link the CMake target ckpt::interop (nlohmann-json for the safetensors header, libzip for
// the npz and PyTorch containers).
//
//   save_safetensors(dict, path)            load_safetensors(path) -> ParamDict    interop/safetensors.hpp
//   save_npz(dict, path, compressed)        load_npz(path) -> ParamDict            interop/npz.hpp
//                                           load_torch(path) -> ParamDict          interop/pytorch.hpp
//   safetensors_contents(path), npz_contents(path), torch_contents(path): what the loads would
//   return, as a table of contents (names, dtypes, shapes, values), no tensor's bytes read.
//
// Every file is read as hostile: the loads take InteropLoadOptions (interop/common.hpp), whose
// max_decoded_bytes (by default the larger of 256 MiB and 64 times the file) bounds what a
// file may decode to before the memory is taken; JSON nesting is bounded; no pickle is
// executed. Writes are atomic and durable like checkpoints (temporary, fsync, rename, fsync of
// the directory). Every length and offset read from a file is checked against the file's size
// before anything is allocated; a bad file is a FormatError naming the file and the field.

#include "interop/npz.hpp"
#include "interop/pytorch.hpp"
#include "interop/safetensors.hpp"
