//! The planner's block pieces (`reduce::plan::block_piece`) and the kernels' (`block_piece`
//! in `cuda/devcomm/reduce.cuh`, compiled by the host C++ compiler) cut every message alike:
//! both ends of every transfer derive their ranges from them. Needs `c++` (or `$CXX`).

#[allow(dead_code)] // run_ok: this test reads the program's output itself
#[path = "common/cxx.rs"]
mod cxx;

use cxx::{compile_cpp, scratch_dir};
use devcomm::reduce::plan::{block_piece, MAX_BLOCKS};
use std::process::Command;

const MS: &[u64] = &[0, 1, 7, 16, 17, 1000, 4096, 65_537, 1 << 20, (1 << 21) + 3];
const UNITS: &[u64] = &[1, 2, 4, 8, 16, 1000, 4096];

#[test]
fn device_and_host_pieces_agree() {
    let dir = scratch_dir("reduce_pieces");
    let ms = MS
        .iter()
        .map(|m| format!("{m}ULL"))
        .collect::<Vec<_>>()
        .join(", ");
    let units = UNITS
        .iter()
        .map(|u| format!("{u}ULL"))
        .collect::<Vec<_>>()
        .join(", ");
    let source = format!(
        r#"#include <cstdio>
#include "devcomm/reduce.cuh"
int main() {{
  const unsigned long long ms[] = {{{ms}}};
  const unsigned long long units[] = {{{units}}};
  for (unsigned long long m : ms)
    for (unsigned long long unit : units)
      for (unsigned blocks = 1; blocks <= 33; ++blocks)
        for (unsigned b = 0; b < blocks; ++b) {{
          dc_u64 lo, hi;
          devcomm::red::block_piece(m, blocks, unit, b, lo, hi);
          std::printf("%llu %llu\n", (unsigned long long)lo, (unsigned long long)hi);
        }}
  std::printf("slot %llu\n",
              (unsigned long long)devcomm::red::slot_of(devcomm::red::kDone, 3, 2, 5));
  return 0;
}}
"#
    );
    let Some(binary) = compile_cpp(&dir, "reduce_pieces", &source, &["-Wall", "-Werror"]) else {
        return;
    };
    let out = Command::new(&binary).output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut lines = stdout.lines();
    let mut compared = 0;
    for &m in MS {
        for &unit in UNITS {
            for blocks in 1..=33u32 {
                for b in 0..blocks {
                    let (lo, hi) = block_piece(m, blocks, unit, b);
                    assert_eq!(
                        lines.next(),
                        Some(format!("{lo} {hi}").as_str()),
                        "m {m}, unit {unit}, blocks {blocks}, block {b} (left: C++)"
                    );
                    compared += 1;
                }
            }
        }
    }
    // kDone = 3: ((3 * world 3 + rank 2) * MAX_BLOCKS (kMaxBlocks) blocks) + block 5.
    let slot = format!("slot {}", (3 * 3 + 2) * u64::from(MAX_BLOCKS) + 5);
    assert_eq!(lines.next(), Some(slot.as_str()));
    assert!(compared > 30_000);
    std::fs::remove_dir_all(&dir).unwrap();
}
