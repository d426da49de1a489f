#pragma once
// fault: data-parallel training that survives failures. Include this one header (it
// includes ckpt/ckpt.hpp and nn/nn.hpp).
//
//   backends       Backend concept, Cpu, AscendModel (UCE simulation)   backend.hpp
//   communicators  Communicator, ShrinkableCommunicator, RecoverableCommunicator concepts,
//                  PeerFailure, Interrupted, ReduceOp                   communicator.hpp
//                  ThreadComm / ThreadGroup / run_ranks (in-process)    thread_comm.hpp
//   data parallel  DataParallelOptimizer, phase reports, broadcast_parameters  data_parallel.hpp
//                  ShardLayout, OptimizerShard, ShardedOptimizer (optimizer-state sharding)
//   last words     LastWordsCheckpoint, LastWordsOptions, latest_last_words  last_words.hpp
//                  ReplicaSelector: LowestHealthyRank, PreferenceOrder, AvoidRanks  replica_selector.hpp
//   UCE repair     UceRepair, UceRepairOptions, RepairFailed, attach, InjectUce  uce_repair.hpp
//   preemption     TerminationSignals, Preempted                        termination.hpp
//   stores         Store, FileStore, PrefixStore, StoreError            store.hpp
//   membership     Membership (node ids, liveness, cooldown), Generation  membership.hpp
//   launching      LaunchEnv, launch_env (RANK, WORLD_SIZE, CKPT_STORE, MS_* aliases)  launch.hpp
//   cluster        agree_on_checkpoint (the newest step every rank holds)  cluster_recovery.hpp
//   memory level   MemoryLevel, MemoryCheckpoint, PackedState (copies in partners' RAM)  memory_level.hpp
//                  DieInTransfer (a rank killed mid-transfer, for tests)  die_in_transfer.hpp
//   resharding     commit_global_index, GlobalIndexer, latest_global_index (a step's index
//                  of every rank's pieces, for ckpt::load_resharded on another layout)  global_index.hpp
//
// Ranks as processes, on one host or several (not included here: they need Gloo and hiredis,
// target ckpt::gloo):
//   GlooComm, GlooOptions, open_store("file:///dir" | "redis://host:port")  gloo_comm.hpp
//   RedisStore                                                          redis_store.hpp
// Ranks under mpirun (not included here: they need MPI, target ckpt::mpi):
//   MpiSession, MpiComm, MpiOptions                                     mpi_comm.hpp

#include "../ckpt/ckpt.hpp"
#include "../nn/nn.hpp"
#include "backend.hpp"
#include "cluster_recovery.hpp"
#include "communicator.hpp"
#include "data_parallel.hpp"
#include "die_in_transfer.hpp"
#include "elastic.hpp"
#include "global_index.hpp"
#include "last_words.hpp"
#include "launch.hpp"
#include "membership.hpp"
#include "memory_level.hpp"
#include "replica_parallel.hpp"
#include "replica_selector.hpp"
#include "store.hpp"
#include "termination.hpp"
#include "thread_comm.hpp"
#include "uce_repair.hpp"
