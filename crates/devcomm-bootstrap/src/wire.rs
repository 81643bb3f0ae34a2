//! The store's wire format: length-prefixed frames and the request/reply encoding.
//!
//! A frame is a little-endian `u32` byte count followed by the body. A body starts with an
//! opcode byte; then come the fields: `u32`/`u64`/`i64` little-endian, byte strings and strings
//! as a `u32` length plus the bytes, lists as a `u32` count plus the items, options as a `0`/`1`
//! byte plus the value.

use std::io::{self, Read, Write};
use std::time::Duration;

/// The first field of `Hello`: "DCM1".
pub(crate) const MAGIC: u32 = 0x3144_4344;
/// Protocol version sent in `Hello`.
pub(crate) const VERSION: u32 = 1;
/// Writes one frame (length prefix and body, in one `write_all`); a body over `limit` bytes is
/// an `InvalidInput` error and nothing is written.
pub(crate) fn write_frame(w: &mut impl Write, body: &[u8], limit: usize) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| l as usize <= limit)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "frame of {} bytes exceeds the {limit}-byte limit",
                    body.len()
                ),
            )
        })?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(body);
    w.write_all(&buf)?;
    w.flush()
}

fn read_len(r: &mut impl Read) -> io::Result<usize> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    Ok(u32::from_le_bytes(len) as usize)
}

/// Reads one frame body of at most `limit` bytes. A clean end of stream before the prefix is
/// `UnexpectedEof`; a longer length prefix is `InvalidData`, returned before anything is
/// allocated or read past the prefix.
pub(crate) fn read_frame(r: &mut impl Read, limit: usize) -> io::Result<Vec<u8>> {
    let len = read_len(r)?;
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame length {len} exceeds the {limit}-byte limit"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(body)
}

/// A frame read by [`read_frame_or_skip`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// The body.
    Body(Vec<u8>),
    /// The frame was longer than the limit: its body (this many bytes) was read and discarded,
    /// so the stream is still at a frame boundary.
    Oversize(usize),
}

/// Reads one frame; a body over `limit` bytes is read in small pieces and discarded (never
/// held whole), so that the caller can refuse it and keep using the stream.
pub(crate) fn read_frame_or_skip(r: &mut impl Read, limit: usize) -> io::Result<Frame> {
    let len = read_len(r)?;
    if len <= limit {
        let mut body = vec![0u8; len];
        r.read_exact(&mut body)?;
        return Ok(Frame::Body(body));
    }
    let skipped = io::copy(&mut r.take(len as u64), &mut io::sink())?;
    if skipped < len as u64 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("stream ended {skipped} bytes into an oversize frame of {len} bytes"),
        ));
    }
    Ok(Frame::Oversize(len))
}

/// A client request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// First message of a connection.
    Hello {
        rank: u32,
        world_size: u32,
        token: Option<String>,
    },
    /// Set a key.
    Set { key: String, value: Vec<u8> },
    /// Wait (server side, bounded) until every key is present, reply with the values.
    Get { keys: Vec<String>, timeout_ms: u64 },
    /// Add to an integer key, reply with the new value.
    Add { key: String, delta: i64 },
    /// Wait (server side, bounded) until every key is present.
    Wait { keys: Vec<String>, timeout_ms: u64 },
}

/// Why the server refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Job token mismatch.
    BadToken = 1,
    /// Anything else that is not the protocol.
    Protocol = 2,
    /// A request or its reply exceeds the frame limit (the connection stays usable).
    TooLarge = 3,
}

/// A server reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Done.
    Ok,
    /// The values of a `Get`, in request order.
    Values(Vec<Vec<u8>>),
    /// The new value of an `Add`.
    Int(i64),
    /// The wait expired; these keys were still missing.
    Timeout { missing: Vec<String> },
    /// The request was refused (after a refused `Hello` the server closes the connection).
    Refused { kind: Refusal, message: String },
}

/// Converts a timeout for the wire (milliseconds, rounded up).
pub(crate) fn millis(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if d.as_nanos() % 1_000_000 != 0 {
        ms + 1
    } else {
        ms
    };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn len(&mut self, n: usize) -> &mut Self {
        // Frames are capped (below 4 GiB) when written, so a longer item fails there.
        self.u32(u32::try_from(n).unwrap_or(u32::MAX))
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.len(v.len());
        self.0.extend_from_slice(v);
        self
    }
    fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
    fn strs(&mut self, v: &[String]) -> &mut Self {
        self.len(v.len());
        for s in v {
            self.str(s);
        }
        self
    }
}

/// A decoding failure: what was wrong.
pub(crate) type DecodeError = String;

struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| {
            format!(
                "truncated message: {what} needs {n} bytes at offset {}, frame has {}",
                self.pos,
                self.buf.len()
            )
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, DecodeError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn i64(&mut self, what: &str) -> Result<i64, DecodeError> {
        Ok(self.u64(what)? as i64)
    }
    fn bytes(&mut self, what: &str) -> Result<Vec<u8>, DecodeError> {
        let n = self.u32(what)? as usize;
        Ok(self.take(n, what)?.to_vec())
    }
    fn str(&mut self, what: &str) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes(what)?).map_err(|_| format!("{what} is not UTF-8"))
    }
    fn count(&mut self, what: &str) -> Result<usize, DecodeError> {
        let n = self.u32(what)? as usize;
        // Every item takes at least 4 bytes; a larger count is garbage, not a huge allocation.
        if n > (self.buf.len() - self.pos) / 4 {
            return Err(format!("{what}: count {n} exceeds the frame"));
        }
        Ok(n)
    }
    fn strs(&mut self, what: &str) -> Result<Vec<String>, DecodeError> {
        let n = self.count(what)?;
        (0..n).map(|_| self.str(what)).collect()
    }
    fn finish(&self) -> Result<(), DecodeError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(format!(
                "{} trailing bytes after the message",
                self.buf.len() - self.pos
            ))
        }
    }
}

const OP_HELLO: u8 = 1;
const OP_SET: u8 = 2;
const OP_GET: u8 = 3;
const OP_ADD: u8 = 4;
const OP_WAIT: u8 = 5;

const RE_OK: u8 = 0x80;
const RE_VALUES: u8 = 0x81;
const RE_INT: u8 = 0x82;
const RE_TIMEOUT: u8 = 0x83;
const RE_REFUSED: u8 = 0x84;

impl Request {
    /// Encodes the request as a frame body.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        match self {
            Request::Hello {
                rank,
                world_size,
                token,
            } => {
                e.u8(OP_HELLO)
                    .u32(MAGIC)
                    .u32(VERSION)
                    .u32(*rank)
                    .u32(*world_size);
                match token {
                    None => e.u8(0),
                    Some(t) => e.u8(1).str(t),
                };
            }
            Request::Set { key, value } => {
                e.u8(OP_SET).str(key).bytes(value);
            }
            Request::Get { keys, timeout_ms } => {
                e.u8(OP_GET).strs(keys).u64(*timeout_ms);
            }
            Request::Add { key, delta } => {
                e.u8(OP_ADD).str(key).i64(*delta);
            }
            Request::Wait { keys, timeout_ms } => {
                e.u8(OP_WAIT).strs(keys).u64(*timeout_ms);
            }
        }
        e.0
    }

    /// Decodes a frame body.
    pub(crate) fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut d = Dec { buf, pos: 0 };
        let req = match d.u8("opcode")? {
            OP_HELLO => {
                let magic = d.u32("magic")?;
                if magic != MAGIC {
                    return Err(format!("bad magic {magic:#x}: not a devcomm store client"));
                }
                let version = d.u32("version")?;
                if version != VERSION {
                    return Err(format!(
                        "protocol version {version}, this server speaks {VERSION}"
                    ));
                }
                let rank = d.u32("rank")?;
                let world_size = d.u32("world size")?;
                let token = match d.u8("token flag")? {
                    0 => None,
                    1 => Some(d.str("token")?),
                    f => return Err(format!("bad token flag {f}")),
                };
                Request::Hello {
                    rank,
                    world_size,
                    token,
                }
            }
            OP_SET => Request::Set {
                key: d.str("key")?,
                value: d.bytes("value")?,
            },
            OP_GET => Request::Get {
                keys: d.strs("keys")?,
                timeout_ms: d.u64("timeout")?,
            },
            OP_ADD => Request::Add {
                key: d.str("key")?,
                delta: d.i64("delta")?,
            },
            OP_WAIT => Request::Wait {
                keys: d.strs("keys")?,
                timeout_ms: d.u64("timeout")?,
            },
            op => return Err(format!("unknown request opcode {op:#x}")),
        };
        d.finish()?;
        Ok(req)
    }
}

impl Reply {
    /// Encodes the reply as a frame body.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        match self {
            Reply::Ok => {
                e.u8(RE_OK);
            }
            Reply::Values(vs) => {
                e.u8(RE_VALUES).len(vs.len());
                for v in vs {
                    e.bytes(v);
                }
            }
            Reply::Int(v) => {
                e.u8(RE_INT).i64(*v);
            }
            Reply::Timeout { missing } => {
                e.u8(RE_TIMEOUT).strs(missing);
            }
            Reply::Refused { kind, message } => {
                e.u8(RE_REFUSED).u8(*kind as u8).str(message);
            }
        }
        e.0
    }

    /// Decodes a frame body.
    pub(crate) fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut d = Dec { buf, pos: 0 };
        let reply = match d.u8("opcode")? {
            RE_OK => Reply::Ok,
            RE_VALUES => {
                let n = d.count("values")?;
                Reply::Values((0..n).map(|_| d.bytes("value")).collect::<Result<_, _>>()?)
            }
            RE_INT => Reply::Int(d.i64("integer")?),
            RE_TIMEOUT => Reply::Timeout {
                missing: d.strs("missing keys")?,
            },
            RE_REFUSED => {
                let kind = match d.u8("refusal kind")? {
                    1 => Refusal::BadToken,
                    3 => Refusal::TooLarge,
                    _ => Refusal::Protocol,
                };
                Reply::Refused {
                    kind,
                    message: d.str("message")?,
                }
            }
            op => return Err(format!("unknown reply opcode {op:#x}")),
        };
        d.finish()?;
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: usize = 1 << 20;

    fn requests() -> Vec<Request> {
        vec![
            Request::Hello {
                rank: 3,
                world_size: 4,
                token: Some("tok".into()),
            },
            Request::Hello {
                rank: 0,
                world_size: 1,
                token: None,
            },
            Request::Set {
                key: "a/b".into(),
                value: vec![0, 1, 2, 255],
            },
            Request::Set {
                key: String::new(),
                value: vec![],
            },
            Request::Get {
                keys: vec!["x".into(), "y".into()],
                timeout_ms: 1500,
            },
            Request::Add {
                key: "n".into(),
                delta: -7,
            },
            Request::Wait {
                keys: vec![],
                timeout_ms: u64::MAX,
            },
        ]
    }

    fn replies() -> Vec<Reply> {
        vec![
            Reply::Ok,
            Reply::Values(vec![vec![], vec![1, 2, 3]]),
            Reply::Int(i64::MIN),
            Reply::Timeout {
                missing: vec!["t/2".into(), "t/3".into()],
            },
            Reply::Refused {
                kind: Refusal::BadToken,
                message: "wrong job".into(),
            },
            Reply::Refused {
                kind: Refusal::Protocol,
                message: "huh".into(),
            },
        ]
    }

    #[test]
    fn requests_round_trip() {
        for r in requests() {
            assert_eq!(Request::decode(&r.encode()), Ok(r.clone()), "{r:?}");
        }
    }

    #[test]
    fn replies_round_trip() {
        for r in replies() {
            assert_eq!(Reply::decode(&r.encode()), Ok(r.clone()), "{r:?}");
        }
    }

    #[test]
    fn frames_round_trip_through_a_stream() {
        let mut stream = Vec::new();
        for r in requests() {
            write_frame(&mut stream, &r.encode(), L).expect("write");
        }
        let mut cursor = io::Cursor::new(stream);
        for r in requests() {
            let body = read_frame(&mut cursor, L).expect("read");
            assert_eq!(Request::decode(&body), Ok(r));
        }
        let eof = read_frame(&mut cursor, L).unwrap_err();
        assert_eq!(eof.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn frame_layout_is_length_prefixed_little_endian() {
        let mut out = Vec::new();
        write_frame(&mut out, b"abc", L).expect("write");
        assert_eq!(out, [3, 0, 0, 0, b'a', b'b', b'c']);
    }

    #[test]
    fn truncated_and_oversized_frames_are_errors() {
        let mut cursor = io::Cursor::new(vec![10, 0, 0, 0, 1, 2]);
        assert_eq!(
            read_frame(&mut cursor, L).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        let big = (L as u32 + 1).to_le_bytes();
        let mut cursor = io::Cursor::new(big.to_vec());
        assert_eq!(
            read_frame(&mut cursor, L).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        let e = write_frame(&mut Vec::new(), &[0; 9], 8).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn oversize_frames_are_skipped_and_the_stream_stays_aligned() {
        let mut stream = Vec::new();
        write_frame(&mut stream, &[7; 100], L).expect("write");
        write_frame(&mut stream, b"next", L).expect("write");
        let mut cursor = io::Cursor::new(stream);
        assert_eq!(
            read_frame_or_skip(&mut cursor, 10).expect("skip"),
            Frame::Oversize(100)
        );
        assert_eq!(
            read_frame_or_skip(&mut cursor, 10).expect("read"),
            Frame::Body(b"next".to_vec())
        );
        // A stream that ends inside an oversize frame is an error, not a skipped frame.
        let mut cursor = io::Cursor::new(vec![100, 0, 0, 0, 1, 2, 3]);
        assert_eq!(
            read_frame_or_skip(&mut cursor, 10).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn refusal_kinds_round_trip() {
        for kind in [Refusal::BadToken, Refusal::Protocol, Refusal::TooLarge] {
            let r = Reply::Refused {
                kind,
                message: "m".into(),
            };
            assert_eq!(Reply::decode(&r.encode()), Ok(r.clone()));
        }
    }

    #[test]
    fn malformed_bodies_are_rejected() {
        // Every strict prefix of a valid message is truncated.
        for r in requests() {
            let body = r.encode();
            for cut in 0..body.len() {
                assert!(Request::decode(&body[..cut]).is_err(), "{r:?} cut at {cut}");
            }
        }
        // Trailing garbage.
        let mut body = Request::Add {
            key: "k".into(),
            delta: 1,
        }
        .encode();
        body.push(0);
        assert!(Request::decode(&body).unwrap_err().contains("trailing"));
        // Unknown opcode and bad magic.
        assert!(Request::decode(&[0x7f]).unwrap_err().contains("opcode"));
        let mut hello = Request::Hello {
            rank: 0,
            world_size: 1,
            token: None,
        }
        .encode();
        hello[1] ^= 0xff;
        assert!(Request::decode(&hello).unwrap_err().contains("magic"));
        // A huge count does not allocate.
        let mut get = vec![OP_GET];
        get.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Request::decode(&get).unwrap_err().contains("count"));
    }

    #[test]
    fn millis_rounds_up() {
        assert_eq!(millis(Duration::from_millis(5)), 5);
        assert_eq!(millis(Duration::from_micros(5001)), 6);
        assert_eq!(millis(Duration::ZERO), 0);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
