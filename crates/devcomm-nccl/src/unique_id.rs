//! The 128-byte `ncclUniqueId`: where rank 0 hosts the communicator's devcomm store and the
//! store's secret token, so that only holders of the id can join.
//!
//! Layout: magic (8 bytes), port (u16 little-endian), address length (1 byte), address (up to
//! 64 bytes, zero-padded), token (16 bytes), zeros, then a SHA-256 digest of bytes 0..96 in
//! bytes 96..128. The digest catches an id damaged or altered in transit (a cut copy, a
//! flipped byte) before anything connects; the token is what keeps others out: the store
//! refuses a joiner whose token is not its own (`devcomm_bootstrap::Error::BadToken`).

use std::net::{TcpListener, ToSocketAddrs};

use devcomm_bootstrap::StoreAddress;
use sha2::{Digest, Sha256};

use crate::error::Failure;
use crate::ffi::UNIQUE_ID_BYTES;

const MAGIC: &[u8; 8] = b"DCNCCL\x00\x01";
const ADDR_MAX: usize = 64;
const TOKEN_AT: usize = 11 + ADDR_MAX;
const TOKEN_BYTES: usize = 16;
const DIGEST_AT: usize = 96;

/// The host the store binds: `DEVCOMM_STORE_HOST` (an address of rank 0's host that every
/// rank reaches; needed when ranks run on several hosts), else loopback.
pub const HOST_ENV: &str = "DEVCOMM_STORE_HOST";

/// The contents of an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdContents {
    /// The store's address and token.
    pub address: StoreAddress,
}

/// Encodes `address` (token: 32 hex digits, as `devcomm_bootstrap::fresh_token` makes it).
pub fn encode(address: &StoreAddress) -> Result<[u8; UNIQUE_ID_BYTES], Failure> {
    let addr = address.addr.as_bytes();
    if addr.is_empty() || addr.len() > ADDR_MAX {
        return Err(Failure::invalid_argument(format!(
            "ncclGetUniqueId: store address `{}` is {} bytes; 1..={ADDR_MAX} fit the id",
            address.addr,
            addr.len()
        )));
    }
    let token = hex_decode(&address.token).ok_or_else(|| {
        Failure::invalid_argument("ncclGetUniqueId: the store token is not 32 hex digits")
    })?;
    let mut id = [0u8; UNIQUE_ID_BYTES];
    id[..8].copy_from_slice(MAGIC);
    id[8..10].copy_from_slice(&address.port.to_le_bytes());
    id[10] = addr.len() as u8;
    id[11..11 + addr.len()].copy_from_slice(addr);
    id[TOKEN_AT..TOKEN_AT + TOKEN_BYTES].copy_from_slice(&token);
    let digest = Sha256::digest(&id[..DIGEST_AT]);
    id[DIGEST_AT..].copy_from_slice(&digest);
    Ok(id)
}

/// Decodes an id made by [`encode`]; a foreign, damaged or altered id is refused
/// (`ncclInvalidArgument`), without echoing its token.
pub fn decode(id: &[u8; UNIQUE_ID_BYTES]) -> Result<IdContents, Failure> {
    let bad = |why: &str| {
        Failure::invalid_argument(format!(
            "ncclCommInitRank: the ncclUniqueId {why}; pass the id ncclGetUniqueId of this \
             library made, unchanged"
        ))
    };
    if &id[..8] != MAGIC {
        return Err(bad(
            "was not made by libdevcomm_nccl (an id of the real NCCL or another version)",
        ));
    }
    if Sha256::digest(&id[..DIGEST_AT])[..] != id[DIGEST_AT..] {
        return Err(bad("is damaged or altered (its digest does not match)"));
    }
    let port = u16::from_le_bytes([id[8], id[9]]);
    let len = id[10] as usize;
    if port == 0 || len == 0 || len > ADDR_MAX {
        return Err(bad("holds no valid store address"));
    }
    let addr = std::str::from_utf8(&id[11..11 + len]).map_err(|_| bad("holds no valid address"))?;
    let token = hex_encode(&id[TOKEN_AT..TOKEN_AT + TOKEN_BYTES]);
    Ok(IdContents {
        address: StoreAddress {
            addr: addr.to_string(),
            port,
            token,
        },
    })
}

/// A fresh id: a port of `host` free now (bound and released: rank 0's store binds it at
/// `ncclCommInitRank`, and refuses with a clear error if another process took it meanwhile)
/// and a fresh random token.
pub fn fresh(host: &str) -> Result<[u8; UNIQUE_ID_BYTES], Failure> {
    let sock = (host, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Failure::system(format!("ncclGetUniqueId: cannot resolve `{host}`")))?;
    let port = TcpListener::bind(sock)
        .and_then(|l| l.local_addr())
        .map_err(|e| Failure::system(format!("ncclGetUniqueId: cannot bind {host}:0: {e}")))?
        .port();
    encode(&StoreAddress {
        addr: host.to_string(),
        port,
        token: devcomm_bootstrap::fresh_token(),
    })
}

/// The store host of this process: [`HOST_ENV`] or loopback.
pub fn store_host() -> String {
    std::env::var(HOST_ENV)
        .ok()
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| "127.0.0.1".to_string())
}

fn hex_decode(s: &str) -> Option<[u8; TOKEN_BYTES]> {
    if s.len() != 2 * TOKEN_BYTES {
        return None;
    }
    let mut out = [0u8; TOKEN_BYTES];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn hex_encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use devcomm_bootstrap::{RankInfo, Store};
    use std::time::Duration;

    fn address() -> StoreAddress {
        StoreAddress {
            addr: "10.1.2.3".into(),
            port: 40123,
            token: devcomm_bootstrap::fresh_token(),
        }
    }

    #[test]
    fn ids_round_trip() {
        for a in [
            address(),
            StoreAddress {
                addr: "fe80::1%eth0".into(),
                port: 1,
                token: "00ff".repeat(8),
            },
            StoreAddress {
                addr: "n".repeat(ADDR_MAX),
                port: 65535,
                token: devcomm_bootstrap::fresh_token(),
            },
        ] {
            let id = encode(&a).expect("encodes");
            assert_eq!(decode(&id).expect("decodes").address, a);
        }
        let long = StoreAddress {
            addr: "n".repeat(ADDR_MAX + 1),
            ..address()
        };
        assert_eq!(
            encode(&long).unwrap_err().code,
            crate::ffi::INVALID_ARGUMENT
        );
        let short_token = StoreAddress {
            token: "abc".into(),
            ..address()
        };
        assert!(encode(&short_token).is_err());
    }

    #[test]
    fn altered_or_foreign_ids_are_refused_without_echoing_the_token() {
        let a = address();
        let id = encode(&a).unwrap();
        // Every single byte altered (address, port, token, padding, digest) is caught.
        for i in 0..UNIQUE_ID_BYTES {
            let mut bad = id;
            bad[i] ^= 0x01;
            let e = decode(&bad).unwrap_err();
            assert_eq!(e.code, crate::ffi::INVALID_ARGUMENT, "byte {i}");
            assert!(!e.message.contains(&a.token), "{}", e.message);
        }
        // An id of the real NCCL (a socket address and a random magic) is not ours.
        let mut nccl = [0u8; UNIQUE_ID_BYTES];
        nccl[..8].copy_from_slice(&[0x2a, 0, 0, 0, 0x02, 0, 0x75, 0x30]);
        assert!(decode(&nccl).unwrap_err().message.contains("not made by"));
    }

    /// The token is the secret: an id forged with a valid digest but another token reaches
    /// the store and is refused there, while the genuine id joins.
    #[test]
    fn a_forged_token_is_refused_by_the_store() {
        let t = Duration::from_secs(10);
        let id = fresh("127.0.0.1").expect("fresh id");
        let genuine = decode(&id).unwrap().address;
        let info0 = RankInfo::new(0, 2)
            .with_master(genuine.addr.clone(), genuine.port)
            .with_token(Some(genuine.token.clone()));
        let s0 = Store::connect(&info0, t).expect("rank 0 hosts on the id's port");
        let forged = StoreAddress {
            token: devcomm_bootstrap::fresh_token(),
            ..genuine.clone()
        };
        let forged_id = encode(&forged).unwrap();
        let forged = decode(&forged_id).unwrap().address;
        let refused = Store::join_address(&RankInfo::new(1, 2), &forged, t).unwrap_err();
        assert!(
            matches!(refused, devcomm_bootstrap::Error::BadToken(_)),
            "{refused}"
        );
        let s1 = Store::join_address(&RankInfo::new(1, 2), &genuine, t).expect("genuine joins");
        s1.set("k", b"v").unwrap();
        assert_eq!(s0.get("k", t).unwrap(), b"v");
    }
}
