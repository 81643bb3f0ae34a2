//! The store client ([`Store`]) and the collectives built on it.

use std::fmt;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::fdpass::{self, FdState};
use crate::limits::StoreLimits;
use crate::server::{self, Server};
use crate::wire::{self, Frame, Refusal, Reply, Request};
use crate::{Error, RankInfo, Result};

/// Extra time a client allows past the server-side wait before deciding the server is gone.
const REPLY_MARGIN: Duration = Duration::from_secs(5);
/// Longest time rank 0's `Store` waits on drop for the other ranks to disconnect.
const MAX_LINGER: Duration = Duration::from_secs(60);

/// The key under which `rank` publishes its pid.
fn pid_key(rank: usize) -> String {
    format!("__devcomm/pid/{rank}")
}

/// The key of `rank`'s arrival at barrier `tag`.
fn barrier_key(tag: &str, rank: usize) -> String {
    format!("__devcomm/barrier/{tag}/{rank}")
}

/// The key of `rank`'s contribution to all-gather `tag`.
fn gather_key(tag: &str, rank: usize) -> String {
    format!("{tag}/{rank}")
}

#[derive(Debug)]
struct Client {
    stream: TcpStream,
    /// Set when a request failed midway: the stream may hold a late reply, so it is unusable.
    broken: Option<String>,
}

/// A client of the job's key-value store; rank 0's `Store` also hosts the server.
///
/// Every method takes `&self`; the connection sits behind a mutex, so a `Store` can be shared
/// between threads (requests from several threads are served one at a time). Operations
/// without a timeout argument (`set`, `add`) are bounded by the timeout given to
/// [`Store::connect`].
///
/// Keys starting with `__devcomm/` are reserved: `__devcomm/pid/<rank>` holds each rank's pid
/// and `__devcomm/barrier/<tag>/<rank>` the barrier arrivals. [`Store::all_gather`] uses
/// `<tag>/<rank>`.
///
/// Rank 0's `Store`, when dropped, waits (up to the connect timeout, at most a minute) for
/// the other ranks to close their connections, so that rank 0 finishing early does not pull
/// the store from under ranks still reading from it. The server threads are detached and do
/// not keep the process alive.
pub struct Store {
    info: RankInfo,
    timeout: Duration,
    limits: StoreLimits,
    client: Mutex<Client>,
    server: Option<Server>,
    fds: Mutex<FdState>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("rank", &self.info.rank)
            .field("world_size", &self.info.world_size)
            .field(
                "master",
                &format!("{}:{}", self.info.master_addr, self.info.master_port),
            )
            .field("hosts_server", &self.server.is_some())
            .finish_non_exhaustive()
    }
}

fn connect_tcp(info: &RankInfo, deadline: Instant, timeout: Duration) -> Result<TcpStream> {
    let target = format!("{}:{}", info.master_addr, info.master_port);
    let mut backoff = Duration::from_millis(10);
    let mut last_err: Option<String>;
    loop {
        match server::resolve(&info.master_addr, info.master_port) {
            Ok(addrs) => {
                last_err = None;
                for a in addrs {
                    let left = deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(10));
                    match TcpStream::connect_timeout(&a, left) {
                        Ok(s) => return Ok(s),
                        Err(e) => last_err = Some(format!("{a}: {e}")),
                    }
                }
            }
            Err(e) => last_err = Some(e.to_string()),
        }
        if Instant::now() + backoff > deadline {
            return Err(Error::Timeout {
                rank: info.rank,
                op: "connect",
                key: target.clone(),
                timeout,
                missing: format!(
                    "the store server (rank 0) at {target}; last error: {}",
                    last_err.unwrap_or_else(|| "none".into())
                ),
            });
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
}

impl Store {
    /// Joins the job's store (rank 0 starts the server first), presents the job token,
    /// publishes this process's pid, and opens the local fd-passing socket.
    ///
    /// Ranks other than 0 retry connecting until `timeout`, so ranks may start in any order.
    /// Rank 0 may use port 0: the server then listens on an ephemeral port, which
    /// [`Store::master_port`] reports.
    ///
    /// # Errors
    ///
    /// - [`Error::Env`] if `info` is inconsistent;
    /// - [`Error::Timeout`] (`op` "connect") if the server cannot be reached in time;
    /// - [`Error::BadToken`] if the server belongs to a job with another token;
    /// - [`Error::Protocol`] if the server refuses the hello for another reason (world size);
    /// - [`Error::Env`] on rank 0 if `MASTER_ADDR` is not an address of this host, or is
    ///   beyond loopback and there is no job token;
    /// - [`Error::Protocol`] if the rank already joined the store (from this or another
    ///   process);
    /// - [`Error::Env`] (`MASTER_PORT`) on rank 0 if the port is taken by another process;
    /// - [`Error::Io`] if rank 0 cannot bind the port otherwise, or the fd-passing socket is
    ///   taken.
    pub fn connect(info: &RankInfo, timeout: Duration) -> Result<Self> {
        Self::connect_with(info, timeout, StoreLimits::default())
    }

    /// Like [`Store::connect`] with other limits (a smaller frame limit, a shorter hello
    /// deadline on rank 0).
    ///
    /// # Errors
    ///
    /// As [`Store::connect`]; [`Error::Protocol`] if `limits` are out of range.
    pub fn connect_with(info: &RankInfo, timeout: Duration, limits: StoreLimits) -> Result<Self> {
        info.validate()?;
        limits.validate()?;
        let deadline = Instant::now() + timeout;
        let mut info = info.clone();
        let server = if info.rank == 0 {
            let s = Server::start(
                &info.master_addr,
                info.master_port,
                info.world_size,
                info.job_token.clone(),
                limits.max_frame,
                limits.hello_deadline,
            )?;
            info.master_port = s.port();
            Some(s)
        } else {
            None
        };
        let stream = connect_tcp(&info, deadline, timeout)?;
        let _ = stream.set_nodelay(true);
        let store = Store {
            fds: Mutex::new(FdState::bind(
                fdpass::socket_name(
                    &info.master_addr,
                    info.master_port,
                    info.job_token.as_deref(),
                    info.rank,
                ),
                info.rank,
            )?),
            client: Mutex::new(Client {
                stream,
                broken: None,
            }),
            timeout,
            limits,
            server,
            info,
        };
        let rank = store.info.rank;
        let hello = Request::Hello {
            rank: rank as u32,
            world_size: store.info.world_size as u32,
            token: store.info.job_token.clone(),
        };
        match store.request(&hello, "connect", "hello", timeout)? {
            Reply::Ok => {}
            other => return Err(store.unexpected("connect", "hello", other)),
        }
        store.set(&pid_key(rank), std::process::id().to_string().as_bytes())?;
        log::debug!(
            "rank {rank}: joined the store at {}:{}; fd socket @{}",
            store.info.master_addr,
            store.info.master_port,
            store.lock_fds().name()
        );
        Ok(store)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.info.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.info.world_size
    }

    /// The store's port: the one given, or for rank 0 with port 0, the ephemeral port chosen.
    pub fn master_port(&self) -> u16 {
        self.info.master_port
    }

    /// The rank information this store was joined with (with the actual port).
    pub fn info(&self) -> &RankInfo {
        &self.info
    }

    /// The abstract Unix socket name (without the leading NUL) this rank receives fds on.
    pub fn fd_socket_name(&self) -> String {
        self.lock_fds().name().to_string()
    }

    fn lock_client(&self) -> MutexGuard<'_, Client> {
        // A panic while holding the lock leaves at worst a half-done request, which
        // `request` detects through `broken`; the mutex itself stays usable.
        self.client.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_fds(&self) -> MutexGuard<'_, FdState> {
        // The stash is a map updated by single inserts/removes; still consistent after a panic.
        self.fds.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unexpected(&self, op: &str, key: &str, reply: Reply) -> Error {
        match reply {
            Reply::Refused {
                kind: Refusal::BadToken,
                message,
            } => Error::BadToken(message),
            Reply::Refused { message, .. } => Error::Protocol(format!(
                "rank {}: store {op} `{key}` refused: {message}",
                self.info.rank
            )),
            other => Error::Protocol(format!(
                "rank {}: store {op} `{key}`: unexpected reply {other:?}",
                self.info.rank
            )),
        }
    }

    /// Sends one request and reads its reply; `wait` is how long the server may take.
    fn request(&self, req: &Request, op: &'static str, key: &str, wait: Duration) -> Result<Reply> {
        let rank = self.info.rank;
        let mut client = self.lock_client();
        let ctx = |what: &str| {
            format!(
                "rank {rank}: store {op} `{key}`: {what} the server at {}:{}",
                self.info.master_addr, self.info.master_port
            )
        };
        if let Some(why) = &client.broken {
            return Err(Error::io(
                ctx("connection unusable after an earlier failure; talking to"),
                io::Error::new(io::ErrorKind::NotConnected, why.clone()),
            ));
        }
        let body = req.encode();
        let max = self.limits.max_frame;
        if body.len() > max {
            // Refused before anything is sent: the connection stays in step.
            return Err(Error::Protocol(format!(
                "rank {rank}: store {op} `{key}`: the request is {} bytes, over the frame limit \
                 of {max} bytes",
                body.len()
            )));
        }
        let limit = wait.saturating_add(REPLY_MARGIN);
        // Err((error, the stream is out of step and must not be used again)).
        let result = (|| {
            client
                .stream
                .set_write_timeout(Some(limit))
                .and_then(|()| client.stream.set_read_timeout(Some(limit)))
                .map_err(|e| (Error::io(ctx("configuring the connection to"), e), true))?;
            wire::write_frame(&mut client.stream, &body, max)
                .map_err(|e| (Error::io(ctx("sending to"), e), true))?;
            let frame = wire::read_frame_or_skip(&mut client.stream, max).map_err(|e| {
                let what = match e.kind() {
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
                        "connection closed by"
                    }
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "no reply in time from",
                    _ => "reading the reply from",
                };
                (Error::io(ctx(what), e), true)
            })?;
            let body = match frame {
                Frame::Body(b) => b,
                Frame::Oversize(len) => {
                    let what = format!(
                        "reply of {len} bytes exceeds this rank's frame limit of {max} bytes; from"
                    );
                    return Err((Error::Protocol(ctx(&what)), false));
                }
            };
            Reply::decode(&body)
                .map_err(|e| (Error::Protocol(ctx(&format!("bad reply ({e}) from"))), true))
        })();
        match result {
            Err((e, broken)) => {
                if broken {
                    client.broken = Some(e.to_string());
                }
                Err(e)
            }
            Ok(r @ Reply::Refused { .. }) if matches!(req, Request::Hello { .. }) => {
                client.broken = Some("the server refused the hello".into());
                Ok(r)
            }
            Ok(r) => Ok(r),
        }
    }

    fn timeout_error(
        &self,
        op: &'static str,
        key: &str,
        timeout: Duration,
        missing: String,
    ) -> Error {
        Error::Timeout {
            rank: self.info.rank,
            op,
            key: key.to_string(),
            timeout,
            missing,
        }
    }

    /// Sets `key` to `value` (overwrites).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the server cannot be reached (bounded by the connect timeout).
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let req = Request::Set {
            key: key.to_string(),
            value: value.to_vec(),
        };
        match self.request(&req, "set", key, Duration::ZERO)? {
            Reply::Ok => Ok(()),
            other => Err(self.unexpected("set", key, other)),
        }
    }

    /// Returns `key`'s value, waiting up to `timeout` for it to be set.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] (`missing` names the key) if it is not set in time; [`Error::Io`]
    /// if the server is gone.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let keys = [key.to_string()];
        match self.wait_raw(true, "get", key, &keys, timeout)? {
            Waited::Done(mut v) => v.pop().ok_or_else(|| {
                Error::Protocol(format!("rank {}: get `{key}`: empty reply", self.info.rank))
            }),
            Waited::Missing(m) => Err(self.timeout_error("get", key, timeout, keys_list(&m))),
        }
    }

    /// Server-side bounded wait for `keys`: with `fetch`, a `Get` returning the values, else
    /// a `Wait` (returning no values).
    fn wait_raw(
        &self,
        fetch: bool,
        op: &'static str,
        label: &str,
        keys: &[String],
        timeout: Duration,
    ) -> Result<Waited> {
        let keys = keys.to_vec();
        let timeout_ms = wire::millis(timeout);
        let req = if fetch {
            Request::Get { keys, timeout_ms }
        } else {
            Request::Wait { keys, timeout_ms }
        };
        match self.request(&req, op, label, timeout)? {
            Reply::Values(v) if fetch && v.len() == req_len(&req) => Ok(Waited::Done(v)),
            Reply::Ok if !fetch => Ok(Waited::Done(Vec::new())),
            Reply::Timeout { missing } => Ok(Waited::Missing(missing)),
            other => Err(self.unexpected(op, label, other)),
        }
    }

    /// Adds `delta` to the integer at `key` (absent = 0) and returns the new value. The value
    /// is stored as decimal text, so [`Store::get`] of the key returns e.g. `b"3"`.
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`] if the key holds something that is not a decimal integer;
    /// [`Error::Io`] if the server is gone.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let req = Request::Add {
            key: key.to_string(),
            delta,
        };
        match self.request(&req, "add", key, Duration::ZERO)? {
            Reply::Int(n) => Ok(n),
            other => Err(self.unexpected("add", key, other)),
        }
    }

    /// Waits until every key is set.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] whose `missing` lists the keys still unset (`"keys a, b"`);
    /// [`Error::Io`] if the server is gone.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let label = keys.join(", ");
        match self.wait_raw(false, "wait", &label, &keys, timeout)? {
            Waited::Done(_) => Ok(()),
            Waited::Missing(m) => Err(self.timeout_error("wait", &label, timeout, keys_list(&m))),
        }
    }

    /// Collective: every rank contributes `blob` under `tag`; returns all blobs by rank.
    /// A timeout names the ranks that did not contribute. `tag` must be unique per call.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] with `missing` like `"ranks 2, 3"`; [`Error::Io`] if the server is
    /// gone.
    pub fn all_gather(&self, tag: &str, blob: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.set(&gather_key(tag, self.info.rank), blob)?;
        let keys: Vec<String> = (0..self.info.world_size)
            .map(|r| gather_key(tag, r))
            .collect();
        match self.wait_raw(true, "all_gather", tag, &keys, timeout)? {
            Waited::Done(v) => Ok(v),
            Waited::Missing(m) => {
                Err(self.timeout_error("all_gather", tag, timeout, missing_ranks(&keys, &m)))
            }
        }
    }

    /// Collective: returns once every rank has entered the barrier `tag`; a timeout names the
    /// ranks that did not arrive.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] with `missing` like `"ranks 2, 3"`; [`Error::Io`] if the server is
    /// gone.
    pub fn barrier(&self, tag: &str, timeout: Duration) -> Result<()> {
        self.set(&barrier_key(tag, self.info.rank), &[])?;
        let keys: Vec<String> = (0..self.info.world_size)
            .map(|r| barrier_key(tag, r))
            .collect();
        match self.wait_raw(false, "barrier", tag, &keys, timeout)? {
            Waited::Done(_) => Ok(()),
            Waited::Missing(m) => {
                Err(self.timeout_error("barrier", tag, timeout, missing_ranks(&keys, &m)))
            }
        }
    }

    /// Collective among `peers` (global ranks on this host; may include this rank, which is
    /// skipped): sends `fd` to every other rank of `peers` over Unix sockets with
    /// `SCM_RIGHTS`, receives one fd from each, and checks each sender's credentials
    /// (same uid, and the pid that rank published). Returns `(rank, fd)` sorted by rank.
    ///
    /// Every rank sends first and receives afterwards; messages for other tags that arrive
    /// meanwhile are kept for the call that asks for them. Received fds are close-on-exec.
    ///
    /// # Errors
    ///
    /// - [`Error::Timeout`] (`op` "exchange_fds") naming the peers that never sent;
    /// - [`Error::Protocol`] if a peer is out of range, or a connection fails the credential
    ///   check (another uid, or a pid other than the one the claimed rank published);
    /// - [`Error::Io`] if a peer's socket cannot be reached.
    pub fn exchange_fds(
        &self,
        tag: &str,
        fd: BorrowedFd<'_>,
        peers: &[usize],
        timeout: Duration,
    ) -> Result<Vec<(usize, OwnedFd)>> {
        let info = &self.info;
        let name_of = |r: usize| {
            fdpass::socket_name(
                &info.master_addr,
                info.master_port,
                info.job_token.as_deref(),
                r,
            )
        };
        let pid_of = |r: usize, deadline: Instant| -> Result<i32> {
            let left = deadline.saturating_duration_since(Instant::now());
            let raw = self.get(&pid_key(r), left).map_err(|e| match e {
                Error::Timeout { .. } => Error::Timeout {
                    rank: info.rank,
                    op: "exchange_fds",
                    key: tag.to_string(),
                    timeout: left,
                    missing: format!("the pid of rank {r} (has it joined the store?)"),
                },
                e => e,
            })?;
            String::from_utf8_lossy(&raw).parse::<i32>().map_err(|_| {
                Error::Protocol(format!(
                    "rank {}: rank {r} published a malformed pid",
                    info.rank
                ))
            })
        };
        let mut fds = self.lock_fds();
        crate::fdrecv::exchange(
            &mut fds,
            info.rank,
            info.world_size,
            tag,
            fd,
            peers,
            timeout,
            &name_of,
            &pid_of,
        )
    }
}

/// The outcome of a server-side wait.
enum Waited {
    /// Every key was present (values for a `Get`, empty for a `Wait`).
    Done(Vec<Vec<u8>>),
    /// The wait expired with these keys missing.
    Missing(Vec<String>),
}

fn req_len(req: &Request) -> usize {
    match req {
        Request::Get { keys, .. } | Request::Wait { keys, .. } => keys.len(),
        _ => 0,
    }
}

/// "keys a, b".
fn keys_list(keys: &[String]) -> String {
    format!("keys {}", keys.join(", "))
}

/// Maps missing keys back to the ranks whose keys they are (`keys[r]` is rank r's): "ranks 2, 3".
fn missing_ranks(keys: &[String], missing: &[String]) -> String {
    let ranks = keys
        .iter()
        .enumerate()
        .filter(|(_, k)| missing.contains(k))
        .map(|(r, _)| r);
    fdpass::ranks_list(ranks)
}

impl Drop for Store {
    fn drop(&mut self) {
        let client = self.client.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = client.stream.shutdown(Shutdown::Both);
        if let Some(server) = &self.server {
            let left = server.linger(self.timeout.min(MAX_LINGER));
            if left > 0 {
                log::warn!(
                    "rank 0: leaving the store with {left} rank(s) still connected; they will \
                     see the server disappear"
                );
            }
        }
    }
}
