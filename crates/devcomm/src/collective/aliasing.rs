//! Aliasing of a collective's buffers: which may overlap. Pure, so every rule has a unit test.
//!
//! An all-to-all(-v) reads its send buffer while the peers write the receive buffer (and the
//! kernel writes the received counts and offsets), so no buffer that is written may overlap
//! any other buffer of the call: the result would depend on timing, silently. The rule depends
//! only on the buffers' relative layout, so ranks that pass alike refuse alike.

/// One buffer of a call: its name, device address, bytes, and whether the call writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Buf {
    pub name: &'static str,
    pub ptr: u64,
    pub bytes: u64,
    pub written: bool,
}

/// Byte ranges `[a, a + an)` and `[b, b + bn)` overlap (empty ranges overlap nothing).
pub(crate) fn overlap(a: u64, an: u64, b: u64, bn: u64) -> bool {
    an > 0 && bn > 0 && a < b.saturating_add(bn) && b < a.saturating_add(an)
}

/// The first pair of buffers that overlap where one of them is written, as a message naming
/// both ranges; `None` when the call may go on. Null (absent) buffers are skipped.
pub(crate) fn first_written_overlap(bufs: &[Buf]) -> Option<String> {
    for (i, a) in bufs.iter().enumerate() {
        for b in &bufs[i + 1..] {
            let present = a.ptr != 0 && b.ptr != 0;
            if present && (a.written || b.written) && overlap(a.ptr, a.bytes, b.ptr, b.bytes) {
                return Some(format!(
                    "{} [{:#x}, +{}) and {} [{:#x}, +{}) overlap, and the call writes {}: \
                     its result would depend on timing",
                    a.name,
                    a.ptr,
                    a.bytes,
                    b.name,
                    b.ptr,
                    b.bytes,
                    if a.written { a.name } else { b.name }
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(name: &'static str, ptr: u64, bytes: u64, written: bool) -> Buf {
        Buf {
            name,
            ptr,
            bytes,
            written,
        }
    }

    #[test]
    fn written_buffers_may_overlap_nothing() {
        let send = buf("send", 0x1000, 256, false);
        // Every placement of a 64-byte written buffer across the send buffer and beyond.
        for start in (0x0f00u64..0x1200).step_by(16) {
            let recv = buf("recv", start, 64, true);
            let clash = start + 64 > 0x1000 && start < 0x1100;
            let got = first_written_overlap(&[send, recv]);
            assert_eq!(got.is_some(), clash, "recv at {start:#x}: {got:?}");
            if let Some(m) = got {
                assert!(m.contains("send") && m.contains("recv"), "{m}");
            }
        }
    }

    #[test]
    fn read_only_buffers_may_share_and_absent_ones_are_skipped() {
        let send = buf("send", 0x1000, 256, false);
        let counts = buf("send_counts", 0x1000, 32, false);
        assert_eq!(first_written_overlap(&[send, counts]), None);
        let absent = buf("send_offsets", 0, 32, false);
        let recv = buf("recv", 0x2000, 256, true);
        assert_eq!(first_written_overlap(&[send, absent, recv]), None);
        // Two written buffers on top of each other.
        let rc = buf("recv_counts", 0x3000, 32, true);
        let ro = buf("recv_offsets", 0x3010, 32, true);
        let m = first_written_overlap(&[send, recv, rc, ro]).expect("overlap");
        assert!(
            m.contains("recv_counts") && m.contains("recv_offsets"),
            "{m}"
        );
        // Zero bytes overlap nothing.
        assert_eq!(
            first_written_overlap(&[send, buf("recv", 0x1000, 0, true)]),
            None
        );
    }
}
