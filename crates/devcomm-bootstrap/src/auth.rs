//! Who may talk to the store: the job-token comparison and the decision of where the store may
//! listen. Both are pure functions.

use std::net::IpAddr;

use crate::Error;

/// Compares a presented token with the store's in time that depends only on the store's
/// token length, never on where the first differing byte is. `None` matches only `None`.
pub(crate) fn tokens_match(expected: Option<&str>, given: Option<&str>) -> bool {
    match (expected, given) {
        (None, None) => true,
        (Some(e), Some(g)) => bytes_match(e.as_bytes(), g.as_bytes()),
        _ => false,
    }
}

/// Constant-time equality: every byte of `expected` is compared, differences are OR-ed.
fn bytes_match(expected: &[u8], given: &[u8]) -> bool {
    let mut diff = u8::from(expected.len() != given.len());
    for (i, &e) in expected.iter().enumerate() {
        diff |= e ^ given.get(i).copied().unwrap_or(!e);
    }
    std::hint::black_box(diff) == 0
}

/// Decides whether the store may listen on `ip`: loopback always; any other address (a
/// host's interface, or the unspecified address, which means every interface) only with a
/// job token, since anyone who can reach the port could otherwise join.
///
/// # Errors
///
/// [`Error::Env`] naming `DEVCOMM_JOB_TOKEN` when `ip` is beyond loopback and there is no
/// token.
pub(crate) fn check_listen(master_addr: &str, ip: IpAddr, has_token: bool) -> Result<(), Error> {
    if ip.is_loopback() || has_token {
        return Ok(());
    }
    Err(Error::Env {
        var: "DEVCOMM_JOB_TOKEN",
        reason: format!(
            "is required when the store listens beyond loopback (MASTER_ADDR {master_addr} is \
             {ip}); `devcomm launch` sets one, other launchers must give every rank the same \
             secret"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_compare_results() {
        assert!(tokens_match(None, None));
        assert!(tokens_match(Some("abc"), Some("abc")));
        assert!(tokens_match(Some(""), Some("")));
        assert!(!tokens_match(Some("abc"), None));
        assert!(!tokens_match(None, Some("abc")));
        assert!(!tokens_match(Some("abc"), Some("abd")));
        assert!(!tokens_match(Some("abc"), Some("xbc")));
        assert!(!tokens_match(Some("abc"), Some("ab")));
        assert!(!tokens_match(Some("abc"), Some("abcd")));
        assert!(!tokens_match(Some("ab"), Some("ab\0")));
        assert!(!tokens_match(Some(""), Some("a")));
        assert!(!tokens_match(Some("a"), Some("")));
        // A byte whose complement is the padding value still differs.
        assert!(!tokens_match(Some("a"), Some("a\u{0}")));
    }

    #[test]
    fn a_token_is_required_beyond_loopback() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        for lo in ["127.0.0.1", "127.1.2.3", "::1"] {
            assert!(check_listen(lo, ip(lo), false).is_ok(), "{lo}");
            assert!(check_listen(lo, ip(lo), true).is_ok(), "{lo}");
        }
        for wide in ["10.0.0.5", "192.168.1.2", "0.0.0.0", "::", "fe80::1"] {
            match check_listen("host", ip(wide), false) {
                Err(Error::Env { var, reason }) => {
                    assert_eq!(var, "DEVCOMM_JOB_TOKEN");
                    assert!(reason.contains(wide), "{reason}");
                }
                other => panic!("{wide}: expected a token error, got {other:?}"),
            }
            assert!(check_listen("host", ip(wide), true).is_ok(), "{wide}");
        }
    }
}
