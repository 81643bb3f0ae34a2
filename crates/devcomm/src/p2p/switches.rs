//! The send/recv switches of a communicator, taken from its [`Config`] once when it is built
//! (docs/CONFIG.md, groups "send/recv protocol", "zero-copy" and "kernels"). `plan::plan`
//! and the size policy take them as arguments, so every decision stays a pure function.

use crate::config::{Auto, Config};

/// What the configuration says about send/recv decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switches {
    /// The defaults may use LL128 (`DEVCOMM_P2P_LL128`).
    pub ll128: bool,
    /// The defaults may use the copy engine from 256 MiB (`DEVCOMM_P2P_CE`).
    pub ce: bool,
    /// Bulk messages forced to pull (`Some(true)`) or push; `None`: the size decides
    /// (`DEVCOMM_P2P_PULL`).
    pub pull: Option<bool>,
    /// [send role by SMs, receive role by SMs] of an explicit copy-engine message sent and
    /// received with one peer in a launch (`DEVCOMM_P2P_CE_BOTH`).
    pub ce_both: [bool; 2],
    /// Both directions in blocks of their own (`DEVCOMM_P2P_SPLIT`).
    pub split: bool,
    /// The split kernel's roles take blocks in turn (`DEVCOMM_P2P_INTERLEAVE`).
    pub interleave: bool,
    /// Copy streams for pushed copy-engine chunks (`DEVCOMM_P2P_CE_STREAMS`).
    pub ce_streams: usize,
    /// Smallest zero-copy message the copy engine moves; `u64::MAX`: never
    /// (`DEVCOMM_ZC_CE_MIN`).
    pub zc_ce_min: u64,
    /// Mid-size zero-copy messages take the staged path (`DEVCOMM_ZC_STAGED`).
    pub zc_staged: bool,
    /// Most blocks of a zero-copy message moved by SM blocks (`DEVCOMM_ZC_BLOCKS`).
    pub zc_blocks: u64,
}

impl Switches {
    /// The switches a configuration gives.
    pub fn from_config(c: &Config) -> Self {
        Self {
            ll128: c.p2p_ll128,
            ce: c.p2p_ce,
            pull: match c.p2p_pull {
                Auto::Auto => None,
                Auto::Forced(pull) => Some(pull),
            },
            ce_both: [c.p2p_ce_both.send_by_sm, c.p2p_ce_both.recv_by_sm],
            split: c.p2p_split,
            interleave: c.p2p_interleave,
            ce_streams: c.p2p_ce_streams as usize,
            zc_ce_min: c.zc_ce_min.0.unwrap_or(u64::MAX),
            zc_staged: c.zc_staged,
            zc_blocks: u64::from(c.zc_blocks),
        }
    }
}

impl Default for Switches {
    /// What the default configuration gives.
    fn default() -> Self {
        Self::from_config(&Config::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CeBoth;

    #[test]
    fn switches_follow_the_configuration() {
        let mut c = Config::default();
        let d = Switches::from_config(&c);
        assert_eq!(
            (d.ce_both, d.pull, d.zc_ce_min),
            ([true, false], None, 64 << 20)
        );
        c.p2p_ce_both = CeBoth {
            send_by_sm: false,
            recv_by_sm: true,
        };
        c.p2p_pull = Auto::Forced(false);
        c.zc_ce_min = crate::config::BytesOrOff(None);
        let s = Switches::from_config(&c);
        assert_eq!(
            (s.ce_both, s.pull, s.zc_ce_min),
            ([false, true], Some(false), u64::MAX)
        );
    }
}
