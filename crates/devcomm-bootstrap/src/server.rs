//! The store server hosted by rank 0: a listener thread and a thread per connection sharing a
//! `Mutex<HashMap>` and a `Condvar`. Threads are detached: they serve until the process exits
//! and never hold it up. Server-side waits are bounded by the timeout the client sends.
//!
//! Resources are bounded before a client has shown the job token: its `Hello` frame may be at
//! most [`MAX_HELLO_FRAME`] bytes and must arrive whole within the hello deadline, and at most
//! [`MAX_PENDING_AUTH`] connections wait to authenticate at once (a newcomer beyond that
//! drops the oldest waiting one). After the hello, each rank may join once, so the store
//! holds at most `MAX_PENDING_AUTH + world size` connections (and threads).

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::auth;
use crate::limits::{MAX_HELLO_FRAME, MAX_PENDING_AUTH};
use crate::wire::{self, Frame, Refusal, Reply, Request};
use crate::{Error, Result};

/// Longest server-side wait honoured, whatever the client asks (guards `Instant` overflow).
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
/// Longest time the server blocks writing a refusal to a client that does not read.
const REFUSAL_WRITE: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct State {
    kv: HashMap<String, Vec<u8>>,
    /// Connections that passed `Hello` and are still open.
    clients: usize,
    /// The peer address each rank joined from (a rank joins once).
    joined: HashMap<u32, String>,
}

/// Connections accepted but not yet past their hello, oldest first.
#[derive(Debug, Default)]
struct Gate {
    next_id: u64,
    pending: VecDeque<(u64, Arc<TcpStream>)>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    cond: Condvar,
    gate: Mutex<Gate>,
    token: Option<String>,
    world_size: usize,
    max_frame: usize,
    hello_deadline: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A handler thread that panicked mid-update leaves a map that is still consistent
        // (each operation is a single insert), so a poisoned lock is safe to keep using.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_gate(&self) -> MutexGuard<'_, Gate> {
        // Pushes and removes only: consistent after a panic.
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new connection as waiting for its hello; when the gate is full, the oldest
    /// waiting connection is shut down (its thread then ends). Returns the connection's id.
    fn admit(&self, stream: &Arc<TcpStream>) -> u64 {
        let mut gate = self.lock_gate();
        while gate.pending.len() >= MAX_PENDING_AUTH {
            if let Some((_, old)) = gate.pending.pop_front() {
                log::debug!(
                    "store server: {} connections waiting for a hello; dropping the oldest",
                    MAX_PENDING_AUTH
                );
                let _ = old.shutdown(Shutdown::Both);
            }
        }
        let id = gate.next_id;
        gate.next_id += 1;
        gate.pending.push_back((id, Arc::clone(stream)));
        id
    }

    /// Removes a connection from the gate (no-op if it was already dropped from it).
    fn leave_gate(&self, id: u64) {
        self.lock_gate().pending.retain(|(i, _)| *i != id);
    }
}

/// Handle on the running server, held by rank 0's `Store`.
#[derive(Debug)]
pub(crate) struct Server {
    port: u16,
    shared: Arc<Shared>,
}

/// Resolves `addr:port` to socket addresses.
pub(crate) fn resolve(addr: &str, port: u16) -> Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = (addr, port)
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("resolving MASTER_ADDR {addr}:{port}"), e))?
        .collect();
    if addrs.is_empty() {
        return Err(Error::io(
            format!("resolving MASTER_ADDR {addr}:{port}"),
            io::Error::new(io::ErrorKind::NotFound, "no addresses"),
        ));
    }
    Ok(addrs)
}

/// Binds a listener. std's `TcpListener::bind` sets `SO_REUSEADDR` on Unix before binding
/// (so a restarted job can reuse a port in `TIME_WAIT`); a test checks it.
fn bind_reuse(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr)
}

/// Why rank 0 cannot host the store on a port that another process holds, and what to do.
fn addr_in_use(addr: &str, port: u16, a: SocketAddr) -> String {
    format!(
        "rank 0 cannot host the store on {addr}:{port} ({a}): port {port} is already taken by \
         another process (another job, or the store of torch.distributed or torchrun on the \
         same MASTER_PORT). Choose a free MASTER_PORT, start the ranks with `devcomm launch` \
         (which picks a free port), or from Python call devcomm.init() after \
         torch.distributed.init_process_group or under torchrun, where it joins through \
         torch's store (docs/PYTHON.md)"
    )
}

/// Binds the first address `addr` resolves to that the store may listen on and that belongs
/// to this host; never falls back to another address.
fn bind_master(addr: &str, port: u16, has_token: bool) -> Result<TcpListener> {
    let mut first_err: Option<Error> = None;
    for a in resolve(addr, port)? {
        let err = match auth::check_listen(addr, a.ip(), has_token) {
            Err(e) => e,
            Ok(()) => match bind_reuse(a) {
                Ok(l) => return Ok(l),
                Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => Error::Env {
                    var: "MASTER_ADDR",
                    reason: format!(
                        "{addr} ({}) is not an address of this host: the rank that hosts the \
                         store (rank 0) must run on the host MASTER_ADDR names",
                        a.ip()
                    ),
                },
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => Error::Env {
                    var: "MASTER_PORT",
                    reason: addr_in_use(addr, port, a),
                },
                Err(e) => Error::io(
                    format!("rank 0: binding the store server on {addr}:{port} ({a})"),
                    e,
                ),
            },
        };
        first_err.get_or_insert(err);
    }
    Err(first_err.unwrap_or_else(|| {
        Error::io(
            format!("rank 0: binding the store server on {addr}:{port}"),
            io::Error::other("no address to bind"),
        )
    }))
}

impl Server {
    /// Binds `addr:port` (with `SO_REUSEADDR`; port 0 picks one) and starts serving. Frames
    /// after the hello may be up to `max_frame` bytes; a hello must arrive within
    /// `hello_deadline`.
    ///
    /// # Errors
    ///
    /// - [`Error::Env`] (`MASTER_ADDR`) when the address is not one of this host's;
    /// - [`Error::Env`] (`DEVCOMM_JOB_TOKEN`) when it is beyond loopback and there is no token;
    /// - [`Error::Io`] when the address cannot be resolved or bound.
    pub(crate) fn start(
        addr: &str,
        port: u16,
        world_size: usize,
        token: Option<String>,
        max_frame: usize,
        hello_deadline: Duration,
    ) -> Result<Server> {
        let listener = bind_master(addr, port, token.is_some())?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::io("rank 0: reading the store server's port", e))?
            .port();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            gate: Mutex::new(Gate::default()),
            token,
            world_size,
            max_frame,
            hello_deadline,
        });
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("devcomm-store".into())
            .spawn(move || accept_loop(listener, s))
            .map_err(|e| Error::io("rank 0: starting the store server thread", e))?;
        log::debug!("store server listening on {addr}:{port}");
        Ok(Server { port, shared })
    }

    /// The port the server listens on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Waits until every client connection has closed, up to `timeout`; returns how many are
    /// still open.
    pub(crate) fn linger(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout.min(MAX_WAIT);
        let mut st = self.shared.lock();
        while st.clients > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st = match self.shared.cond.wait_timeout(st, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        st.clients
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let stream = Arc::new(stream);
                let id = shared.admit(&stream);
                let s = Arc::clone(&shared);
                let spawned = std::thread::Builder::new()
                    .name("devcomm-store-conn".into())
                    .spawn(move || serve(stream, id, s));
                if let Err(e) = spawned {
                    log::warn!("store server: cannot start a connection thread: {e}");
                    shared.leave_gate(id);
                }
            }
            Err(e) => {
                log::warn!("store server: accept failed: {e}");
                // EMFILE and friends: back off rather than spin.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Decrements the client count when a registered connection ends.
struct ClientGuard(Arc<Shared>);

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.0.lock().clients -= 1;
        self.0.cond.notify_all();
    }
}

/// Reads with one deadline for everything read through it (not a timeout per read).
struct DeadlineReader<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self
            .deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "hello deadline passed"))?;
        self.stream.set_read_timeout(Some(left))?;
        let mut s = self.stream;
        s.read(buf)
    }
}

fn send(stream: &TcpStream, reply: &Reply, limit: usize) -> io::Result<()> {
    let mut s = stream;
    wire::write_frame(&mut s, &reply.encode(), limit)
}

/// Sends a refusal and closes the connection.
fn refuse(stream: &TcpStream, kind: Refusal, message: String) {
    log::warn!("store server: refusing a connection: {message}");
    let _ = stream.set_write_timeout(Some(REFUSAL_WRITE));
    let _ = send(stream, &Reply::Refused { kind, message }, usize::MAX);
    let _ = stream.shutdown(Shutdown::Both);
}

/// Reads and checks the hello; returns the rank, or `None` after refusing the connection.
fn authenticate(stream: &TcpStream, peer: &str, shared: &Shared) -> Option<u32> {
    let mut r = DeadlineReader {
        stream,
        deadline: Instant::now() + shared.hello_deadline,
    };
    let hello = wire::read_frame(&mut r, MAX_HELLO_FRAME)
        .map_err(|e| match e.kind() {
            io::ErrorKind::InvalidData => format!("{e} before the job token was checked"),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => format!(
                "no complete hello within {:?} of connecting",
                shared.hello_deadline
            ),
            _ => e.to_string(),
        })
        .and_then(|b| Request::decode(&b));
    let (rank, world_size, token) = match hello {
        Ok(Request::Hello {
            rank,
            world_size,
            token,
        }) => (rank, world_size, token),
        Ok(other) => {
            let op = format!("{other:?}");
            let op = op.split([' ', '{']).next().unwrap_or("?");
            let msg = format!("{peer}: first message must be Hello, got {op}");
            refuse(stream, Refusal::Protocol, msg);
            return None;
        }
        Err(e) => {
            refuse(stream, Refusal::Protocol, format!("{peer}: bad hello: {e}"));
            return None;
        }
    };
    if !auth::tokens_match(shared.token.as_deref(), token.as_deref()) {
        let what = match (&shared.token, &token) {
            (_, None) => "no job token",
            (None, Some(_)) => "a job token to a store that has none",
            (Some(_), Some(_)) => "a different job token",
        };
        let msg = format!("rank {rank} from {peer} presented {what} (not this job's)");
        refuse(stream, Refusal::BadToken, msg);
        return None;
    }
    if world_size as usize != shared.world_size || rank >= world_size {
        let msg = format!(
            "rank {rank} from {peer} has world size {world_size}, the store's is {}",
            shared.world_size
        );
        refuse(stream, Refusal::Protocol, msg);
        return None;
    }
    let mut st = shared.lock();
    if let Some(first) = st.joined.get(&rank) {
        let msg = format!(
            "rank {rank} from {peer}: rank {rank} already joined this store (from {first}); a \
             rank joins once"
        );
        drop(st);
        refuse(stream, Refusal::Protocol, msg);
        return None;
    }
    st.joined.insert(rank, peer.to_string());
    st.clients += 1;
    Some(rank)
}

fn serve(stream: Arc<TcpStream>, id: u64, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let rank = authenticate(&stream, &peer, &shared);
    shared.leave_gate(id);
    let Some(rank) = rank else { return };
    let _guard = ClientGuard(Arc::clone(&shared));
    // Past the hello, clients may be idle for as long as they like.
    let _ = stream.set_read_timeout(None);
    let limit = shared.max_frame;
    if send(&stream, &Reply::Ok, limit).is_err() {
        return;
    }
    loop {
        let frame = match wire::read_frame_or_skip(&mut &*stream, limit) {
            Ok(f) => f,
            Err(e) => {
                if e.kind() != io::ErrorKind::UnexpectedEof {
                    log::debug!("store server: rank {rank} connection ended: {e}");
                }
                return;
            }
        };
        let reply = match frame {
            Frame::Oversize(len) => Reply::Refused {
                kind: Refusal::TooLarge,
                message: format!(
                    "request of {len} bytes exceeds the store's frame limit of {limit} bytes"
                ),
            },
            Frame::Body(body) => match Request::decode(&body) {
                Ok(req) => handle(&shared, req),
                Err(e) => {
                    let msg = format!("rank {rank}: bad request: {e}");
                    refuse(&stream, Refusal::Protocol, msg);
                    return;
                }
            },
        };
        let sent = match send(&stream, &reply, limit) {
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                // Only a reply whose size was not checked beforehand gets here.
                let message = format!("reply exceeds the store's frame limit of {limit} bytes");
                send(&stream, &too_large(message), limit)
            }
            other => other,
        };
        if let Err(e) = sent {
            log::debug!("store server: rank {rank}: cannot reply: {e}");
            return;
        }
    }
}

fn too_large(message: String) -> Reply {
    Reply::Refused {
        kind: Refusal::TooLarge,
        message,
    }
}

/// Waits until every key is present or the deadline passes; returns the guard and the keys
/// still missing.
fn wait_keys<'a>(
    shared: &'a Shared,
    keys: &[String],
    timeout_ms: u64,
) -> (MutexGuard<'a, State>, Vec<String>) {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms).min(MAX_WAIT);
    let mut st = shared.lock();
    loop {
        let missing: Vec<String> = keys
            .iter()
            .filter(|k| !st.kv.contains_key(k.as_str()))
            .cloned()
            .collect();
        let now = Instant::now();
        if missing.is_empty() || now >= deadline {
            return (st, missing);
        }
        st = match shared.cond.wait_timeout(st, deadline - now) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        };
    }
}

/// The new value of an `Add`, or why there is none.
pub(crate) fn add_value(key: &str, current: Option<&[u8]>, delta: i64) -> Result<i64, String> {
    let current = match current {
        None => 0,
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| format!("add: key `{key}` does not hold a decimal integer"))?,
    };
    current.checked_add(delta).ok_or_else(|| {
        format!("add: key `{key}` holds {current}; adding {delta} overflows a 64-bit integer")
    })
}

fn handle(shared: &Shared, req: Request) -> Reply {
    match req {
        Request::Hello { .. } => Reply::Refused {
            kind: Refusal::Protocol,
            message: "Hello sent twice".into(),
        },
        Request::Set { key, value } => {
            shared.lock().kv.insert(key, value);
            shared.cond.notify_all();
            Reply::Ok
        }
        Request::Add { key, delta } => {
            let mut st = shared.lock();
            match add_value(&key, st.kv.get(&key).map(Vec::as_slice), delta) {
                Ok(new) => {
                    st.kv.insert(key, new.to_string().into_bytes());
                    drop(st);
                    shared.cond.notify_all();
                    Reply::Int(new)
                }
                Err(message) => Reply::Refused {
                    kind: Refusal::Protocol,
                    message,
                },
            }
        }
        Request::Get { keys, timeout_ms } => {
            let (st, missing) = wait_keys(shared, &keys, timeout_ms);
            if !missing.is_empty() {
                return Reply::Timeout { missing };
            }
            // Indexing cannot panic: `missing` is empty and the lock is still held.
            let size = keys
                .iter()
                .fold(5usize, |n, k| n.saturating_add(4 + st.kv[k.as_str()].len()));
            if size > shared.max_frame {
                return too_large(format!(
                    "the reply ({} values, {size} bytes) exceeds the store's frame limit of {} \
                     bytes",
                    keys.len(),
                    shared.max_frame
                ));
            }
            Reply::Values(keys.iter().map(|k| st.kv[k.as_str()].clone()).collect())
        }
        Request::Wait { keys, timeout_ms } => {
            let (_st, missing) = wait_keys(shared, &keys, timeout_ms);
            if missing.is_empty() {
                Reply::Ok
            } else {
                Reply::Timeout { missing }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{getsockopt, sockopt};

    #[test]
    fn listener_has_reuseaddr() {
        let l = bind_reuse(([127, 0, 0, 1], 0).into()).expect("bind");
        assert!(getsockopt(&l, sockopt::ReuseAddr).expect("getsockopt"));
    }

    #[test]
    fn add_is_checked() {
        assert_eq!(add_value("k", None, 5), Ok(5));
        assert_eq!(add_value("k", Some(b"-3"), 1), Ok(-2));
        assert_eq!(
            add_value("k", Some(b"9223372036854775806"), 1),
            Ok(i64::MAX)
        );
        let e = add_value("k", Some(b"9223372036854775807"), 1).unwrap_err();
        assert!(e.contains("overflows") && e.contains("`k`"), "{e}");
        let e = add_value("k", Some(b"-9223372036854775808"), -1).unwrap_err();
        assert!(e.contains("overflows"), "{e}");
        assert!(add_value("k", Some(b"abc"), 1)
            .unwrap_err()
            .contains("decimal"));
    }

    #[test]
    fn a_master_addr_of_another_host_is_an_error_not_every_interface() {
        // 192.0.2.0/24 is TEST-NET-1: never an address of this host.
        match bind_master("192.0.2.1", 0, true) {
            Err(Error::Env { var, reason }) => {
                assert_eq!(var, "MASTER_ADDR");
                assert!(reason.contains("not an address of this host"), "{reason}");
            }
            other => panic!("expected a MASTER_ADDR error, got {other:?}"),
        }
        match bind_master("0.0.0.0", 0, false) {
            Err(Error::Env { var, .. }) => assert_eq!(var, "DEVCOMM_JOB_TOKEN"),
            other => panic!("expected a token error, got {other:?}"),
        }
        assert!(bind_master("127.0.0.1", 0, false).is_ok());
    }

    #[test]
    fn a_taken_port_is_named_with_what_to_do() {
        let held = bind_reuse(([127, 0, 0, 1], 0).into()).expect("bind");
        let port = held.local_addr().expect("addr").port();
        match bind_master("127.0.0.1", port, false) {
            Err(Error::Env { var, reason }) => {
                assert_eq!(var, "MASTER_PORT");
                for part in [&format!("port {port}"), "already taken", "devcomm launch"] {
                    assert!(reason.contains(part), "{part}: {reason}");
                }
            }
            other => panic!("expected a MASTER_PORT error, got {other:?}"),
        }
    }
}
