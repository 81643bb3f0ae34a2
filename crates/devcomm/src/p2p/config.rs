//! Launch knobs of send/recv and the table of defaults chosen by message size.
//!
//! Sender and receiver of one message must use the same protocol, block count and chunk size,
//! so everything here that the peer relies on is a function of the message size alone (never
//! of whether the call is one-way or both ways, nor of the other direction's size).
//!
//! The items live in the files of one concern each and are re-exported here: [`Protocol`] and
//! the guard (`protocol.rs`), the window geometry (`window.rs`), the kernels' shared words
//! (`crate::abi`), the configuration's switches (`switches.rs`), the size policy (`defaults.rs`) and the
//! sweep candidates (`sweep.rs`).

pub use super::defaults::*;
pub use super::protocol::{P2PConfig, Protocol, CE_MIN_CHUNK};
pub use super::sweep::sweep_configs;
pub use super::switches::Switches;
pub use super::window::{fit_to_sms, P2PLimits, LL128_MIN_PAYLOAD, MAX_ROLE_THREADS};
pub use crate::abi::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::p2p::window::{max_blocks_for_sms, resident_blocks};

    #[test]
    fn defaults_pass_the_guard_at_every_size() {
        let limits = P2PLimits::default();
        for shift in 0..=31 {
            for bytes in [(1u64 << shift) - 1, 1 << shift, (1 << shift) + 1] {
                let c = default_config(bytes, &limits, &Switches::default());
                c.check("test", bytes, &limits).unwrap();
            }
        }
    }

    #[test]
    fn small_messages_use_low_latency_and_large_ones_bulk() {
        let limits = P2PLimits::default();
        assert_eq!(
            default_config(8, &limits, &Switches::default()).protocol,
            Protocol::LowLatency
        );
        assert_eq!(default_config(8, &limits, &Switches::default()).blocks, 1);
        assert!(default_config(64 << 20, &limits, &Switches::default())
            .protocol
            .is_staged());
        // From CE_DEFAULT_MIN the copy-engine layout (negotiated per launch), unless turned off.
        let large = default_config(CE_DEFAULT_MIN, &limits, &Switches::default()).protocol;
        assert_eq!(large, Protocol::CopyEngine);
        assert!(
            default_config(CE_DEFAULT_MIN - 1, &limits, &Switches::default())
                .protocol
                .is_staged()
        );
        let no_ce = Switches {
            ce: false,
            ..Switches::default()
        };
        assert!(default_config(CE_DEFAULT_MIN, &limits, &no_ce)
            .protocol
            .is_staged());
        // The protocol only moves forward as the size grows: LL, then LL128, then staged.
        let rank = |p: Protocol| match p {
            Protocol::LowLatency => 0,
            Protocol::LowLatency128 => 1,
            _ => 2,
        };
        let mut last = 0;
        for b in (1u64..=(64 << 20)).step_by(4099) {
            let r = rank(default_config(b, &limits, &Switches::default()).protocol);
            assert!(r >= last, "{b} bytes goes back to an earlier protocol");
            last = r;
        }
        assert_eq!(last, 2);
        let c = default_config(1 << 20, &limits, &Switches::default());
        assert_eq!(c.protocol, Protocol::LowLatency128);
        assert!(c.blocks >= 1 && c.blocks <= limits.max_blocks);
        let no_ll128 = Switches {
            ll128: false,
            ..Switches::default()
        };
        assert!(default_config(1 << 20, &limits, &no_ll128)
            .protocol
            .is_staged());
    }

    #[test]
    fn window_fits_the_smallest_gpu() {
        let limits = P2PLimits::default();
        // An H200 (132 SMs) keeps the default; so does a half share of one (66).
        assert_eq!(fit_to_sms(limits, false, 132).unwrap(), limits);
        assert_eq!(fit_to_sms(limits, false, 66).unwrap().max_blocks, 32);
        assert_eq!(resident_blocks(32), 66);
        // A quarter share (33 SMs): the default shrinks to 15 blocks, 32 resident at most.
        let quarter = fit_to_sms(limits, false, 33).unwrap();
        assert_eq!(quarter.max_blocks, 15);
        assert_eq!(
            P2PLimits {
                max_blocks: 15,
                ..limits
            },
            quarter
        );
        assert!(resident_blocks(quarter.max_blocks) <= 33);
        // Every default configuration then fits the smaller window.
        for shift in 0..=30 {
            let c = default_config(1u64 << shift, &quarter, &Switches::default());
            c.check("send", 1u64 << shift, &quarter).unwrap();
        }
        // Asked for explicitly, too many blocks are refused with the numbers to use.
        let err = fit_to_sms(limits, true, 33).unwrap_err().to_string();
        assert!(
            err.contains("66 SMs") && err.contains("at most 15"),
            "{err}"
        );
        assert!(fit_to_sms(
            P2PLimits {
                max_blocks: 15,
                ..limits
            },
            true,
            33
        )
        .is_ok());
        // Fewer than 4 SMs cannot hold two roles and a pacing block.
        assert!(fit_to_sms(limits, false, 3).is_err());
        assert_eq!(max_blocks_for_sms(4), Some(1));
        assert_eq!(max_blocks_for_sms(5), Some(1));
        assert_eq!(max_blocks_for_sms(6), Some(2));
    }

    #[test]
    fn guard_refuses_what_the_window_cannot_hold() {
        let limits = P2PLimits::default();
        let mut c = default_config(1 << 30, &limits, &Switches::default());
        c.blocks = limits.max_blocks + 1;
        assert!(c
            .check("send", 1 << 30, &limits)
            .unwrap_err()
            .to_string()
            .contains("blocks"));
        let mut c = staged_config(1 << 30, &limits);
        c.chunk_bytes = limits.slot_bytes * 2;
        assert!(matches!(
            c.check("send", 1 << 30, &limits),
            Err(Error::CapacityExceeded { .. })
        ));
        let mut c = default_config(8, &limits, &Switches::default());
        c.protocol = Protocol::LowLatency;
        assert!(matches!(
            c.check("send", limits.ll_max_bytes + 1, &limits),
            Err(Error::CapacityExceeded { .. })
        ));
        c.protocol = Protocol::LowLatency128;
        c.check("send", limits.ll128_max_bytes, &limits).unwrap();
        assert!(matches!(
            c.check("send", limits.ll128_max_bytes + 1, &limits),
            Err(Error::CapacityExceeded { .. })
        ));
    }

    #[test]
    fn region_layout_holds_staging_and_both_parities() {
        let l = P2PLimits::default();
        assert_eq!(l.max_channels(), 512);
        assert_eq!(l.ll_offset(), 512 * 4 * (32 << 10));
        assert!(l.region_bytes() >= l.ll_offset() + 4 * l.ll_max_bytes);
        // LL128 lines follow the LL lines, 128-byte aligned, and fill the region (the kernel
        // derives their size from region_bytes): the largest message of 16-byte units fits
        // with a line of rounding per block.
        let ll128_offset = l.ll_offset() + 2 * l.ll_parity_bytes();
        assert_eq!(ll128_offset % 128, 0);
        assert_eq!(
            (l.region_bytes() - ll128_offset) / 2,
            l.ll128_parity_bytes()
        );
        let lines = l.ll128_max_bytes.div_ceil(LL128_MIN_PAYLOAD) + u64::from(l.max_blocks);
        assert!(l.ll128_parity_bytes() >= 128 * lines);
        assert_eq!(l.count_slot0(4), 4 * (2 * 512 + 32));
        assert_eq!(l.zc_slot0(4), 4 * (2 * 512 + 32) + 16);
        assert_eq!(l.mode_slot0(4), 4 * (2 * 512 + 32) + 16 + 4 * (4 + 32));
        assert_eq!(l.ce_slot0(4), l.mode_slot0(4) + 4 * 512 * 4);
        assert_eq!(l.signal_slots(4), l.ce_slot0(4) + 4 * CE_WORDS);
        // Copy-engine slots of 32 MiB: the even ones overlay the push staging (64 MiB), the
        // odd ones the outbox (as large).
        assert_eq!(l.ce_slot_bytes(), 32 << 20);
        for i in 0..CE_SLOTS as usize {
            assert!(l.ce_slot_offset(i) + l.ce_slot_bytes() <= l.ll_offset());
            assert_eq!(ce_pulled(i), i % 2 == 1);
        }
        assert_eq!(l.outbox_offset(4, 0), 4 * l.region_bytes());
        assert_eq!(
            l.outbox_offset(4, 3),
            4 * l.region_bytes() + 3 * l.ll_offset()
        );
        // Regions per sender, then outboxes per receiver of the same staging size.
        assert_eq!(l.window_bytes(4), 4 * l.region_bytes() + 4 * l.ll_offset());
    }

    #[test]
    fn copy_engine_configs_pass_or_fail_the_guard_as_documented() {
        let l = P2PLimits::default();
        for bytes in [1u64, 4 << 20, 64 << 20, 1 << 30, (1 << 30) + 7] {
            ce_config(bytes, &l).check("test", bytes, &l).unwrap();
            for c in sweep_configs(bytes, &l) {
                c.check("test", bytes, &l).unwrap();
            }
        }
        let ok = ce_config(1 << 30, &l);
        let with = |chunk_bytes: u64, threads: u32| P2PConfig {
            chunk_bytes,
            threads,
            ..ok
        };
        assert!(with(l.ce_slot_bytes() + 256, 512)
            .check("t", 1 << 30, &l)
            .is_err());
        assert!(with(CE_MIN_CHUNK - 256, 512)
            .check("t", 1 << 30, &l)
            .is_err());
        assert!(with(CE_MIN_CHUNK + 16, 512)
            .check("t", 1 << 30, &l)
            .is_err());
        assert!(with(CE_MIN_CHUNK, 384).check("t", 1 << 30, &l).is_err());
        with(CE_MIN_CHUNK, 256).check("t", 1 << 30, &l).unwrap();
        // Copy-engine chunks of half a slot at every size the defaults use it.
        assert_eq!(ce_config(1 << 30, &l).chunk_bytes, l.ce_slot_bytes() / 2);
    }

    #[test]
    fn bulk_pulls_one_way_from_the_threshold_and_pushes_both_ways() {
        assert!(!pull_by_default(PULL_MIN_BYTES - 1, false, None));
        assert!(pull_by_default(PULL_MIN_BYTES, false, None));
        assert!(pull_by_default(1 << 30, false, None));
        assert!(!pull_by_default(1 << 30, true, None));
        assert!(pull_by_default(8, true, Some(true)));
        assert!(!pull_by_default(1 << 30, false, Some(false)));
    }

    #[test]
    fn zero_copy_blocks_grow_with_the_size_within_the_signal_slots() {
        let limits = P2PLimits::default();
        assert_eq!(zero_copy_blocks(0, &limits, &Switches::default()), 1);
        assert_eq!(zero_copy_blocks(64 << 10, &limits, &Switches::default()), 1);
        assert_eq!(
            zero_copy_blocks((64 << 10) + 1, &limits, &Switches::default()),
            2
        );
        assert_eq!(zero_copy_blocks(1 << 20, &limits, &Switches::default()), 16);
        assert_eq!(zero_copy_blocks(1 << 30, &limits, &Switches::default()), 16);
        let small = P2PLimits {
            max_blocks: 4,
            ..limits
        };
        assert_eq!(zero_copy_blocks(1 << 30, &small, &Switches::default()), 4);
    }

    #[test]
    fn zero_copy_route_by_size() {
        let limits = P2PLimits::default();
        let sw = Switches::default();
        let route = |b| zero_copy_route(b, &limits, &sw);
        assert_eq!(route(0), ZcRoute::Staged);
        assert_eq!(route(limits.ll_max_bytes), ZcRoute::Staged);
        assert_eq!(route(limits.ll_max_bytes + 1), ZcRoute::Staged);
        assert_eq!(route(ZC_CE_MIN_BYTES - 1), ZcRoute::Staged);
        assert_eq!(route(ZC_CE_MIN_BYTES), ZcRoute::CopyEngine);
        assert_eq!(route(1 << 30), ZcRoute::CopyEngine);
        let blocks = Switches {
            zc_staged: false,
            zc_ce_min: u64::MAX,
            ..Switches::default()
        };
        assert_eq!(
            zero_copy_route(1 << 30, &limits, &blocks),
            ZcRoute::Blocks(16)
        );
    }

    #[test]
    fn every_sweep_candidate_passes_the_guard() {
        let limits = P2PLimits::default();
        for shift in 0..=30 {
            let bytes = 1u64 << shift;
            let all = sweep_configs(bytes, &limits);
            assert!(!all.is_empty(), "no candidate at {bytes}");
            for c in all {
                c.check("sweep", bytes, &limits).unwrap();
            }
        }
    }
}
