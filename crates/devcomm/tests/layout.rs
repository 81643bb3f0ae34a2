//! Checks that `cuda/devcomm/handles.cuh`, compiled by the host C++ compiler, lays out every
//! struct exactly as Rust does (`devcomm::abi::layout()`). Needs `c++` (or `$CXX`) on PATH.

#[path = "common/cxx.rs"]
mod cxx;

use cxx::{assert_layout, compile_cpp, run_ok, scratch_dir};
use std::fmt::Write as _;
use std::process::Command;

/// Every shared struct's layout: the handles and the send/recv launch arguments.
fn layout() -> Vec<(&'static str, &'static str, usize, usize)> {
    devcomm::abi::layout()
}

#[test]
fn cpp_layout_equals_rust_layout() {
    assert_layout(
        "layout",
        &[
            "devcomm/handles.cuh",
            "devcomm/p2p.cuh",
            "devcomm/collective.cuh",
            "devcomm/reduce.cuh",
        ],
        &layout(),
    );
}

#[test]
fn layout_covers_every_shared_struct() {
    for strukt in [
        "ErrorRecord",
        "DeviceErrorState",
        "DeviceWindow",
        "DevicePeerTable",
        "RegisteredBuffer",
        "P2PSide",
        "P2PLaunch",
        "CollLaunch",
        "red::ReduceLaunch",
        "red::NetStep",
    ] {
        assert!(
            layout().iter().any(|(s, ..)| *s == strukt),
            "{strukt} missing from LAYOUT"
        );
    }
}

/// Runs `copy.cuh`'s `copy_bytes` on the host, with a stand-in for the CUDA built-ins and the
/// threads of a group run one after another (a copy has no intra-group communication: every
/// byte is written by exactly one thread). Checks every size up to 300 bytes and every pair of
/// src/dst misalignments mod 32, for groups of 1, 3 and 32 threads: the copy is exact and
/// touches nothing outside the destination.
const COPY_SIMULATION: &str = r#"
#define __CUDACC__ 1
#define __device__
#define __forceinline__ inline
#include <cstdio>
#include <cstring>
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
static Dim3 threadIdx, blockDim;
inline void __syncwarp(unsigned = 0xffffffffu) {}
inline int __any_sync(unsigned, int p) { return p; }
inline void __syncthreads() {}
inline int __syncthreads_or(int p) { return p; }
#include "devcomm/copy.cuh"

struct SimGroup {
  unsigned rank, n;
  unsigned thread_rank() const { return rank; }
  unsigned size() const { return n; }
};

int main() {
  alignas(64) static unsigned char src[512], dst[512], expect[512];
  for (int i = 0; i < 512; ++i) src[i] = (unsigned char)(i * 7 + 3);
  const unsigned groups[] = {1, 3, 32};
  for (unsigned n : groups)
    for (unsigned so = 0; so < 32; ++so)
      for (unsigned dof = 0; dof < 32; ++dof)
        for (unsigned bytes = 0; bytes <= 300; ++bytes) {
          std::memset(dst, 0xEE, sizeof dst);
          std::memset(expect, 0xEE, sizeof expect);
          std::memcpy(expect + 64 + dof, src + 64 + so, bytes);
          for (unsigned r = 0; r < n; ++r)
            devcomm::copy_bytes(SimGroup{r, n}, dst + 64 + dof, src + 64 + so, bytes);
          if (std::memcmp(dst, expect, sizeof dst) != 0) {
            std::printf("FAIL group=%u src_off=%u dst_off=%u bytes=%u\n", n, so, dof, bytes);
            return 1;
          }
        }
  std::printf("OK\n");
  return 0;
}
"#;

#[test]
fn copy_bytes_is_exact_for_every_size_and_alignment() {
    let dir = scratch_dir("copy-sim");
    let Some(binary) = compile_cpp(
        &dir,
        "copy_sim",
        COPY_SIMULATION,
        &["-O1", "-fno-strict-aliasing"],
    ) else {
        return;
    };
    run_ok(&binary);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The copy-engine protocol's pad words and side flags that the host uses (its own copies'
/// waits and writes, the pad's size, the flags it sets) are the kernels' (`devcomm/p2p.cuh`).
#[test]
fn copy_engine_constants_equal_the_kernels() {
    use devcomm::abi::{
        CE_DEC_R, CE_DEC_S, CE_DONE, CE_DONE_R, CE_GO, CE_GO_R, CE_SIZE, CE_SLOTS, CE_WORDS,
        P2P_SIDE_ANNOUNCE, P2P_SIDE_GATED, P2P_SIDE_PULL,
    };
    let pairs: [(&str, u64); 12] = [
        ("kCeWords", CE_WORDS as u64),
        ("kCeSlots", CE_SLOTS),
        ("kCeSize", CE_SIZE as u64),
        ("kCeGo", CE_GO as u64),
        ("kCeDone", CE_DONE as u64),
        ("kCeGoR", CE_GO_R as u64),
        ("kCeDoneR", CE_DONE_R as u64),
        ("kCeDecS", CE_DEC_S as u64),
        ("kCeDecR", CE_DEC_R as u64),
        ("kSidePull", u64::from(P2P_SIDE_PULL)),
        ("kSideGated", u64::from(P2P_SIDE_GATED)),
        ("kSideAnnounce", u64::from(P2P_SIDE_ANNOUNCE)),
    ];
    let mut src = String::from(
        "#include <cstdio>\n#include \"devcomm/handles.cuh\"\n#include \"devcomm/p2p.cuh\"\n\nint main() {\n",
    );
    for (name, _) in &pairs {
        writeln!(
            src,
            "  std::printf(\"{name} %llu\\n\", (unsigned long long)devcomm::{name});"
        )
        .unwrap();
    }
    src.push_str("  return 0;\n}\n");
    let dir = scratch_dir("ce-constants");
    let Some(binary) = compile_cpp(&dir, "ce_constants", &src, &["-Wall", "-Werror"]) else {
        return;
    };
    let output = Command::new(&binary).output().unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let expect: String = pairs.iter().map(|(n, v)| format!("{n} {v}\n")).collect();
    assert_eq!(stdout, expect, "C++ (left) and Rust (right) disagree");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The call word of `devcomm/call_word.cuh`, the one encoding of every family's call agreement
/// (send/recv, zero-copy, collectives, barriers; the reductions' fields are checked by
/// tests/reduce_loops.rs): what it packs, which call a ring word belongs to, and which field a
/// mismatch names, computed by the kernels' own functions compiled for the host.
#[test]
fn call_descriptor_packs_and_decides() {
    let src = r#"#include <cstdio>
#include "devcomm/handles.cuh"
#include "devcomm/p2p.cuh"
using namespace devcomm;
static void show(const char* what, unsigned long long v) { std::printf("%s %llu\n", what, v); }
// 0 when (kind, bytes) of call `call` agrees with word d in the payload bits of `mask`, else the
// field a mismatch names (agree.cuh, AgreeRecv::look).
static dc_u32 differs(dc_u64 d, dc_u32 kind, dc_u64 bytes, dc_u64 mask = kPayloadMask) {
  return call_differs(kind, call_word(0, kind, bytes), d, mask);
}
int main() {
  const dc_u64 d = call_word(5, kKindSendRecv, 1048581);
  show("bytes", field_value(d, kFieldP2PBytes));
  show("kind", field_value(d, kFieldKind));
  show("is5", call_word_is(d, 5));
  show("is1", call_word_is(d, 1));
  show("is9", call_word_is(d, 9));
  show("same", differs(d, kKindSendRecv, 1048581));
  show("smaller", differs(d, kKindSendRecv, 524291));
  show("zc", differs(d, kKindZeroCopy, 1048581));
  const dc_u64 w = call_word((1ull << 16) + 3, kKindZeroCopy, 7);
  show("wrap3", call_word_is(w, 3));
  show("wrapfull", call_word_is(w, (1ull << 16) + 3));
  show("wrapkind", field_value(w, kFieldKind));
  show("max", field_value(call_word(1, kKindSendRecv, kP2PBytesMask), kFieldP2PBytes) == kP2PBytesMask);
  show("empty1", call_word_is(0, 1));
  show("ring", kAgDesc + kAgRing <= kCeWords);
  // A stale ring word holds the call kAgRing before (or none): never the same number.
  show("stale", call_word_is(call_word(9000 - kAgRing, kKindSendRecv, 8), 9000));
  // A collective: operation above the wire bytes; all-to-all-v compares the operation only.
  const dc_u64 c = call_word(9, kKindCollective, coll_payload(1, 4096));
  show("coll_same", differs(c, kKindCollective, coll_payload(1, 4096)));
  show("coll_op", differs(c, kKindCollective, coll_payload(3, 4096)));
  show("coll_bytes", differs(c, kKindCollective, coll_payload(1, 8192)));
  show("coll_op_only", differs(c, kKindCollective, coll_payload(1, 0), kCollOpMask));
  show("coll_vs_p2p", differs(c, kKindSendRecv, 4096));
  show("value_op", field_value(coll_payload(3, 4096), kFieldCollOp));
  show("value_bytes", field_value(coll_payload(3, 4096), kFieldCollBytes));
  show("zc_unsized", differs(call_word(2, kKindZeroCopy, 64), kKindZeroCopy, 128, 0));
  show("vs_reduction", differs(call_word(2, kKindReduction, 64), kKindBarrier, 0));
  show("net_codes", kFieldKind == 1 && kFieldP2PBytes == 2 && kFieldCollOp == 3 &&
                        kFieldCollBytes == 4 && kFieldNetCall == 5);
  return 0;
}
"#;
    let dir = scratch_dir("call-descriptor");
    let Some(binary) = compile_cpp(&dir, "call_descriptor", src, &["-Wall", "-Werror"]) else {
        return;
    };
    let output = Command::new(&binary).output().unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let expect = "bytes 1048581\nkind 0\nis5 1\nis1 0\nis9 0\nsame 0\nsmaller 2\nzc 1\n\
                  wrap3 1\nwrapfull 1\nwrapkind 1\nmax 1\nempty1 0\nring 1\nstale 0\n\
                  coll_same 0\ncoll_op 3\ncoll_bytes 4\ncoll_op_only 0\ncoll_vs_p2p 1\n\
                  value_op 3\nvalue_bytes 4096\nzc_unsized 0\nvs_reduction 1\nnet_codes 1\n";
    assert_eq!(stdout, expect);
    // The host's largest message is the call word's.
    assert_eq!(devcomm::abi::AGREE_MAX_BYTES, (1u64 << 40) - 1);
    std::fs::remove_dir_all(&dir).unwrap();
}
