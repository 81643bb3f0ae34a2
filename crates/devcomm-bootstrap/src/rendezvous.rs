//! Joining a fresh store found through another channel: a launcher's or framework's store that
//! the ranks already share (torchrun's agent store, a `torch.distributed` process group's).
//!
//! Rank 0 hosts a new devcomm store on an ephemeral port with a fresh job token
//! ([`Store::host_fresh`]) and publishes its [`StoreAddress`] through the other channel; the
//! other ranks read it there and join ([`Store::join_address`]). No port is fixed in advance,
//! so nothing collides with the port the other channel's own store holds, and every
//! communicator gets a store of its own.

use std::fmt;
use std::time::Duration;

use rand::Rng;

use crate::{Error, RankInfo, Result, Store};

/// Where a store listens and the token that admits a rank, as one line a side channel can
/// carry: `ADDR:PORT:TOKEN` ([`StoreAddress::encode`], [`StoreAddress::parse`]). `ADDR` may be
/// an IPv6 address (the line is split from the right) or a host name.
///
/// `Debug` leaves the token out: it is the job's secret.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreAddress {
    /// Host name or IP address the store listens on.
    pub addr: String,
    /// Its port (never 0).
    pub port: u16,
    /// The job token the store admits.
    pub token: String,
}

impl fmt::Debug for StoreAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreAddress")
            .field("addr", &self.addr)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// A fresh job token: 16 random bytes as 32 hex digits.
pub fn fresh_token() -> String {
    let bytes: [u8; 16] = rand::thread_rng().gen();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn bad(why: impl fmt::Display) -> Error {
    Error::Protocol(format!(
        "malformed store address: {why} (expected ADDR:PORT:TOKEN, as rank 0 publishes it)"
    ))
}

/// Whether `s` is free of whitespace and control characters (which no address or token of
/// ours holds, and which would make a line ambiguous).
fn plain(s: &str) -> bool {
    !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

impl StoreAddress {
    /// `ADDR:PORT:TOKEN`.
    pub fn encode(&self) -> String {
        format!("{}:{}:{}", self.addr, self.port, self.token)
    }

    /// Reads `ADDR:PORT:TOKEN`. Brackets around an IPv6 address are accepted and dropped.
    /// An error names the part that is wrong without echoing the token.
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`] when a part is missing or empty, the port is not a number in
    /// 1..=65535, or a part holds whitespace or control characters.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let mut parts = text.rsplitn(3, ':');
        let (Some(token), Some(port), Some(addr)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad(format!(
                "{} field(s) separated by ':', 3 needed",
                text.split(':').count()
            )));
        };
        if token.is_empty() || !plain(token) {
            return Err(bad(
                "the token is empty or holds whitespace or control characters",
            ));
        }
        let port = match port.parse::<u16>() {
            Ok(0) | Err(_) => return Err(bad(format!("port `{port}` is not a port in 1..=65535"))),
            Ok(p) => p,
        };
        let addr = addr
            .strip_prefix('[')
            .and_then(|a| a.strip_suffix(']'))
            .unwrap_or(addr);
        if addr.is_empty() || !plain(addr) {
            return Err(bad(format!("address `{addr}` is empty or not plain")));
        }
        Ok(StoreAddress {
            addr: addr.to_string(),
            port,
            token: token.to_string(),
        })
    }
}

impl Store {
    /// Rank 0 of a group that meets through another channel: hosts a new store on an
    /// ephemeral port of `host` (an address of this host: `127.0.0.1` when every rank runs
    /// here) with a fresh job token, and joins it. Returns without waiting for other ranks;
    /// publish [`Store::address`] for them to [`Store::join_address`].
    ///
    /// `info` gives rank, world size and local rank; its master address, port and token are
    /// replaced.
    ///
    /// # Errors
    ///
    /// [`Error::Env`] (`RANK`) if `info` is not rank 0; otherwise as [`Store::connect`].
    pub fn host_fresh(info: &RankInfo, host: &str, timeout: Duration) -> Result<Store> {
        if info.rank != 0 {
            return Err(Error::Env {
                var: "RANK",
                reason: format!(
                    "rank {} cannot host the store: rank 0 hosts it and the others join",
                    info.rank
                ),
            });
        }
        let info = info
            .clone()
            .with_master(host, 0)
            .with_token(Some(fresh_token()));
        Store::connect(&info, timeout)
    }

    /// A rank other than 0: joins the store whose address rank 0 published.
    ///
    /// `info` gives rank, world size and local rank; its master address, port and token are
    /// replaced by `address`'s.
    ///
    /// # Errors
    ///
    /// [`Error::Env`] (`RANK`) for rank 0 (it hosts the store: [`Store::host_fresh`]);
    /// otherwise as [`Store::connect`] ([`Error::BadToken`] for a stale address whose port
    /// another job's store now holds).
    pub fn join_address(
        info: &RankInfo,
        address: &StoreAddress,
        timeout: Duration,
    ) -> Result<Store> {
        if info.rank == 0 {
            return Err(Error::Env {
                var: "RANK",
                reason: "rank 0 hosts the store (Store::host_fresh) rather than joining one".into(),
            });
        }
        let info = info
            .clone()
            .with_master(address.addr.clone(), address.port)
            .with_token(Some(address.token.clone()));
        Store::connect(&info, timeout)
    }

    /// The address and token other ranks join this store with; `None` for a store without a
    /// job token.
    pub fn address(&self) -> Option<StoreAddress> {
        let info = self.info();
        Some(StoreAddress {
            addr: info.master_addr.clone(),
            port: info.master_port,
            token: info.job_token.clone()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);

    fn addr(a: &str, port: u16, token: &str) -> StoreAddress {
        StoreAddress {
            addr: a.into(),
            port,
            token: token.into(),
        }
    }

    #[test]
    fn addresses_round_trip() {
        for a in [
            addr("127.0.0.1", 4000, "ab12"),
            addr("::1", 1, "t"),
            addr("fe80::1%eth0", 65535, "0123456789abcdef"),
            addr("node-7.cluster", 29500, "x-y_z"),
        ] {
            assert_eq!(StoreAddress::parse(&a.encode()).expect("parses"), a);
        }
        assert_eq!(
            StoreAddress::parse(" [::1]:80:tok\n").expect("brackets"),
            addr("::1", 80, "tok")
        );
    }

    #[test]
    fn bad_addresses_name_the_part_and_hide_the_token() {
        let cases = [
            ("", "1 field(s)"),
            ("127.0.0.1:4000", "2 field(s)"),
            ("127.0.0.1:4000:", "token is empty"),
            ("127.0.0.1:x:secret", "port `x`"),
            ("127.0.0.1:0:secret", "port `0`"),
            ("127.0.0.1:70000:secret", "port `70000`"),
            (":4000:secret", "address ``"),
            ("a b:4000:secret", "address `a b`"),
            ("h:4000:sec ret", "whitespace"),
        ];
        for (text, want) in cases {
            let msg = StoreAddress::parse(text).unwrap_err().to_string();
            assert!(msg.contains(want), "{text:?}: {msg}");
            assert!(msg.contains("ADDR:PORT:TOKEN"), "{msg}");
            assert!(!msg.contains("secret"), "the token leaked: {msg}");
        }
        let dbg = format!("{:?}", addr("h", 1, "secret"));
        assert!(!dbg.contains("secret"), "{dbg}");
    }

    #[test]
    fn tokens_are_fresh_hex() {
        let (a, b) = (fresh_token(), fresh_token());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn only_rank_0_hosts_and_only_the_others_join() {
        let e = Store::host_fresh(&RankInfo::new(1, 2), "127.0.0.1", T).unwrap_err();
        assert!(matches!(e, Error::Env { var: "RANK", .. }), "{e}");
        let a = addr("127.0.0.1", 1, "t");
        let e = Store::join_address(&RankInfo::new(0, 2), &a, T).unwrap_err();
        assert!(matches!(e, Error::Env { var: "RANK", .. }), "{e}");
    }

    /// Three ranks on threads meet through a side channel (a store they already share, as
    /// torch's would be): rank 0 hosts a fresh store and publishes its address there, the
    /// others read it and join; then the fresh store carries an all-gather.
    #[test]
    fn ranks_meet_through_a_side_channel() {
        let world = 3;
        let side0 = Store::connect(&RankInfo::new(0, world).with_master("127.0.0.1", 0), T)
            .expect("side channel");
        let side_port = side0.master_port();
        let run = move |rank: usize, side: Store| -> Result<Vec<Vec<u8>>> {
            let info = RankInfo::new(rank, world);
            let store = if rank == 0 {
                let s = Store::host_fresh(&info, "127.0.0.1", T)?;
                let a = s.address().expect("a fresh store has a token");
                assert_ne!(a.port, 0);
                side.set("devcomm/0", a.encode().as_bytes())?;
                s
            } else {
                let raw = side.get("devcomm/0", T)?;
                let a = StoreAddress::parse(&String::from_utf8_lossy(&raw))?;
                Store::join_address(&info, &a, T)?
            };
            assert_ne!(store.master_port(), side_port);
            store.all_gather("hello", format!("rank {rank}").as_bytes(), T)
        };
        let others: Vec<_> = (1..world)
            .map(|r| {
                std::thread::spawn(move || {
                    let info = RankInfo::new(r, world).with_master("127.0.0.1", side_port);
                    run(r, Store::connect(&info, T).expect("side channel"))
                })
            })
            .collect();
        let mine = run(0, side0).expect("rank 0");
        let want: Vec<Vec<u8>> = (0..world).map(|r| format!("rank {r}").into()).collect();
        assert_eq!(mine, want);
        for t in others {
            assert_eq!(t.join().expect("thread").expect("rank"), want);
        }
    }
}
