//! The launcher behind `devcomm launch -n N -- CMD`: starts N ranks of a single-host job.
//!
//! Each rank gets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE` (equal to the global
//! ones), `MASTER_ADDR`, `MASTER_PORT` and a fresh random `DEVCOMM_JOB_TOKEN`, on top of the
//! launcher's own environment and [`LaunchOptions::env`]. Its stdin is `/dev/null`; its stdout
//! and stderr are read line by line and written to the launcher's stdout and stderr with the
//! prefix `[rank R] ` (whole lines at a time, so lines of different ranks never mix).
//!
//! A line longer than [`LINE_PIECE`] bytes is written in pieces of that size, each with the
//! prefix and a newline, so a rank printing without newlines cannot make the launcher buffer
//! without bound.
//!
//! Each rank runs in its own process group, so that stopping a rank also stops whatever it
//! started. When a rank exits with a non-zero code or is killed by a signal, the launcher sends
//! `SIGTERM` to every rank's group (also the groups of ranks that already exited, where their
//! background children may still run), `SIGKILL` after [`LaunchOptions::kill_grace`], and
//! returns the failing rank's code (128 + signal number for a signal). `SIGINT`, `SIGTERM` and
//! `SIGHUP` sent to the launcher while it runs are forwarded to every rank the same way.
//!
//! Ranks die with the launcher: each is started with `PR_SET_PDEATHSIG` = `SIGKILL` (and
//! checks, right after setting it, that the launcher is still its parent), so killing the
//! launcher, even with `SIGKILL`, kills every rank. The parent-death signal belongs to the
//! thread that started the rank, which is the thread running [`launch`] until every rank has
//! exited; it is not inherited by a rank's own children, which a rank must stop itself.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::unistd::Pid;

use crate::limits::LINE_PIECE;
use crate::{Error, Result};

/// How often the launcher polls its children.
const POLL: Duration = Duration::from_millis(10);
/// How long the launcher waits for output still buffered in the pipes after every rank exited
/// (a grandchild may hold a pipe open).
const DRAIN: Duration = Duration::from_secs(2);

/// What to launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOptions {
    /// Number of ranks.
    pub nprocs: usize,
    /// Address of rank 0's store, passed as `MASTER_ADDR`.
    pub master_addr: String,
    /// Port of rank 0's store; `None` picks a free one.
    pub master_port: Option<u16>,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Extra environment variables for every rank (the rank variables take precedence).
    pub env: Vec<(String, String)>,
    /// How long ranks get between `SIGTERM` and `SIGKILL` when the job is stopped.
    pub kill_grace: Duration,
}

impl LaunchOptions {
    /// `nprocs` ranks of `command` on `127.0.0.1`, a free port, no extra environment, 5 s grace.
    pub fn new(nprocs: usize, command: Vec<String>) -> Self {
        LaunchOptions {
            nprocs,
            master_addr: "127.0.0.1".to_string(),
            master_port: None,
            command,
            env: Vec::new(),
            kill_grace: Duration::from_secs(5),
        }
    }
}

/// The result of [`launch_captured`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOutput {
    /// What [`launch`] would return.
    pub code: i32,
    /// The ranks' prefixed stdout lines.
    pub stdout: Vec<u8>,
    /// The ranks' prefixed stderr lines and the launcher's summary line.
    pub stderr: Vec<u8>,
}

/// Runs the job and returns its exit code: 0 when every rank exited with 0, otherwise the
/// first failing rank's code (128 + signal number if it was killed by a signal), or 128 + the
/// signal that interrupted the launcher.
///
/// # Errors
///
/// [`Error::Io`] if `nprocs` is 0, the command is empty, no free port can be found, or a rank
/// cannot be started (ranks already started are killed first).
pub fn launch(opts: LaunchOptions) -> Result<i32> {
    run(opts, Sink::Stdout, Sink::Stderr)
}

/// Like [`launch`], but collects the prefixed output instead of writing it to this process's
/// stdout and stderr (for tests and tools).
///
/// # Errors
///
/// As [`launch`].
pub fn launch_captured(opts: LaunchOptions) -> Result<LaunchOutput> {
    let out = Arc::new(Mutex::new(Vec::new()));
    let err = Arc::new(Mutex::new(Vec::new()));
    let code = run(
        opts,
        Sink::Buffer(Arc::clone(&out)),
        Sink::Buffer(Arc::clone(&err)),
    )?;
    let take =
        |b: &Arc<Mutex<Vec<u8>>>| std::mem::take(&mut *b.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(LaunchOutput {
        code,
        stdout: take(&out),
        stderr: take(&err),
    })
}

/// Where prefixed lines go.
#[derive(Debug, Clone)]
enum Sink {
    Stdout,
    Stderr,
    Buffer(Arc<Mutex<Vec<u8>>>),
}

impl Sink {
    /// Writes one whole line under the sink's lock. Write errors (a closed pipe) are ignored:
    /// the ranks' output keeps being drained so that they never block on a full pipe.
    fn write_line(&self, line: &[u8]) {
        match self {
            Sink::Stdout => {
                let mut o = io::stdout().lock();
                let _ = o.write_all(line).and_then(|()| o.flush());
            }
            Sink::Stderr => {
                let mut o = io::stderr().lock();
                let _ = o.write_all(line).and_then(|()| o.flush());
            }
            Sink::Buffer(b) => b
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(line),
        }
    }
}

/// Copies `reader` to `sink` line by line with the rank prefix; signals `done` at the end.
/// A line longer than [`LINE_PIECE`] bytes is written in pieces of that size, each prefixed
/// and ended with a newline, so memory stays bounded whatever a rank prints.
fn pump(rank: usize, reader: impl Read, sink: Sink, done: mpsc::Sender<()>) {
    let prefix = format!("[rank {rank}] ");
    let mut reader = BufReader::with_capacity(LINE_PIECE, reader);
    let mut line = Vec::with_capacity(prefix.len() + LINE_PIECE + 1);
    line.extend_from_slice(prefix.as_bytes());
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::debug!("launcher: reading rank {rank}'s output: {e}");
                break;
            }
        };
        if buf.is_empty() {
            break;
        }
        let room = prefix.len() + LINE_PIECE - line.len();
        // Up to `room` bytes of text plus the newline that may end them.
        let window = &buf[..buf.len().min(room + 1)];
        let (used, complete) = match window.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => {
                let used = window.len().min(room);
                (used, used == room)
            }
        };
        line.extend_from_slice(&buf[..used]);
        reader.consume(used);
        if complete {
            if line.last() != Some(&b'\n') {
                line.push(b'\n');
            }
            sink.write_line(&line);
            line.truncate(prefix.len());
        }
    }
    if line.len() > prefix.len() {
        line.push(b'\n');
        sink.write_line(&line);
    }
    let _ = done.send(());
}

/// The last signal received while forwarding is installed (0: none).
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Number of running launches, and the dispositions to restore when the last one ends.
static FORWARDING: Mutex<(usize, Vec<(Signal, SigAction)>)> = Mutex::new((0, Vec::new()));

extern "C" fn on_signal(sig: libc::c_int) {
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
}

/// Installs the forwarding handlers while alive (shared by concurrent launches).
struct SignalForwarding;

impl SignalForwarding {
    fn install() -> Self {
        let mut f = FORWARDING.lock().unwrap_or_else(|p| p.into_inner());
        if f.0 == 0 {
            PENDING_SIGNAL.store(0, Ordering::SeqCst);
            let action = SigAction::new(
                SigHandler::Handler(on_signal),
                SaFlags::SA_RESTART,
                SigSet::empty(),
            );
            for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
                // SAFETY: `on_signal` only stores to an atomic, which is async-signal-safe, and
                // the previous disposition is saved and restored when the last launch ends.
                match unsafe { signal::sigaction(sig, &action) } {
                    Ok(old) => f.1.push((sig, old)),
                    Err(e) => log::warn!("launcher: cannot forward {sig}: {e}"),
                }
            }
        }
        f.0 += 1;
        SignalForwarding
    }
}

impl Drop for SignalForwarding {
    fn drop(&mut self) {
        let mut f = FORWARDING.lock().unwrap_or_else(|p| p.into_inner());
        f.0 -= 1;
        if f.0 == 0 {
            for (sig, old) in f.1.drain(..) {
                // SAFETY: restores the disposition saved by `install`, which was valid then.
                let _ = unsafe { signal::sigaction(sig, &old) };
            }
            PENDING_SIGNAL.store(0, Ordering::SeqCst);
        }
    }
}

fn invalid(what: &str) -> Error {
    Error::io(
        "launch",
        io::Error::new(io::ErrorKind::InvalidInput, what.to_string()),
    )
}

/// Picks a free TCP port on `addr` (bind port 0, read it, release it).
fn free_port(addr: &str) -> Result<u16> {
    let l = TcpListener::bind((addr, 0))
        .map_err(|e| Error::io(format!("launch: finding a free port on {addr}"), e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io(format!("launch: finding a free port on {addr}"), e))
}

/// Exit code of a status: the code, or 128 + the signal.
fn exit_code(status: &ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

fn describe(status: &ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => match Signal::try_from(s) {
            Ok(sig) => format!("was killed by {sig}"),
            Err(_) => format!("was killed by signal {s}"),
        },
        (None, None) => format!("ended with {status}"),
    }
}

struct Rank {
    child: Child,
    status: Option<ExitStatus>,
}

/// Signals the process group of every rank, reaped or not: background children of a rank
/// that has already exited stay in its group. (A group id is not reused while any member of
/// the group lives; once the group is empty, the signal finds nobody.)
fn signal_all(ranks: &[Rank], sig: Signal) {
    for r in ranks {
        let pgid = Pid::from_raw(r.child.id() as i32);
        if let Err(e) = signal::killpg(pgid, sig) {
            if e != nix::errno::Errno::ESRCH {
                log::warn!("launcher: {sig} to process group {pgid}: {e}");
            }
        }
    }
}

fn run(opts: LaunchOptions, out: Sink, err: Sink) -> Result<i32> {
    if opts.nprocs == 0 {
        return Err(invalid("nprocs must be at least 1"));
    }
    let Some((program, args)) = opts.command.split_first() else {
        return Err(invalid("the command is empty"));
    };
    let port = match opts.master_port {
        Some(p) => p,
        None => free_port(&opts.master_addr)?,
    };
    let token = crate::fresh_token();
    let n = opts.nprocs;
    let _forwarding = SignalForwarding::install();
    let (done_tx, done_rx) = mpsc::channel();
    let mut ranks: Vec<Rank> = Vec::with_capacity(n);
    for rank in 0..n {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(opts.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", &opts.master_addr)
            .env("MASTER_PORT", port.to_string())
            .env("DEVCOMM_JOB_TOKEN", &token)
            // A launch inside a torchrun worker: the ranks use the launcher's port, not
            // torchrun's agent store.
            .env_remove(crate::env::AGENT_STORE_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let launcher = nix::unistd::getpid().as_raw();
        // SAFETY: the closure runs in the child between fork and exec; it only calls prctl
        // and getppid (async-signal-safe) and builds an io::Error from an errno number, which
        // does not allocate.
        unsafe {
            cmd.pre_exec(move || {
                // The rank dies with the launcher, even when the launcher is SIGKILLed.
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // The launcher may have died before the prctl: then nothing would signal us.
                if libc::getppid() != launcher {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                signal_all(&ranks, Signal::SIGKILL);
                for r in &mut ranks {
                    let _ = r.child.wait();
                }
                return Err(Error::io(
                    format!("launch: starting rank {rank}: `{}`", opts.command.join(" ")),
                    e,
                ));
            }
        };
        let pipes = [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ];
        for (pipe, sink) in pipes.into_iter().zip([out.clone(), err.clone()]) {
            let Some(pipe) = pipe else { continue };
            let tx = done_tx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("devcomm-launch-{rank}"))
                .spawn(move || pump(rank, pipe, sink, tx));
            if let Err(e) = spawned {
                log::warn!("launcher: cannot start an output thread for rank {rank}: {e}");
            }
        }
        ranks.push(Rank {
            child,
            status: None,
        });
    }
    drop(done_tx);

    let mut first_failure: Option<(usize, ExitStatus)> = None;
    let mut interrupted: Option<i32> = None;
    let mut stopping_since: Option<Instant> = None;
    let mut killed = false;
    loop {
        for (rank, r) in ranks.iter_mut().enumerate() {
            if r.status.is_some() {
                continue;
            }
            match r.child.try_wait() {
                Ok(Some(status)) => {
                    r.status = Some(status);
                    let failed = !status.success();
                    if failed && first_failure.is_none() && stopping_since.is_none() {
                        first_failure = Some((rank, status));
                    }
                }
                Ok(None) => {}
                Err(e) => log::warn!("launcher: waiting for rank {rank}: {e}"),
            }
        }
        let running = ranks.iter().filter(|r| r.status.is_none()).count();
        if running == 0 {
            if first_failure.is_some() && stopping_since.is_none() {
                // The last rank failed: the groups of the others may hold background children.
                signal_all(&ranks, Signal::SIGTERM);
            }
            break;
        }
        if stopping_since.is_none() {
            let sig = PENDING_SIGNAL.load(Ordering::SeqCst);
            if sig != 0 {
                interrupted = Some(sig);
                let fwd = Signal::try_from(sig).unwrap_or(Signal::SIGTERM);
                signal_all(&ranks, fwd);
                stopping_since = Some(Instant::now());
            } else if first_failure.is_some() {
                signal_all(&ranks, Signal::SIGTERM);
                stopping_since = Some(Instant::now());
            }
        }
        if let Some(since) = stopping_since {
            if !killed && since.elapsed() >= opts.kill_grace {
                signal_all(&ranks, Signal::SIGKILL);
                killed = true;
            }
        }
        std::thread::sleep(POLL);
    }

    // Let the output threads finish what is still in the pipes, but do not wait on a
    // grandchild that keeps a pipe open.
    let drain_deadline = Instant::now() + DRAIN;
    loop {
        let left = drain_deadline.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(()) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                log::warn!("launcher: output pipes still open after every rank exited");
                break;
            }
        }
    }

    let code = if let Some((rank, status)) = first_failure {
        let others = n - 1;
        let stopped = if others > 0 {
            format!("; stopped the other {others} rank(s)")
        } else {
            String::new()
        };
        err.write_line(
            format!(
                "devcomm launch: rank {rank} {}{stopped}\n",
                describe(&status)
            )
            .as_bytes(),
        );
        exit_code(&status)
    } else if let Some(sig) = interrupted {
        err.write_line(
            format!("devcomm launch: interrupted by signal {sig}; stopped all {n} rank(s)\n")
                .as_bytes(),
        );
        128 + sig
    } else {
        0
    };
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(nprocs: usize, script: &str) -> LaunchOptions {
        let mut o = LaunchOptions::new(nprocs, vec!["sh".into(), "-c".into(), script.into()]);
        o.kill_grace = Duration::from_millis(300);
        o
    }

    fn lines(b: &[u8]) -> Vec<String> {
        String::from_utf8_lossy(b)
            .lines()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn exit_codes_of_statuses() {
        assert_eq!(exit_code(&ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(&ExitStatus::from_raw(9)), 137);
        assert!(describe(&ExitStatus::from_raw(9)).contains("SIGKILL"));
        assert_eq!(
            describe(&ExitStatus::from_raw(2 << 8)),
            "exited with code 2"
        );
    }

    #[test]
    fn rejects_empty_command_and_zero_ranks() {
        assert!(launch(LaunchOptions::new(0, vec!["true".into()])).is_err());
        assert!(launch(LaunchOptions::new(1, vec![])).is_err());
        let e = launch(LaunchOptions::new(
            2,
            vec!["/nonexistent/devcomm-prog".into()],
        ))
        .expect_err("cannot start");
        assert!(e.to_string().contains("rank 0"), "{e}");
    }

    #[test]
    fn partial_lines_and_environment() {
        let mut o = sh(2, r#"printf 'a%s' "$RANK"; printf 'x' >&2; echo "$FOO""#);
        o.env.push(("FOO".into(), "bar".into()));
        o.env.push(("RANK".into(), "ignored".into()));
        let r = launch_captured(o).expect("launch");
        assert_eq!(r.code, 0);
        let mut out = lines(&r.stdout);
        out.sort();
        assert_eq!(out, ["[rank 0] a0bar", "[rank 1] a1bar"]);
        let mut err = lines(&r.stderr);
        err.sort();
        assert_eq!(err, ["[rank 0] x", "[rank 1] x"]);
    }

    #[test]
    fn a_line_without_newline_is_written_in_prefixed_pieces() {
        // 300,000 bytes without a newline, then a short line: 4 full pieces, the rest, "end".
        let o = sh(1, "head -c 300000 /dev/zero | tr '\\0' a; echo; echo end");
        let r = launch_captured(o).expect("launch");
        assert_eq!(r.code, 0);
        let out = lines(&r.stdout);
        let sizes: Vec<usize> = out.iter().map(|l| l.len()).collect();
        let p = "[rank 0] ".len();
        let rest = 300_000 - 4 * LINE_PIECE;
        assert_eq!(
            sizes,
            [
                p + LINE_PIECE,
                p + LINE_PIECE,
                p + LINE_PIECE,
                p + LINE_PIECE,
                p + rest,
                p + 3
            ]
        );
        assert!(out.iter().all(|l| l.starts_with("[rank 0] ")));
        assert_eq!(out[5], "[rank 0] end");
    }
}
