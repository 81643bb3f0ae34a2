//! `libdevcomm_nccl.so`: NCCL 2.28's C ABI on devcomm's public API (docs/NCCL.md).
//!
//! A program linked against NCCL (through `LD_PRELOAD`, or loading this library by path as
//! vLLM's `VLLM_NCCL_SO_PATH` does) gets devcomm's all-reduce, reduce-scatter, all-gather,
//! all-to-all and send/recv on NVLink-only jobs; every other call, and every call devcomm
//! cannot answer (a type, an operator, a job with network peers), goes to the real NCCL,
//! loaded by path, through a communicator created beside devcomm's.
//!
//! | module | concern |
//! |---|---|
//! | [`ffi`] | `nccl.h`'s types and values |
//! | [`unique_id`] | the 128-byte id: store address and secret token |
//! | [`comm`] | the communicator behind an `ncclComm_t`, its registry, init and teardown |
//! | [`split`] | `ncclCommSplit` |
//! | [`route`] | which calls devcomm answers (a pure function) |
//! | [`fallback`] | the real NCCL, loaded by path |
//! | [`group`] | group semantics, send/recv of a group |
//! | [`p2p_schedule`] | the order of a group's sends and recvs (a pure function) |
//! | [`window`] | NCCL's windows adopted into devcomm's memory pool |
//! | [`error`] | result codes and the last error's text |
//! | `api_comm`, `api_ops` | the exported functions |
#![warn(missing_docs)]

pub mod api_comm;
pub mod api_ops;
pub mod comm;
pub mod error;
pub mod fallback;
pub mod ffi;
pub mod group;
pub mod p2p_schedule;
pub mod route;
pub mod split;
pub mod unique_id;
pub mod window;
