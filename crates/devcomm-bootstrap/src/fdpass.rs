//! File-descriptor passing between the ranks of one host.
//!
//! Each rank listens on an abstract-namespace Unix stream socket named from the job (master
//! address, port and token, hashed) and its rank. A message is one connection carrying a
//! header `magic u32 | sender u32 | tag length u32 | tag` with exactly one fd attached as
//! `SCM_RIGHTS`. Both ends check `SO_PEERCRED`: the uid must be ours and the pid the one the
//! other rank published in the store. Messages that arrive for a tag nobody is waiting for yet
//! are stashed by (tag, sender).

use std::collections::{BTreeSet, HashMap};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    self as sock, sockopt, ControlMessage, ControlMessageOwned, MsgFlags, UnixCredentials,
};

use crate::{Error, Result};

/// "DCFD".
const FD_MAGIC: u32 = 0x4446_4344;
/// Longest tag accepted.
const MAX_TAG: usize = 1024;
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
    listener: UnixListener,
    name: String,
    stash: HashMap<(String, usize), Received>,
}

/// A received, verified message.
#[derive(Debug)]
struct Received {
    fd: OwnedFd,
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

fn our_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

fn check_cred(cred: &UnixCredentials, who: &str, expected_pid: i32) -> Result<()> {
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

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Sends `fd` to the rank listening on `name`, which published `pid`.
fn send_one(
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

/// One message read off an accepted connection, not yet verified.
struct Incoming {
    tag: String,
    sender: usize,
    fd: OwnedFd,
    cred: UnixCredentials,
}

/// Reads one message from an accepted connection; `None` when the connection closed without
/// one (a sender that gave up, e.g. after failing its credential check on us).
fn read_message(me: usize, mut stream: UnixStream, deadline: Instant) -> Result<Option<Incoming>> {
    let ctx = |what: &str| format!("rank {me}: exchange_fds: {what}");
    stream
        .set_nonblocking(false)
        .map_err(|e| Error::io(ctx("configuring a connection"), e))?;
    let _ = stream.set_read_timeout(remaining(deadline).or(Some(Duration::from_millis(1))));
    let cred = sock::getsockopt(&stream, sockopt::PeerCredentials)
        .map_err(|e| Error::io(ctx("reading SO_PEERCRED"), e.into()))?;
    let mut buf = vec![0u8; 12 + MAX_TAG];
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let (n, fds, truncated) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = sock::recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| Error::io(ctx("receiving a message"), e.into()))?;
        let mut fds: Vec<OwnedFd> = Vec::new();
        for c in msg
            .cmsgs()
            .map_err(|e| Error::io(ctx("reading control messages"), e.into()))?
        {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for r in raw {
                    // SAFETY: the kernel has just installed `r` in our fd table for this
                    // message (SCM_RIGHTS); nothing else refers to it, so we own it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(r) });
                }
            }
        }
        (msg.bytes, fds, msg.flags.contains(MsgFlags::MSG_CTRUNC))
    };
    if truncated {
        return Err(Error::Protocol(ctx(
            "control message truncated (too many fds sent)",
        )));
    }
    let mut fill = |buf: &mut [u8], n: &mut usize, want: usize| -> Result<()> {
        if *n < want {
            stream
                .read_exact(&mut buf[*n..want])
                .map_err(|e| Error::io(ctx("reading a message header"), e))?;
            *n = want;
        }
        Ok(())
    };
    let mut n = n;
    if n == 0 && fds.is_empty() {
        log::debug!("rank {me}: exchange_fds: a connection closed without a message");
        return Ok(None);
    }
    fill(&mut buf, &mut n, 12)?;
    let word = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    if word(0) != FD_MAGIC {
        return Err(Error::Protocol(ctx("a connection sent a bad magic number")));
    }
    let sender = word(4) as usize;
    let tag_len = word(8) as usize;
    if tag_len > MAX_TAG {
        return Err(Error::Protocol(ctx(&format!(
            "rank {sender} sent a tag of {tag_len} bytes (limit {MAX_TAG})"
        ))));
    }
    fill(&mut buf, &mut n, 12 + tag_len)?;
    let tag = String::from_utf8(buf[12..12 + tag_len].to_vec())
        .map_err(|_| Error::Protocol(ctx(&format!("rank {sender} sent a non-UTF-8 tag"))))?;
    let mut fds = fds.into_iter();
    let fd = match (fds.next(), fds.next()) {
        (Some(fd), None) => fd,
        (None, _) => {
            return Err(Error::Protocol(ctx(&format!(
                "rank {sender} sent `{tag}` without an fd"
            ))))
        }
        (Some(_), Some(_)) => {
            return Err(Error::Protocol(ctx(&format!(
                "rank {sender} sent `{tag}` with more than one fd"
            ))))
        }
    };
    Ok(Some(Incoming {
        tag,
        sender,
        fd,
        cred,
    }))
}

/// Names a set of ranks: "ranks 1, 2".
pub(crate) fn ranks_list(ranks: impl IntoIterator<Item = usize>) -> String {
    let v: Vec<String> = ranks.into_iter().map(|r| r.to_string()).collect();
    format!("ranks {}", v.join(", "))
}

/// The collective of [`crate::Store::exchange_fds`]. `pid_of(rank, deadline)` returns the pid
/// that rank published.
#[allow(clippy::too_many_arguments)]
pub(crate) fn exchange(
    state: &mut FdState,
    me: usize,
    world_size: usize,
    tag: &str,
    fd: BorrowedFd<'_>,
    peers: &[usize],
    timeout: Duration,
    name_of: &dyn Fn(usize) -> String,
    pid_of: &dyn Fn(usize, Instant) -> Result<i32>,
) -> Result<Vec<(usize, OwnedFd)>> {
    let deadline = Instant::now() + timeout;
    if tag.len() > MAX_TAG {
        return Err(Error::Protocol(format!(
            "rank {me}: exchange_fds tag of {} bytes exceeds {MAX_TAG}",
            tag.len()
        )));
    }
    let others: BTreeSet<usize> = peers.iter().copied().filter(|&p| p != me).collect();
    if let Some(bad) = others.iter().find(|&&p| p >= world_size) {
        return Err(Error::Protocol(format!(
            "rank {me}: exchange_fds `{tag}`: peer {bad} is not below world size {world_size}"
        )));
    }
    let mut pids: HashMap<usize, i32> = HashMap::new();
    for &p in &others {
        pids.insert(p, pid_of(p, deadline)?);
    }
    for &p in &others {
        send_one(me, p, &name_of(p), pids[&p], tag, fd, deadline)?;
    }
    let mut got: HashMap<usize, OwnedFd> = HashMap::new();
    for &p in &others {
        if let Some(r) = state.stash.remove(&(tag.to_string(), p)) {
            got.insert(p, r.fd);
        }
    }
    let mut backoff = Duration::from_micros(200);
    while got.len() < others.len() {
        match state.listener.accept() {
            Ok((stream, _)) => {
                backoff = Duration::from_micros(200);
                let Some(msg) = read_message(me, stream, deadline)? else {
                    continue;
                };
                let who = format!(
                    "rank {me}: exchange_fds: message `{}` claiming to be from rank {}",
                    msg.tag, msg.sender
                );
                if msg.sender >= world_size || msg.sender == me {
                    return Err(Error::Protocol(format!("{who}: no such sender")));
                }
                let pid = match pids.get(&msg.sender) {
                    Some(&pid) => pid,
                    None => {
                        let pid = pid_of(msg.sender, deadline)?;
                        pids.insert(msg.sender, pid);
                        pid
                    }
                };
                check_cred(&msg.cred, &who, pid)?;
                if msg.tag == tag && others.contains(&msg.sender) {
                    if got.insert(msg.sender, msg.fd).is_some() {
                        return Err(Error::Protocol(format!("{who}: sent twice")));
                    }
                } else {
                    let key = (msg.tag.clone(), msg.sender);
                    if state.stash.insert(key, Received { fd: msg.fd }).is_some() {
                        log::warn!("{who}: replaced an earlier stashed message");
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if remaining(deadline).is_none() {
                    let missing = others.iter().copied().filter(|p| !got.contains_key(p));
                    return Err(Error::Timeout {
                        rank: me,
                        op: "exchange_fds",
                        key: tag.to_string(),
                        timeout,
                        missing: ranks_list(missing),
                    });
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(10));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::io(
                    format!(
                        "rank {me}: exchange_fds `{tag}`: accepting on @{}",
                        state.name
                    ),
                    e,
                ))
            }
        }
    }
    let mut out: Vec<(usize, OwnedFd)> = got.into_iter().collect();
    out.sort_by_key(|(r, _)| *r);
    Ok(out)
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
