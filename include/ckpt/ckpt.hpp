#pragma once
// ckpt: embeddable checkpoint and resume. Include this one header.
//
//   values       ParamDict, Value, Tensor, dtypes                      param_dict.hpp, tensor.hpp
//   one file     save_checkpoint, load_checkpoint, load_checkpoint_into,
//                load_param_into_net, verify_checkpoint                checkpoint.hpp
//   finding      latest, latest_checkpoint, list_checkpoints           latest.hpp
//   policies     SavePolicy, RetentionPolicy, NamingPolicy, ArchivePolicy, CodecPolicy
//   codecs       NoCodec, Chain, Key; Zstd and AesGcm in zstd.hpp and
//                aes_gcm.hpp (targets ckpt::zstd, ckpt::aes_gcm)          codec.hpp
//   resharding   describe_checkpoint, GlobalIndex, load_resharded     reshard.hpp
//   manager      CheckpointManager, CheckpointConfig, make_manager     manager.hpp, config.hpp
//   preemption   TerminationSignals, Preempted, preempted_exit_status  preemption.hpp
//   errors       Error and its subclasses                               error.hpp

#include "append_info.hpp"
#include "archive_policy.hpp"
#include "checkpoint.hpp"
#include "codec.hpp"
#include "config.hpp"
#include "dtype.hpp"
#include "error.hpp"
#include "format.hpp"
#include "latest.hpp"
#include "log.hpp"
#include "manager.hpp"
#include "naming_policy.hpp"
#include "param_dict.hpp"
#include "preemption.hpp"
#include "progress.hpp"
#include "reshard.hpp"
#include "retention_policy.hpp"
#include "save_policy.hpp"
#include "tensor.hpp"
#include "xtensor.hpp"
