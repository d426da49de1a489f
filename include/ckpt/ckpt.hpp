#pragma once
// ckpt: embeddable checkpoint and resume. Include this one header.
//
//   values       ParamDict, Value, Tensor, Order, dtypes               param_dict.hpp, tensor.hpp
//   bound values view_of(string, map, engine, …), bytes_of, object     bound.hpp, object.hpp
//   one file     save_checkpoint, load_checkpoint, load_checkpoint_into,
//                load_param_into_net, verify_checkpoint                checkpoint.hpp
//   one entry    open: read and verify one entry or rows of a tensor    open.hpp
//   finding      latest, latest_checkpoint, list_checkpoints           latest.hpp
//   policies     SavePolicy, RetentionPolicy, NamingPolicy,
//                ArchivePolicy                                         policies/
//   codecs       CodecPolicy, NoCodec, Chain, Key                      codecs/codec.hpp
//   manager      CheckpointManager, CheckpointConfig, make_manager     manager.hpp, config.hpp
//   series       its lock (SeriesLocked), the record that it finished  series.hpp
//   preemption   TerminationSignals, Preempted, preempted_exit_status  preemption.hpp
//   errors       Error and its subclasses                               error.hpp
//
// Two headers are left to be included where they are used, so that a program that does not
// use them does not pay for them (xtensor's headers; the resharding reader and its threads):
//   xtensor      view_of(container), to_tensor, as_xarray               types/xtensor.hpp
//   resharding   describe_checkpoint, GlobalIndex, load_resharded     reshard.hpp
// The rest have CMake targets of their own: the codecs Zstd and AesGcm (codecs/zstd.hpp,
// codecs/aes_gcm.hpp; ckpt::zstd, ckpt::aes_gcm), libtorch and Eigen's objects
// (types/torch.hpp, types/eigen.hpp; ckpt::torch, ckpt::eigen), and safetensors, npz and
// PyTorch files (interop/, all of them in interop.hpp; ckpt::interop).
// Built with CKPT_SEPARATE_COMPILATION (CMake target ckpt::ckpt_compiled), the headers only
// declare what the library compiles once (detail/linkage.hpp), and ckpt::object (object.hpp,
// which reads Boost.Serialization's archives) is included where it is used.

#include "append_info.hpp"
#include "bound.hpp"
#include "policies/archive.hpp"
#include "checkpoint.hpp"
#include "codecs/codec.hpp"
#include "config.hpp"
#include "dtype.hpp"
#include "error.hpp"
#include "format.hpp"
#include "latest.hpp"
#include "log.hpp"
#include "manager.hpp"
#include "open.hpp"
#include "policies/naming.hpp"
#include "param_dict.hpp"
#include "preemption.hpp"
#include "progress.hpp"
#include "policies/retention.hpp"
#include "series.hpp"
#include "policies/save.hpp"
#include "tensor.hpp"

#ifndef CKPT_SEPARATE_COMPILATION
#include "object.hpp"
#endif
