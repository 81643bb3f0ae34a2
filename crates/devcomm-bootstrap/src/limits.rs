//! The bootstrap layer's resource limits, in one place (see docs/SECURITY.md for why each
//! exists).

use std::time::Duration;

/// Largest frame a connection may send before its `Hello` has been accepted (a hello is a few
/// dozen bytes plus the token); a longer length prefix is refused before anything is allocated.
pub const MAX_HELLO_FRAME: usize = 4096;

/// Time a new store connection has to deliver its whole `Hello` frame (one deadline for the
/// frame, not per read, so a client trickling bytes cannot hold a slot).
pub const HELLO_DEADLINE: Duration = Duration::from_secs(5);

/// Most store connections waiting to authenticate at once; when a new one arrives beyond this,
/// the oldest waiting one is dropped at once (a real rank sends its hello within a round trip,
/// so the connections that stay silent longest are the ones dropped).
pub const MAX_PENDING_AUTH: usize = 128;

/// Default largest frame (request or reply) between an authenticated client and the store.
/// A larger request is drained and refused; a larger reply is refused; the connection stays
/// usable in both cases.
pub const DEFAULT_MAX_FRAME: usize = 256 << 20;

/// Longest time the fd-passing receiver waits for a message on a connection from a process
/// that is not one of the expected senders before dropping that connection.
pub const FD_STRANGER_GRACE: Duration = Duration::from_millis(200);

/// Most accepted fd-passing connections the receiver keeps waiting for a message at once;
/// beyond this, the oldest one from an unexpected process is dropped.
pub const MAX_FD_PENDING: usize = 64;

/// Largest piece of a rank's output line the launcher buffers: a longer line is written in
/// pieces of this size, each with the rank prefix and ending in a newline.
pub const LINE_PIECE: usize = 64 << 10;

/// Limits of one [`crate::Store`], for [`crate::Store::connect_with`]; the default is what
/// [`crate::Store::connect`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreLimits {
    /// Largest frame this rank sends or accepts, and, on rank 0, the largest request or reply
    /// its store server handles (at least [`MAX_HELLO_FRAME`], at most [`DEFAULT_MAX_FRAME`]).
    pub max_frame: usize,
    /// On rank 0: how long a new connection has to deliver its whole hello.
    pub hello_deadline: Duration,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            max_frame: DEFAULT_MAX_FRAME,
            hello_deadline: HELLO_DEADLINE,
        }
    }
}

impl StoreLimits {
    /// Sets the frame limit.
    pub fn with_max_frame(mut self, max_frame: usize) -> Self {
        self.max_frame = max_frame;
        self
    }

    /// Sets the hello deadline.
    pub fn with_hello_deadline(mut self, deadline: Duration) -> Self {
        self.hello_deadline = deadline;
        self
    }

    /// Checks the ranges.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Protocol`] naming the field out of range.
    pub fn validate(&self) -> crate::Result<()> {
        if !(MAX_HELLO_FRAME..=DEFAULT_MAX_FRAME).contains(&self.max_frame) {
            return Err(crate::Error::Protocol(format!(
                "store limits: max_frame {} is not within {MAX_HELLO_FRAME}..={DEFAULT_MAX_FRAME}",
                self.max_frame
            )));
        }
        if self.hello_deadline.is_zero() || self.hello_deadline > Duration::from_secs(3600) {
            return Err(crate::Error::Protocol(format!(
                "store limits: hello_deadline {:?} is not within (0, 1 h]",
                self.hello_deadline
            )));
        }
        Ok(())
    }
}
