#pragma once
// fault: data-parallel training that survives failures. Include this one header (it
// includes ckpt/ckpt.hpp).
//
//   communicators  Communicator concept, PeerFailure, ReduceOp          communicator.hpp
//                  ThreadComm / ThreadGroup / run_ranks (in-process)    thread_comm.hpp

#include "../ckpt/ckpt.hpp"
#include "communicator.hpp"
#include "thread_comm.hpp"
