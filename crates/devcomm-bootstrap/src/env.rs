//! Reading [`RankInfo`] from the environment, and building it in code.

use crate::{Error, RankInfo, Result};

/// Default `MASTER_ADDR` when the variable is absent.
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";
/// Default `MASTER_PORT` when the variable is absent.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// Set to `True` by torchrun when its agent hosts the store on `MASTER_ADDR:MASTER_PORT`
/// (the c10d rendezvous, `--standalone` included).
pub const AGENT_STORE_ENV: &str = "TORCHELASTIC_USE_AGENT_STORE";

fn env_err(var: &'static str, reason: impl Into<String>) -> Error {
    Error::Env {
        var,
        reason: reason.into(),
    }
}

fn required_usize(lookup: &dyn Fn(&str) -> Option<String>, var: &'static str) -> Result<usize> {
    let raw = lookup(var).ok_or_else(|| env_err(var, "is not set"))?;
    raw.trim()
        .parse::<usize>()
        .map_err(|e| env_err(var, format!("`{raw}` is not a non-negative integer ({e})")))
}

impl RankInfo {
    /// Reads `RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE` (all required), `MASTER_ADDR`
    /// (default `127.0.0.1`), `MASTER_PORT` (default 29500) and the optional
    /// `DEVCOMM_JOB_TOKEN` (an empty value counts as absent).
    ///
    /// # Errors
    ///
    /// [`Error::Env`] naming the variable that is missing, malformed or inconsistent with the
    /// others (for example `RANK` not below `WORLD_SIZE`).
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    /// Like [`RankInfo::from_env`], but reads variables through `lookup` (a name to its value,
    /// `None` when absent) instead of the process environment: for tests and for launchers
    /// that hold the variables in a map.
    ///
    /// # Errors
    ///
    /// As [`RankInfo::from_env`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let lookup: &dyn Fn(&str) -> Option<String> = &lookup;
        // torchrun's agent already listens on MASTER_PORT; binding it would fail on rank 0
        // with a bare "address in use" and leave the other ranks talking devcomm's protocol
        // to torch's store until they time out.
        if lookup(AGENT_STORE_ENV).as_deref() == Some("True") {
            return Err(env_err(
                AGENT_STORE_ENV,
                "is True: torchrun's agent store listens on MASTER_PORT, so devcomm cannot host \
                 its store there. Start Rust programs with `devcomm launch`, or use the Python \
                 package, whose devcomm.init() joins through torchrun's store (docs/PYTHON.md)",
            ));
        }
        let rank = required_usize(lookup, "RANK")?;
        let world_size = required_usize(lookup, "WORLD_SIZE")?;
        let local_rank = required_usize(lookup, "LOCAL_RANK")?;
        let local_world_size = required_usize(lookup, "LOCAL_WORLD_SIZE")?;
        let master_addr = match lookup("MASTER_ADDR") {
            None => DEFAULT_MASTER_ADDR.to_string(),
            Some(a) => a.trim().to_string(),
        };
        let master_port = match lookup("MASTER_PORT") {
            None => DEFAULT_MASTER_PORT,
            Some(p) => p
                .trim()
                .parse::<u16>()
                .map_err(|e| env_err("MASTER_PORT", format!("`{p}` is not a port number ({e})")))?,
        };
        let job_token = lookup("DEVCOMM_JOB_TOKEN").filter(|t| !t.is_empty());
        let info = RankInfo {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            job_token,
        };
        info.validate()?;
        Ok(info)
    }

    /// A rank of a single-host job: local rank and size equal the global ones, the store at
    /// `127.0.0.1:29500`, no job token. Adjust with the `with_*` methods.
    pub fn new(rank: usize, world_size: usize) -> Self {
        RankInfo {
            rank,
            world_size,
            local_rank: rank,
            local_world_size: world_size,
            master_addr: DEFAULT_MASTER_ADDR.to_string(),
            master_port: DEFAULT_MASTER_PORT,
            job_token: None,
        }
    }

    /// The only rank of a one-process job, with the store on `127.0.0.1` and port 0 (an
    /// ephemeral port chosen at [`crate::Store::connect`]; see [`crate::Store::master_port`]).
    pub fn single() -> Self {
        Self::new(0, 1).with_master("127.0.0.1", 0)
    }

    /// Sets the store address. Port 0 is allowed for rank 0 only (an ephemeral port, which
    /// [`crate::Store::master_port`] reports so that other ranks can be told).
    pub fn with_master(mut self, addr: impl Into<String>, port: u16) -> Self {
        self.master_addr = addr.into();
        self.master_port = port;
        self
    }

    /// Sets the job token.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.job_token = token;
        self
    }

    /// Sets the local rank and the number of processes on this host.
    pub fn with_local(mut self, local_rank: usize, local_world_size: usize) -> Self {
        self.local_rank = local_rank;
        self.local_world_size = local_world_size;
        self
    }

    /// Checks that the fields are consistent.
    ///
    /// # Errors
    ///
    /// [`Error::Env`] naming the variable that corresponds to the bad field.
    pub fn validate(&self) -> Result<()> {
        if self.world_size == 0 {
            return Err(env_err("WORLD_SIZE", "must be at least 1"));
        }
        if self.rank >= self.world_size {
            return Err(env_err(
                "RANK",
                format!("{} is not below WORLD_SIZE {}", self.rank, self.world_size),
            ));
        }
        if self.local_world_size == 0 {
            return Err(env_err("LOCAL_WORLD_SIZE", "must be at least 1"));
        }
        if self.local_world_size > self.world_size {
            return Err(env_err(
                "LOCAL_WORLD_SIZE",
                format!(
                    "{} is larger than WORLD_SIZE {}",
                    self.local_world_size, self.world_size
                ),
            ));
        }
        if self.local_rank >= self.local_world_size {
            return Err(env_err(
                "LOCAL_RANK",
                format!(
                    "{} is not below LOCAL_WORLD_SIZE {}",
                    self.local_rank, self.local_world_size
                ),
            ));
        }
        if self.master_addr.is_empty() {
            return Err(env_err("MASTER_ADDR", "is empty"));
        }
        if self.master_port == 0 && self.rank != 0 {
            return Err(env_err(
                "MASTER_PORT",
                format!(
                    "0 (an ephemeral port) is usable only by rank 0, not rank {}",
                    self.rank
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    const FULL: &[(&str, &str)] = &[
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "1234"),
        ("DEVCOMM_JOB_TOKEN", "secret"),
    ];

    fn without(var: &str) -> Vec<(&'static str, &'static str)> {
        FULL.iter().copied().filter(|(k, _)| *k != var).collect()
    }

    fn with(var: &'static str, value: &'static str) -> Vec<(&'static str, &'static str)> {
        let mut v = without(var);
        v.push((var, value));
        v
    }

    fn env_var_of(r: Result<RankInfo>) -> &'static str {
        match r {
            Err(Error::Env { var, .. }) => var,
            other => panic!("expected an Env error, got {other:?}"),
        }
    }

    #[test]
    fn full_environment_parses() {
        let info = RankInfo::from_lookup(lookup(FULL)).expect("valid");
        assert_eq!(
            info,
            RankInfo {
                rank: 3,
                world_size: 8,
                local_rank: 1,
                local_world_size: 2,
                master_addr: "10.0.0.1".into(),
                master_port: 1234,
                job_token: Some("secret".into()),
            }
        );
    }

    #[test]
    fn master_defaults_and_optional_token() {
        let mut v = without("MASTER_ADDR");
        v.retain(|(k, _)| *k != "MASTER_PORT" && *k != "DEVCOMM_JOB_TOKEN");
        let info = RankInfo::from_lookup(lookup(&v)).expect("valid");
        assert_eq!(info.master_addr, "127.0.0.1");
        assert_eq!(info.master_port, 29500);
        assert_eq!(info.job_token, None);
        let info = RankInfo::from_lookup(lookup(&with("DEVCOMM_JOB_TOKEN", ""))).expect("valid");
        assert_eq!(info.job_token, None, "an empty token counts as absent");
    }

    #[test]
    fn missing_required_variables_are_named() {
        for var in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"] {
            assert_eq!(
                env_var_of(RankInfo::from_lookup(lookup(&without(var)))),
                var
            );
        }
    }

    #[test]
    fn malformed_and_inconsistent_values_are_named() {
        let cases: &[(&'static str, &'static str, &str)] = &[
            ("RANK", "x", "RANK"),
            ("RANK", "-1", "RANK"),
            ("RANK", "8", "RANK"),
            ("WORLD_SIZE", "0", "WORLD_SIZE"),
            ("WORLD_SIZE", "3", "RANK"),
            ("LOCAL_RANK", "2", "LOCAL_RANK"),
            ("LOCAL_WORLD_SIZE", "0", "LOCAL_WORLD_SIZE"),
            ("LOCAL_WORLD_SIZE", "9", "LOCAL_WORLD_SIZE"),
            ("MASTER_PORT", "70000", "MASTER_PORT"),
            ("MASTER_PORT", "0", "MASTER_PORT"),
            ("MASTER_ADDR", "", "MASTER_ADDR"),
        ];
        for (var, value, named) in cases {
            let got = env_var_of(RankInfo::from_lookup(lookup(&with(var, value))));
            assert_eq!(got, *named, "{var}={value}");
        }
    }

    #[test]
    fn error_message_names_variable_and_value() {
        let err = RankInfo::from_lookup(lookup(&with("RANK", "abc"))).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("RANK") && msg.contains("abc"), "{msg}");
    }

    #[test]
    fn torchruns_agent_store_is_refused_with_what_to_do() {
        let err = RankInfo::from_lookup(lookup(&with(AGENT_STORE_ENV, "True"))).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                Error::Env {
                    var: AGENT_STORE_ENV,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(
            msg.contains("devcomm launch") && msg.contains("devcomm.init()"),
            "{msg}"
        );
        // torch compares with "True" exactly; anything else leaves MASTER_PORT to rank 0.
        RankInfo::from_lookup(lookup(&with(AGENT_STORE_ENV, "False"))).expect("valid");
    }

    #[test]
    fn builders() {
        let info = RankInfo::new(1, 4)
            .with_master("localhost", 4000)
            .with_token(Some("t".into()))
            .with_local(0, 2);
        assert_eq!((info.rank, info.world_size), (1, 4));
        assert_eq!((info.local_rank, info.local_world_size), (0, 2));
        assert_eq!(
            (info.master_addr.as_str(), info.master_port),
            ("localhost", 4000)
        );
        info.validate().expect("valid");
        let single = RankInfo::single();
        assert_eq!(
            (single.rank, single.world_size, single.master_port),
            (0, 1, 0)
        );
        single.validate().expect("valid");
        assert!(RankInfo::new(1, 2)
            .with_master("127.0.0.1", 0)
            .validate()
            .is_err());
    }
}
