//! The store server hosted by rank 0: a listener thread and a thread per connection sharing a
//! `Mutex<HashMap>` and a `Condvar`. Threads are detached: they serve until the process exits
//! and never hold it up. Server-side waits are bounded by the timeout the client sends.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::wire::{self, Refusal, Reply, Request};
use crate::{Error, Result};

/// Longest server-side wait honoured, whatever the client asks (guards `Instant` overflow).
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Default)]
struct State {
    kv: HashMap<String, Vec<u8>>,
    /// Connections that passed `Hello` and are still open.
    clients: usize,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    cond: Condvar,
    token: Option<String>,
    world_size: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A handler thread that panicked mid-update leaves a map that is still consistent
        // (each operation is a single insert), so a poisoned lock is safe to keep using.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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

impl Server {
    /// Binds `addr:port` (with `SO_REUSEADDR`; port 0 picks one) and starts serving. If the
    /// address is not local to this host, binds every interface on that port instead.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the address cannot be resolved or bound.
    pub(crate) fn start(
        addr: &str,
        port: u16,
        world_size: usize,
        token: Option<String>,
    ) -> Result<Server> {
        let addrs = resolve(addr, port)?;
        let mut last = None;
        let mut listener = None;
        for a in &addrs {
            match bind_reuse(*a) {
                Ok(l) => {
                    listener = Some(l);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
                    let any: SocketAddr = if a.is_ipv4() {
                        ([0, 0, 0, 0], port).into()
                    } else {
                        (std::net::Ipv6Addr::UNSPECIFIED, port).into()
                    };
                    match bind_reuse(any) {
                        Ok(l) => {
                            listener = Some(l);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                Err(e) => last = Some(e),
            }
        }
        let listener = match listener {
            Some(l) => l,
            None => {
                return Err(Error::io(
                    format!("rank 0: binding the store server on {addr}:{port}"),
                    last.unwrap_or_else(|| io::Error::other("no address to bind")),
                ))
            }
        };
        let port = listener
            .local_addr()
            .map_err(|e| Error::io("rank 0: reading the store server's port", e))?
            .port();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            token,
            world_size,
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
                let s = Arc::clone(&shared);
                let spawned = std::thread::Builder::new()
                    .name("devcomm-store-conn".into())
                    .spawn(move || serve(stream, s));
                if let Err(e) = spawned {
                    log::warn!("store server: cannot start a connection thread: {e}");
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

fn send(stream: &mut TcpStream, reply: &Reply) -> io::Result<()> {
    wire::write_frame(stream, &reply.encode())
}

fn refuse(stream: &mut TcpStream, kind: Refusal, message: String) {
    log::warn!("store server: refusing a connection: {message}");
    let _ = send(stream, &Reply::Refused { kind, message });
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn serve(mut stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    // The hello must come promptly; afterwards clients may be idle for as long as they like.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let hello = wire::read_frame(&mut stream)
        .map_err(|e| e.to_string())
        .and_then(|b| Request::decode(&b));
    let rank = match hello {
        Ok(Request::Hello {
            rank,
            world_size,
            token,
        }) => {
            if shared.token.is_some() && token != shared.token {
                let what = if token.is_none() { "no" } else { "a different" };
                refuse(
                    &mut stream,
                    Refusal::BadToken,
                    format!("rank {rank} from {peer} presented {what} job token (not this job's)"),
                );
                return;
            }
            if world_size as usize != shared.world_size || rank >= world_size {
                refuse(
                    &mut stream,
                    Refusal::Protocol,
                    format!(
                        "rank {rank} from {peer} has world size {world_size}, the store's is {}",
                        shared.world_size
                    ),
                );
                return;
            }
            rank
        }
        Ok(other) => {
            refuse(
                &mut stream,
                Refusal::Protocol,
                format!("{peer}: first message must be Hello, got {other:?}"),
            );
            return;
        }
        Err(e) => {
            refuse(
                &mut stream,
                Refusal::Protocol,
                format!("{peer}: bad hello: {e}"),
            );
            return;
        }
    };
    let _ = stream.set_read_timeout(None);
    shared.lock().clients += 1;
    let _guard = ClientGuard(Arc::clone(&shared));
    if send(&mut stream, &Reply::Ok).is_err() {
        return;
    }
    loop {
        let body = match wire::read_frame(&mut stream) {
            Ok(b) => b,
            Err(e) => {
                if e.kind() != io::ErrorKind::UnexpectedEof {
                    log::debug!("store server: rank {rank} connection ended: {e}");
                }
                return;
            }
        };
        let reply = match Request::decode(&body) {
            Ok(req) => handle(&shared, req),
            Err(e) => {
                refuse(
                    &mut stream,
                    Refusal::Protocol,
                    format!("rank {rank}: bad request: {e}"),
                );
                return;
            }
        };
        if let Err(e) = send(&mut stream, &reply) {
            log::debug!("store server: rank {rank}: cannot reply: {e}");
            return;
        }
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
            let current = match st.kv.get(&key) {
                None => 0,
                Some(v) => match std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                {
                    Some(n) => n,
                    None => {
                        return Reply::Refused {
                            kind: Refusal::Protocol,
                            message: format!("add: key `{key}` does not hold a decimal integer"),
                        }
                    }
                },
            };
            let new = current.wrapping_add(delta);
            st.kv.insert(key, new.to_string().into_bytes());
            drop(st);
            shared.cond.notify_all();
            Reply::Int(new)
        }
        Request::Get { keys, timeout_ms } => {
            let (st, missing) = wait_keys(shared, &keys, timeout_ms);
            if !missing.is_empty() {
                return Reply::Timeout { missing };
            }
            // Indexing cannot panic: `missing` is empty and the lock is still held.
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
}
