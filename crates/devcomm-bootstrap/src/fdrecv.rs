//! The receiving side of fd passing: accepting connections on this rank's socket, checking
//! each peer's credentials as soon as it is accepted, and matching messages to senders.
//!
//! Abstract Unix sockets have no permission check, so anyone on the host can connect. A
//! connection from another uid is dropped at once. One from a process that is not an expected
//! sender gets [`FD_STRANGER_GRACE`] to send its message (a rank of this job sending for a
//! later tag does so right after connecting; its message is then checked and stashed), and is
//! dropped otherwise. Connections wait side by side without blocking each other, so a
//! stranger that connects first and stays silent does not delay the real sender's message.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::{self, IoSliceMut, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::sys::socket::{self as sock, sockopt, ControlMessageOwned, MsgFlags, UnixCredentials};

use crate::fdpass::{
    check_cred, our_uid, ranks_list, remaining, send_one, FdState, Received, FD_MAGIC, MAX_TAG,
};
use crate::limits::{FD_STRANGER_GRACE, MAX_FD_PENDING};
use crate::{Error, Result};

/// One message read off an accepted connection, not yet verified.
struct Incoming {
    tag: String,
    sender: usize,
    fd: OwnedFd,
}

/// An accepted connection whose message has not arrived yet.
struct Waiting {
    stream: UnixStream,
    cred: UnixCredentials,
    /// The peer's pid is one that an expected sender published.
    expected: bool,
    /// When the connection is dropped if it has sent nothing.
    limit: Instant,
}

/// What a look at a waiting connection found.
enum Poll {
    /// Nothing yet.
    Pending,
    /// Closed without a message (a sender that gave up).
    Closed,
    /// A whole message.
    Message(Incoming),
}

/// Reads the message of `stream` if it has started to arrive (never blocks before the first
/// byte; the rest of a started message is awaited until `limit`).
fn poll_message(me: usize, stream: &UnixStream, limit: Instant) -> Result<Poll> {
    let ctx = |what: &str| format!("rank {me}: exchange_fds: {what}");
    let mut buf = vec![0u8; 12 + MAX_TAG];
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let (n, fds, truncated) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = match sock::recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {
                return Ok(Poll::Pending)
            }
            Err(e) => return Err(Error::io(ctx("receiving a message"), e.into())),
        };
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
    if n == 0 && fds.is_empty() {
        return Ok(Poll::Closed);
    }
    let mut n = n;
    let fill = |buf: &mut [u8], n: &mut usize, want: usize| -> Result<()> {
        if *n < want {
            let left = remaining(limit).unwrap_or(Duration::from_millis(1));
            let mut s = stream;
            s.set_nonblocking(false)
                .and_then(|()| s.set_read_timeout(Some(left)))
                .and_then(|()| s.read_exact(&mut buf[*n..want]))
                .map_err(|e| Error::io(ctx("reading a message header"), e))?;
            *n = want;
        }
        Ok(())
    };
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
    Ok(Poll::Message(Incoming { tag, sender, fd }))
}

/// The receiving loop's state for one call.
struct Receiver<'a> {
    me: usize,
    world_size: usize,
    tag: &'a str,
    deadline: Instant,
    others: &'a BTreeSet<usize>,
    pids: HashMap<usize, i32>,
    /// Pids the expected senders published.
    expected_pids: HashSet<i32>,
    pid_of: &'a dyn Fn(usize, Instant) -> Result<i32>,
    waiting: Vec<Waiting>,
    got: HashMap<usize, OwnedFd>,
    /// Why connections were dropped (reported if the call times out).
    dropped: Vec<String>,
}

impl Receiver<'_> {
    fn drop_conn(&mut self, why: String) {
        log::warn!("rank {}: exchange_fds `{}`: {why}", self.me, self.tag);
        self.dropped.push(why);
    }

    /// Checks the credentials of a newly accepted connection and queues it.
    fn admit(&mut self, stream: UnixStream) -> Result<()> {
        let cred = sock::getsockopt(&stream, sockopt::PeerCredentials).map_err(|e| {
            Error::io(
                format!("rank {}: exchange_fds: reading SO_PEERCRED", self.me),
                e.into(),
            )
        })?;
        if cred.uid() != our_uid() {
            let why = format!(
                "dropped a connection from pid {} of uid {} (not ours)",
                cred.pid(),
                cred.uid()
            );
            self.drop_conn(why);
            return Ok(());
        }
        let expected = self.expected_pids.contains(&cred.pid());
        if !expected && self.waiting.len() >= MAX_FD_PENDING {
            match self.waiting.iter().position(|w| !w.expected) {
                Some(i) => {
                    let old = self.waiting.remove(i);
                    let why = format!("dropped a waiting connection from pid {}", old.cred.pid());
                    self.drop_conn(why);
                }
                None => {
                    let why = format!("dropped a connection from pid {} (queue full)", cred.pid());
                    self.drop_conn(why);
                    return Ok(());
                }
            }
        }
        let limit = if expected {
            self.deadline
        } else {
            self.deadline.min(Instant::now() + FD_STRANGER_GRACE)
        };
        self.waiting.push(Waiting {
            stream,
            cred,
            expected,
            limit,
        });
        Ok(())
    }

    /// Verifies a message and files it (result or stash). Errors only for a connection from an
    /// expected sender's pid; a stranger's bad message is dropped.
    fn take(&mut self, w: &Waiting, msg: Incoming, state: &mut FdState) -> Result<()> {
        let me = self.me;
        let who = format!(
            "rank {me}: exchange_fds: message `{}` claiming to be from rank {} (pid {})",
            msg.tag,
            msg.sender,
            w.cred.pid()
        );
        let checked = (|| {
            if msg.sender >= self.world_size || msg.sender == me {
                return Err(Error::Protocol(format!("{who}: no such sender")));
            }
            let pid = match self.pids.get(&msg.sender) {
                Some(&pid) => pid,
                None => {
                    let by = if w.expected { self.deadline } else { w.limit };
                    let pid = (self.pid_of)(msg.sender, by)?;
                    self.pids.insert(msg.sender, pid);
                    pid
                }
            };
            check_cred(&w.cred, &who, pid)
        })();
        if let Err(e) = checked {
            if w.expected {
                return Err(e);
            }
            self.drop_conn(format!("dropped: {e}"));
            return Ok(());
        }
        if msg.tag == self.tag && self.others.contains(&msg.sender) {
            if self.got.insert(msg.sender, msg.fd).is_some() {
                return Err(Error::Protocol(format!("{who}: sent twice")));
            }
        } else {
            let key = (msg.tag.clone(), msg.sender);
            if state.stash.insert(key, Received { fd: msg.fd }).is_some() {
                log::warn!("{who}: replaced an earlier stashed message");
            }
        }
        Ok(())
    }

    /// Looks at every waiting connection once; returns whether anything happened.
    fn poll_all(&mut self, state: &mut FdState) -> Result<bool> {
        let mut progress = false;
        let mut i = 0;
        while i < self.waiting.len() {
            let w = &self.waiting[i];
            let polled = poll_message(self.me, &w.stream, w.limit);
            match polled {
                Ok(Poll::Pending) if Instant::now() < w.limit => {
                    i += 1;
                    continue;
                }
                Ok(Poll::Pending) => {
                    let w = self.waiting.remove(i);
                    if !w.expected {
                        let why = format!(
                            "dropped a connection from pid {} that sent nothing within {:?}",
                            w.cred.pid(),
                            FD_STRANGER_GRACE
                        );
                        self.drop_conn(why);
                    }
                }
                Ok(Poll::Closed) => {
                    self.waiting.remove(i);
                    log::debug!("rank {}: exchange_fds: a connection closed empty", self.me);
                }
                Ok(Poll::Message(msg)) => {
                    let w = self.waiting.remove(i);
                    self.take(&w, msg, state)?;
                }
                Err(e) => {
                    let w = self.waiting.remove(i);
                    if w.expected {
                        return Err(e);
                    }
                    self.drop_conn(format!("dropped: {e}"));
                }
            }
            progress = true;
        }
        Ok(progress)
    }
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
    let mut rx = Receiver {
        me,
        world_size,
        tag,
        deadline,
        others: &others,
        expected_pids: pids.values().copied().collect(),
        pids,
        pid_of,
        waiting: Vec::new(),
        got: HashMap::new(),
        dropped: Vec::new(),
    };
    for &p in &others {
        if let Some(r) = state.stash.remove(&(tag.to_string(), p)) {
            rx.got.insert(p, r.fd);
        }
    }
    let mut backoff = Duration::from_micros(200);
    while rx.got.len() < others.len() {
        let mut progress = false;
        loop {
            match state.listener.accept() {
                Ok((stream, _)) => {
                    progress = true;
                    rx.admit(stream)?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(Error::io(
                        format!(
                            "rank {me}: exchange_fds `{tag}`: accepting on @{}",
                            state.name()
                        ),
                        e,
                    ))
                }
            }
        }
        progress |= rx.poll_all(state)?;
        if rx.got.len() == others.len() {
            break;
        }
        if remaining(deadline).is_none() {
            let missing = ranks_list(others.iter().copied().filter(|p| !rx.got.contains_key(p)));
            let missing = match rx.dropped.len() {
                0 => missing,
                n => format!(
                    "{missing} (meanwhile {n} connection(s) dropped, e.g. {})",
                    rx.dropped[0]
                ),
            };
            return Err(Error::Timeout {
                rank: me,
                op: "exchange_fds",
                key: tag.to_string(),
                timeout,
                missing,
            });
        }
        if progress {
            backoff = Duration::from_micros(200);
        } else {
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(10));
        }
    }
    let mut out: Vec<(usize, OwnedFd)> = rx.got.into_iter().collect();
    out.sort_by_key(|(r, _)| *r);
    Ok(out)
}
