//! File-descriptor passing between the ranks of one host.
//!
//! Each rank listens on an abstract-namespace Unix stream socket named from the job (master
//! address, port and token, hashed) and its rank. A message is one connection carrying a
//! header `magic u32 | sender u32 | tag length u32 | tag` with exactly one fd attached as
//! `SCM_RIGHTS`. Both ends check `SO_PEERCRED`: the uid must be ours and the pid the one the
//! other rank published in the store. Messages that arrive for a tag nobody is waiting for yet
//! are stashed by (tag, sender). The receiving side is in `fdrecv`.

use std::collections::HashMap;
use std::io::{self, IoSlice, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use nix::sys::socket::{self as sock, sockopt, ControlMessage, MsgFlags, UnixCredentials};

use crate::{Error, Result};

/// "DCFD".
pub(crate) const FD_MAGIC: u32 = 0x4446_4344;
/// Longest tag accepted.
pub(crate) const MAX_TAG: usize = 1024;
/// Listen backlog (at least 128): senders complete into it before the receiver accepts.
const BACKLOG: i32 = 1024;

/// FNV-1a, stable across builds (all ranks must derive the same socket names).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Separator so that ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The abstract socket name of `rank` in the job identified by the master address, port and
/// token.
pub(crate) fn socket_name(addr: &str, port: u16, token: Option<&str>, rank: usize) -> String {
    let h = fnv1a(&[
        addr.as_bytes(),
        &port.to_le_bytes(),
        token.unwrap_or("").as_bytes(),
    ]);
    format!("devcomm-{h:016x}-{rank}")
}

/// This rank's listener and the messages received early.
#[derive(Debug)]
pub(crate) struct FdState {
    pub(crate) listener: UnixListener,
    name: String,
    pub(crate) stash: HashMap<(String, usize), Received>,
}

/// A received, verified message.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) fd: OwnedFd,
}

impl FdState {
    /// Binds the listener named `name` (non-blocking accept, backlog 1024).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the name is taken (another process of the same job and rank).
    pub(crate) fn bind(name: String, rank: usize) -> Result<Self> {
        let ctx = || format!("rank {rank}: binding the fd-passing socket @{name}");
        let addr =
            SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| Error::io(ctx(), e))?;
        let listener = UnixListener::bind_addr(&addr).map_err(|e| Error::io(ctx(), e))?;
        // Re-listen to make the backlog explicit (std's default varies by version).
        sock::listen(
            &listener,
            sock::Backlog::new(BACKLOG).unwrap_or(sock::Backlog::MAXCONN),
        )
        .map_err(|e| Error::io(ctx(), e.into()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(ctx(), e))?;
        Ok(FdState {
            listener,
            name,
            stash: HashMap::new(),
        })
    }

    /// The abstract name this rank listens on.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

pub(crate) fn our_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

pub(crate) fn check_cred(cred: &UnixCredentials, who: &str, expected_pid: i32) -> Result<()> {
    if cred.uid() != our_uid() {
        return Err(Error::Protocol(format!(
            "{who}: peer uid {} is not ours ({})",
            cred.uid(),
            our_uid()
        )));
    }
    if cred.pid() != expected_pid {
        return Err(Error::Protocol(format!(
            "{who}: peer pid {} is not the pid {expected_pid} that rank published",
            cred.pid()
        )));
    }
    Ok(())
}

pub(crate) fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Sends `fd` to the rank listening on `name`, which published `pid`.
pub(crate) fn send_one(
    me: usize,
    to: usize,
    name: &str,
    pid: i32,
    tag: &str,
    fd: BorrowedFd<'_>,
    deadline: Instant,
) -> Result<()> {
    let ctx = |what: &str| format!("rank {me}: exchange_fds `{tag}`: {what} rank {to} (@{name})");
    let addr = SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| Error::io(ctx("naming the socket of"), e))?;
    let mut backoff = Duration::from_millis(1);
    let mut stream = loop {
        match UnixStream::connect_addr(&addr) {
            Ok(s) => break s,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                ) || e.raw_os_error() == Some(libc::EAGAIN) =>
            {
                if remaining(deadline).is_none() {
                    return Err(Error::io(ctx("connecting to"), e));
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(Error::io(ctx("connecting to"), e)),
        }
    };
    let cred = sock::getsockopt(&stream, sockopt::PeerCredentials)
        .map_err(|e| Error::io(ctx("reading SO_PEERCRED of"), e.into()))?;
    check_cred(&cred, &ctx("the listener of"), pid)?;
    let mut header = Vec::with_capacity(12 + tag.len());
    header.extend_from_slice(&FD_MAGIC.to_le_bytes());
    header.extend_from_slice(&(me as u32).to_le_bytes());
    header.extend_from_slice(&(tag.len() as u32).to_le_bytes());
    header.extend_from_slice(tag.as_bytes());
    let _ = stream.set_write_timeout(remaining(deadline).or(Some(Duration::from_millis(1))));
    let raw = [fd.as_raw_fd()];
    let sent = sock::sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(&header)],
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|e| Error::io(ctx("sending the fd to"), e.into()))?;
    stream
        .write_all(&header[sent..])
        .map_err(|e| Error::io(ctx("sending the header to"), e))?;
    Ok(())
}

/// Names a set of ranks: "ranks 1, 2".
pub(crate) fn ranks_list(ranks: impl IntoIterator<Item = usize>) -> String {
    let v: Vec<String> = ranks.into_iter().map(|r| r.to_string()).collect();
    format!("ranks {}", v.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_depend_on_job_and_rank() {
        let a = socket_name("127.0.0.1", 29500, Some("t"), 0);
        assert_eq!(a, socket_name("127.0.0.1", 29500, Some("t"), 0));
        assert_ne!(a, socket_name("127.0.0.1", 29500, Some("t"), 1));
        assert_ne!(a, socket_name("127.0.0.1", 29501, Some("t"), 0));
        assert_ne!(a, socket_name("127.0.0.1", 29500, Some("u"), 0));
        assert_ne!(a, socket_name("127.0.0.1", 29500, None, 0));
        assert!(a.len() < 100);
    }

    #[test]
    fn ranks_are_listed() {
        assert_eq!(ranks_list([2, 3]), "ranks 2, 3");
        assert_eq!(ranks_list([1]), "ranks 1");
    }
}
