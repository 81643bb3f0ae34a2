//! One owner for configuration: every knob of the library, with its environment variable,
//! type, default, allowed range, whether the ranks must agree on it, and one line of doc.
//!
//! A [`Config`] is built once, from the environment ([`Config::from_env`]) or in code
//! (`Config::default()` and then its fields), validated ([`Config::validate`]), and passed down
//! to the communicator ([`crate::CommBuilder::config`]); nothing else in the library reads the
//! environment (the torchrun-style rank variables stay in `devcomm_bootstrap`). A bad value is
//! an error naming the variable and what it allows. At setup the ranks compare the knobs that
//! must agree (`agree`): a difference is [`crate::Error::Setup`] naming the knob and the
//! ranks. docs/CONFIG.md is generated from the table here ([`Config::markdown`]); a test fails
//! when the two differ.

pub(crate) mod agree;
mod value;

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
pub use value::{Auto, BytesOrOff, CeBoth};
use value::{Range, Value};

/// Whether every rank must hold the same value of a knob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    /// Each rank may choose its own value (a local bound or a local layout).
    Local,
    /// Every rank must hold the same value: both ends of a transfer derive their plan from it.
    /// Compared at setup.
    Must,
}

/// The description of one knob (one row of docs/CONFIG.md).
#[derive(Debug, Clone, Copy)]
pub struct Knob {
    /// The environment variable.
    pub env: &'static str,
    /// The [`Config`] field.
    pub field: &'static str,
    /// The group it is listed under.
    pub group: &'static str,
    /// The value's type as docs/CONFIG.md names it.
    pub ty: &'static str,
    /// The default, as text.
    pub default: &'static str,
    /// The accepted range of a number (`None`: any value of the type).
    range: Option<Range>,
    /// Whether the ranks must agree.
    pub agreement: Agreement,
    /// Knobs for experiments only (kernel constants, A/B switches), not for production use.
    pub experimental: bool,
    /// One line of doc.
    pub doc: &'static str,
}

impl Knob {
    /// The accepted values, as docs/CONFIG.md prints them.
    pub fn allowed(&self) -> String {
        match self.range {
            Some(r) => format!("{}-{}", r.lo, r.hi),
            None => self.ty.to_owned(),
        }
    }
}

const fn range(lo: u64, hi: u64) -> Option<Range> {
    Some(Range { lo, hi })
}

macro_rules! knobs {
    ($(
        $(#[doc = $doc:literal])+
        $field:ident : $ty:ty = $default:expr, $default_text:literal,
        env $env:literal, group $group:literal, range $range:expr, $agreement:ident $(, $exp:ident)?;
    )*) => {
        /// Every knob of the library, its default and its documentation: one place, one
        /// declaration each (docs/CONFIG.md lists them). Build it with
        /// [`Config::from_env`] or `Config::default()`, change fields in code, and hand it to
        /// [`crate::CommBuilder::config`], which validates it.
        #[derive(Debug, Clone, PartialEq)]
        #[non_exhaustive]
        pub struct Config {
            $( $(#[doc = $doc])+ pub $field: $ty, )*
        }

        impl Default for Config {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        /// Every knob, in the order of docs/CONFIG.md.
        pub const KNOBS: &[Knob] = &[ $( Knob {
            env: $env,
            field: stringify!($field),
            group: $group,
            ty: <$ty as Value>::TYPE,
            default: $default_text,
            range: $range,
            agreement: Agreement::$agreement,
            experimental: knobs!(@exp $($exp)?),
            doc: concat!($($doc),+),
        }, )* ];

        impl Config {
            /// Sets the knob read from `env` to `text` (trimmed; empty means unset).
            fn set(&mut self, knob: &Knob, text: &str) -> std::result::Result<(), String> {
                match knob.env {
                    $( $env => self.$field = <$ty as Value>::parse(text, knob.range)?, )*
                    _ => unreachable!("a knob of the table"),
                }
                Ok(())
            }

            /// The knob's value as text (what the ranks compare).
            pub(crate) fn show(&self, knob: &Knob) -> String {
                match knob.env {
                    $( $env => <$ty as Value>::show(&self.$field), )*
                    _ => unreachable!("a knob of the table"),
                }
            }
        }
    };
    (@exp experimental) => { true };
    (@exp) => { false };
}

knobs! {
    /// Bound of every device wait: a peer silent this long is an error naming it.
    device_timeout: Duration = Duration::from_millis(10_000), "10000",
        env "DEVCOMM_TIMEOUT_MS", group "timeouts", range range(1, 86_400_000), Local;
    /// Bound of every host setup step (store waits, agreements, kernel load gates).
    setup_timeout: Duration = Duration::from_millis(120_000), "120000",
        env "DEVCOMM_SETUP_TIMEOUT_MS", group "timeouts", range range(1, 86_400_000), Local;

    /// Forced link kinds for tests, e.g. `0-3=net,1-*=shm` (docs/ARCHITECTURE.md, Topology).
    topology_override: Option<String> = None, "",
        env "DEVCOMM_TOPOLOGY_OVERRIDE", group "topology", range None, Must;
    /// Turns every same-host NVLink peer into `shm` (no peer access).
    disable_p2p: bool = false, "0",
        env "DEVCOMM_DISABLE_P2P", group "topology", range None, Must;
    /// Lets several ranks share one GPU, for functional tests only (docs/TESTING.md).
    share_gpu: bool = false, "0",
        env "DEVCOMM_SHARE_GPU", group "topology", range None, Must;

    /// Bytes of a send/recv staging slot, in KiB (the largest chunk).
    p2p_slot_kib: u32 = 32, "32",
        env "DEVCOMM_P2P_SLOT_KIB", group "send/recv window", range range(1, 1024), Must;
    /// Staging slots per channel (pipeline depth).
    p2p_depth: u32 = 4, "4",
        env "DEVCOMM_P2P_DEPTH", group "send/recv window", range range(2, 16), Must;
    /// Most blocks per direction; unset: 32, lowered to fit a GPU with few SMs.
    p2p_max_blocks: Option<u32> = None, "32 (fitted)",
        env "DEVCOMM_P2P_MAX_BLOCKS", group "send/recv window", range range(1, 64), Must;

    /// `0` keeps the 128-byte flag-in-data lines (LL128) out of the defaults.
    p2p_ll128: bool = true, "1",
        env "DEVCOMM_P2P_LL128", group "send/recv protocol", range None, Must;
    /// `0` keeps messages from 256 MiB off the copy-engine layout (docs/PROTOCOL.md).
    p2p_ce: bool = true, "1",
        env "DEVCOMM_P2P_CE", group "send/recv protocol", range None, Must;
    /// Engines of an explicit copy-engine message sent and received with one peer in a launch.
    p2p_ce_both: CeBoth = CeBoth::default(), "sm-ce",
        env "DEVCOMM_P2P_CE_BOTH", group "send/recv protocol", range None, Local, experimental;
    /// Copy streams for pushed copy-engine chunks (2 for comparison only).
    p2p_ce_streams: u32 = 1, "1",
        env "DEVCOMM_P2P_CE_STREAMS", group "send/recv protocol", range range(1, 2), Local, experimental;
    /// Push (`0`) or pull (`1`) staging for the bulk messages this rank sends; `auto` by size.
    p2p_pull: Auto = Auto::Auto, "auto",
        env "DEVCOMM_P2P_PULL", group "send/recv protocol", range None, Local;
    /// `0` runs both directions in one block per index instead of blocks of their own.
    p2p_split: bool = true, "1",
        env "DEVCOMM_P2P_SPLIT", group "send/recv protocol", range None, Local, experimental;
    /// `0` gives the split kernel's roles runs of blocks instead of blocks in turn.
    p2p_interleave: bool = true, "1",
        env "DEVCOMM_P2P_INTERLEAVE", group "send/recv protocol", range None, Local, experimental;

    /// Smallest registered message moved by the sender's copy engine; `off` never.
    zc_ce_min: BytesOrOff = BytesOrOff(Some(64 << 20)), "67108864",
        env "DEVCOMM_ZC_CE_MIN", group "zero-copy", range None, Must;
    /// `0` moves mid-size registered messages by SM blocks straight into the peer.
    zc_staged: bool = true, "1",
        env "DEVCOMM_ZC_STAGED", group "zero-copy", range None, Must;
    /// Most blocks of a registered message moved by SM blocks.
    zc_blocks: u32 = 16, "16",
        env "DEVCOMM_ZC_BLOCKS", group "zero-copy", range range(1, 64), Must;

    /// Own-chunk KiB per block of the collectives' own-chunk role; `0`: as many as a peer.
    coll_self_block_kib: u64 = 128, "128",
        env "DEVCOMM_COLL_SELF_BLOCK_KIB", group "collectives", range range(0, 1 << 20), Must, experimental;
    /// `0` keeps the full grid for small all-to-alls.
    coll_fit_grid: bool = true, "1",
        env "DEVCOMM_COLL_FIT_GRID", group "collectives", range None, Must, experimental;

    /// Most blocks of a reduction; unset: 32, 64 for the staged two-shot and calls on lines,
    /// at most half the smallest GPU's SMs; 128 for pipelined calls of 4 rounds or more (128
    /// MiB on 4 ranks), at most all but 4 SMs. Set it lower to leave SMs to compute kernels
    /// that overlap large reductions.
    reduce_max_blocks: Option<u32> = None, "32/64/128 (fitted)",
        env "DEVCOMM_REDUCE_MAX_BLOCKS", group "reductions", range range(1, 128), Must;
    /// KiB of a two-shot round that one block reduces: the block count grows with the size
    /// by this step (up to the most blocks).
    reduce_block_kib: u32 = 16, "16",
        env "DEVCOMM_REDUCE_BLOCK_KIB", group "reductions", range range(1, 1 << 20), Must, experimental;
    /// Most blocks of a reduction on lines: the two-shot on lines takes this many, the one-shot
    /// one per 4 KiB of a sender's payload from 32 up to this (at most half the smallest GPU's
    /// SMs).
    reduce_one_shot_blocks: u32 = 64, "64",
        env "DEVCOMM_REDUCE_ONE_SHOT_BLOCKS", group "reductions", range range(1, 64), Must, experimental;
    /// Largest one-shot reduction payload in KiB (`0`: never); unset: 1024 on 2 ranks, 512 on
    /// 3-4, else 32.
    reduce_one_shot_kib: Option<u32> = None, "by ranks",
        env "DEVCOMM_REDUCE_ONE_SHOT_KIB", group "reductions", range range(0, 4096), Must, experimental;
    /// Largest all-reduce in KiB above the one-shot that takes the two-shot on LL128 lines
    /// (`0`: never); unset: 4096 on 3 ranks or more, 0 on 2.
    reduce_line_two_shot_kib: Option<u32> = None, "by ranks",
        env "DEVCOMM_REDUCE_LINE_TWO_SHOT_KIB", group "reductions", range range(0, 1 << 20), Must, experimental;
    /// Largest all-reduce in KiB that takes the zero-copy one-shot on pool buffers; unset:
    /// 1024/256/64 by ranks.
    reduce_zero_copy_one_shot_kib: Option<u32> = None, "by ranks",
        env "DEVCOMM_REDUCE_ZERO_COPY_ONE_SHOT_KIB", group "reductions", range range(0, 1 << 20), Must, experimental;
    /// Largest call in KiB on pool buffers that takes the line one-shot instead of the
    /// zero-copy paths (within the line one-shot's payload); unset: 256.
    reduce_zero_copy_min_kib: Option<u32> = None, "256",
        env "DEVCOMM_REDUCE_ZERO_COPY_MIN_KIB", group "reductions", range range(0, 1 << 20), Must, experimental;
    /// `0`: reductions on pool buffers take the staged paths too (the zero-copy paths need
    /// every rank's buffers at the same place of the pool: ranks that allocate in different
    /// orders set it).
    reduce_zero_copy: bool = true, "1",
        env "DEVCOMM_REDUCE_ZERO_COPY", group "reductions", range None, Must;
    /// MiB one two-shot reduction round stages per rank (the window holds two rounds); unset:
    /// 64 on 2 ranks, else 32.
    reduce_chunk_mib: Option<u32> = None, "by ranks",
        env "DEVCOMM_REDUCE_CHUNK_MIB", group "reductions", range range(1, 256), Must, experimental;
    /// `0`: MoE dispatch and combine between NVLink peers go through the all-to-all-v (the path
    /// network peers take) instead of writing rows and sums straight into the peers' memory;
    /// both give the same bits (docs/MOE.md, "How it runs").
    moe_direct: bool = true, "1",
        env "DEVCOMM_MOE_DIRECT", group "moe", range None, Must;
    /// MiB of the memory pool's first segment, grown when the communicator is built (`0`:
    /// none until `grow_pool`); pool allocations come from its segments.
    pool_mib: u32 = 0, "0",
        env "DEVCOMM_POOL_MIB", group "memory", range range(0, 1 << 20), Must;
    /// `0` launches kernels without programmatic dependent launch.
    pdl: bool = true, "1",
        env "DEVCOMM_PDL", group "launch", range None, Local;

    /// `1` compiles every kernel with timeline events and records them (docs/TRACING.md).
    trace: bool = false, "0",
        env "DEVCOMM_TRACE", group "tracing", range None, Must;
    /// Events the trace ring of a rank holds (32 bytes each); later events are dropped, counted.
    trace_events: u32 = 1 << 20, "1048576",
        env "DEVCOMM_TRACE_EVENTS", group "tracing", range range(16, 1 << 26), Local;

    /// A send/recv tuning table from `devcomm tune` (its content is compared across ranks).
    tune_file: Option<PathBuf> = None, "",
        env "DEVCOMM_TUNE_FILE", group "tuning", range None, Local;
    /// A reduction tuning table from `devcomm tune --op all_reduce,...` (its content is
    /// compared across ranks); unset: the built-in table of the GPU model and world size.
    reduce_tune_file: Option<PathBuf> = None, "",
        env "DEVCOMM_REDUCE_TUNE_FILE", group "tuning", range None, Local;
    /// `0` leaves out the reduction tables built into the library (docs/TUNING.md).
    reduce_tune_builtin: bool = true, "1",
        env "DEVCOMM_REDUCE_TUNE_BUILTIN", group "tuning", range None, Must;

    /// Kernel cache directory; unset: `$HOME/.cache/devcomm/kernels`.
    cache_dir: Option<PathBuf> = None, "",
        env "DEVCOMM_CACHE_DIR", group "kernels", range None, Local;
    /// Dumps each compiled kernel's source, PTX and cubin here.
    dump_dir: Option<PathBuf> = None, "",
        env "DEVCOMM_DUMP_DIR", group "kernels", range None, Local;

    /// Where libucp is (a file, or the directory holding it); unset: the loader's search.
    ucx_lib: Option<PathBuf> = None, "",
        env "DEVCOMM_UCX_LIB", group "network", range None, Local;
    /// KiB of payload per network staging slot (the chunk one descriptor moves).
    net_slot_kib: u32 = 1024, "1024",
        env "DEVCOMM_NET_SLOT_KIB", group "network", range range(1, 65536), Must;
    /// Staging slots per network peer and direction (chunks in flight).
    net_slots: u32 = 4, "4",
        env "DEVCOMM_NET_SLOTS", group "network", range range(2, 64), Must;
    /// MiB of device scratch of the reductions and barrier in a job with network links (two
    /// halves; a call larger than half runs in rounds).
    net_reduce_scratch_mib: u32 = 64, "64",
        env "DEVCOMM_NET_REDUCE_SCRATCH_MIB", group "network", range range(1, 65536), Must;
    /// Descriptors per network queue (per network peer: the data and credit queues of the
    /// library's routes, then the users' channels).
    net_queue_capacity: u32 = 64, "64",
        env "DEVCOMM_NET_QUEUE_CAPACITY", group "network", range range(4, 65536), Local;
    /// Queues per network peer for users' kernels (`WindowNet::channels`: one producer per
    /// queue at a time); 0 leaves windows without a network path.
    net_user_channels: u32 = 4, "4",
        env "DEVCOMM_NET_USER_CHANNELS", group "network", range range(0, 64), Local;
    /// How long the proxy lets one UCX operation run before it declares the peer failed.
    net_op_timeout: Duration = Duration::from_millis(10_000), "10000",
        env "DEVCOMM_NET_OP_TIMEOUT_MS", group "network", range range(1, 86_400_000), Local;

    /// Extra NVRTC options of the collective kernel (e.g. `-lineinfo`; part of the cache key).
    coll_options: Vec<String> = Vec::new(), "",
        env "DEVCOMM_COLL_OPTIONS", group "kernels", range None, Must, experimental;
    /// Extra NVRTC options of the send/recv kernels (e.g. `-lineinfo`; part of the cache key).
    p2p_options: Vec<String> = Vec::new(), "",
        env "DEVCOMM_P2P_OPTIONS", group "kernels", range None, Must, experimental;
    /// Extra NVRTC options of the reduction kernels (no switch of theirs is declared: every
    /// rank alike, for a compiler option such as `-lineinfo`).
    reduce_options: Vec<String> = Vec::new(), "",
        env "DEVCOMM_REDUCE_OPTIONS", group "kernels", range None, Must, experimental;
}

/// Variables named `DEVCOMM_*` that are not knobs of this table but are read elsewhere (the
/// launcher's and the tools'), so that [`Config::from_env`] does not warn about them.
const OTHER_VARIABLES: &[&str] = &[
    "DEVCOMM_JOB_TOKEN",
    "DEVCOMM_NPROCS",
    "DEVCOMM_REQUIRE_NVRTC",
    "DEVCOMM_REQUIRE_CXX",
    "DEVCOMM_REQUIRE_UCX",
    "DEVCOMM_UCX_INCLUDE",
    "DEVCOMM_UCX_FORCE_WHEEL",
];

impl Config {
    /// Reads every knob from the environment; unset and empty variables keep the default.
    /// A bad value is [`Error::InvalidArgument`] naming the variable and what it allows. A
    /// `DEVCOMM_*` variable that names no knob is logged as a warning (a misspelt knob).
    pub fn from_env() -> Result<Self> {
        let config = Self::from_lookup(|name| std::env::var(name).ok())?;
        for (name, _) in std::env::vars_os() {
            let Some(name) = name.to_str() else { continue };
            if name.starts_with("DEVCOMM_")
                && !name.starts_with("DEVCOMM_TEST")
                && !OTHER_VARIABLES.contains(&name)
                && !KNOBS.iter().any(|k| k.env == name)
            {
                log::warn!("{name} is set but is not a devcomm setting (docs/CONFIG.md)");
            }
        }
        Ok(config)
    }

    /// [`Config::from_env`] over any source of variables (`lookup(name)` is the value, if set).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut config = Self::default();
        for knob in KNOBS {
            let Some(text) = lookup(knob.env) else {
                continue;
            };
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            config
                .set(knob, text)
                .map_err(|reason| invalid(knob, reason))?;
        }
        Ok(config)
    }

    /// Checks every field against its knob's range (for values set in code).
    pub fn validate(&self) -> Result<()> {
        for knob in KNOBS {
            let text = self.show(knob);
            if text.is_empty() {
                continue;
            }
            // Parsing the shown text applies the same range check as reading the variable.
            Self::default()
                .set(knob, &text)
                .map_err(|reason| invalid(knob, reason))?;
        }
        Ok(())
    }

    /// The kernel cache directory: [`Config::cache_dir`], else `$HOME/.cache/devcomm/kernels`,
    /// else a `devcomm-kernels` directory in the system's temporary directory.
    pub fn kernel_cache_dir(&self) -> PathBuf {
        if let Some(dir) = &self.cache_dir {
            return dir.clone();
        }
        match std::env::var_os("HOME") {
            Some(home) if !home.is_empty() => PathBuf::from(home).join(".cache/devcomm/kernels"),
            _ => std::env::temp_dir().join("devcomm-kernels"),
        }
    }

    /// docs/CONFIG.md's table: every knob by group.
    pub fn markdown() -> String {
        let mut out = String::from(
            "| variable | type | default | allowed | ranks must agree | what it does |\n\
             |---|---|---|---|---|---|\n",
        );
        let mut group = "";
        for k in KNOBS {
            if k.group != group {
                group = k.group;
                out.push_str(&format!("| **{group}** | | | | | |\n"));
            }
            let agree = match k.agreement {
                Agreement::Must => "yes",
                Agreement::Local => "no",
            };
            let exp = if k.experimental {
                " *Experimental.*"
            } else {
                ""
            };
            let default = if k.default.is_empty() {
                "unset"
            } else {
                k.default
            };
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} | {}{} |\n",
                k.env,
                k.ty,
                default,
                k.allowed(),
                agree,
                k.doc.trim(),
                exp
            ));
        }
        out
    }
}

/// Whether tests must find NVRTC (`DEVCOMM_REQUIRE_NVRTC`, set by scripts/test.sh) instead of
/// skipping the checks that need it.
#[cfg(test)]
pub(crate) fn nvrtc_required() -> bool {
    test_variable("DEVCOMM_REQUIRE_NVRTC").is_some()
}

/// A variable of the test environment (`DEVCOMM_REQUIRE_*`, `DEVCOMM_UCX_INCLUDE`, `CC`): the
/// unit tests read their environment here, so the library reads it in this module only.
#[cfg(test)]
pub(crate) fn test_variable(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The dynamic loader's search path (`LD_LIBRARY_PATH`), named in errors about a library that
/// could not be loaded.
pub(crate) fn loader_path() -> Option<String> {
    std::env::var("LD_LIBRARY_PATH").ok()
}

fn invalid(knob: &Knob, reason: String) -> Error {
    Error::InvalidArgument {
        op: "config",
        reason: format!("{}: {reason}", knob.env),
    }
}

#[cfg(test)]
#[allow(clippy::field_reassign_with_default)] // tests change one knob at a time
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn unset_and_empty_keep_the_defaults() {
        let c = Config::from_lookup(lookup(&[("DEVCOMM_P2P_CE", " ")])).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn values_are_read_into_their_fields() {
        let c = Config::from_lookup(lookup(&[
            ("DEVCOMM_TIMEOUT_MS", "2500"),
            ("DEVCOMM_P2P_CE", "off"),
            ("DEVCOMM_P2P_MAX_BLOCKS", "8"),
            ("DEVCOMM_ZC_CE_MIN", "off"),
            ("DEVCOMM_P2P_PULL", "1"),
            ("DEVCOMM_COLL_OPTIONS", " -DA=1  -DB=2 "),
        ]))
        .unwrap();
        assert_eq!(c.device_timeout, Duration::from_millis(2500));
        assert!(!c.p2p_ce);
        assert_eq!(c.p2p_max_blocks, Some(8));
        assert_eq!(c.zc_ce_min, BytesOrOff(None));
        assert_eq!(c.p2p_pull, Auto::Forced(true));
        assert_eq!(c.coll_options, vec!["-DA=1", "-DB=2"]);
    }

    #[test]
    fn a_bad_value_names_the_variable_and_what_it_allows() {
        for (var, value, says) in [
            ("DEVCOMM_TIMEOUT_MS", "0", "use 1 to"),
            ("DEVCOMM_P2P_LL128", "maybe", "use 1 or 0"),
            ("DEVCOMM_P2P_MAX_BLOCKS", "65", "use 1 to 64"),
            ("DEVCOMM_P2P_DEPTH", "x", "not a whole number"),
            ("DEVCOMM_P2P_CE_BOTH", "gpu", "SEND-RECV"),
        ] {
            let err = Config::from_lookup(lookup(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(var) && err.contains(says),
                "{var}={value}: {err}"
            );
        }
    }

    #[test]
    fn validate_checks_values_set_in_code() {
        let mut c = Config::default();
        c.p2p_depth = 1;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("DEVCOMM_P2P_DEPTH"), "{err}");
        c.p2p_depth = 4;
        c.validate().unwrap();
        c.device_timeout = Duration::ZERO;
        assert!(c.validate().is_err());
    }

    #[test]
    fn every_default_is_documented_as_it_shows() {
        let c = Config::default();
        for k in KNOBS {
            let shown = c.show(k);
            // Knobs whose default the code fits at run time say so after the value.
            assert!(
                k.default.starts_with(&shown),
                "{}: default text {:?} but the value shows {:?}",
                k.env,
                k.default,
                shown
            );
        }
        assert_eq!(
            KNOBS.len(),
            KNOBS
                .iter()
                .map(|k| k.env)
                .collect::<std::collections::HashSet<_>>()
                .len(),
            "every variable once"
        );
    }
}
