//! The communicator's tracing calls (docs/TRACING.md): this rank's events, every rank's at
//! rank 0 through the store, and the merged trace file with its summary.

use std::path::Path;

use super::Comm;
use crate::error::{Error, Result};
use crate::trace::{chrome, summary, RankTrace};

/// Bytes of one store value of a gathered trace (well under the store's frame limit).
const CHUNK: usize = 4 << 20;

impl Comm {
    /// Whether this communicator records timeline events (`DEVCOMM_TRACE=1`).
    pub fn tracing(&self) -> bool {
        self.group.trace.get().is_some()
    }

    /// This rank's trace since the last read, which it clears: the host calls and the device
    /// events (after synchronising the device, so that every launched kernel has finished).
    /// `None` when tracing is off.
    pub fn trace_events(&self) -> Result<Option<RankTrace>> {
        let Some(trace) = self.group.trace.get() else {
            return Ok(None);
        };
        crate::cuda::synchronize(&self.group.ctx)?;
        trace.take().map(Some)
    }

    /// Collective: every rank's [`Comm::trace_events`], gathered at rank 0 through the store in
    /// chunks (rank 0 gets them in rank order, without the ranks whose tracing is off; the
    /// other ranks get an empty list).
    pub fn gather_trace(&self) -> Result<Vec<RankTrace>> {
        let g = &self.group;
        let tag = g.next_tag("__devcomm/trace");
        let mine = self.trace_events()?;
        let bytes = mine.as_ref().map(RankTrace::to_bytes);
        let chunks: Vec<&[u8]> = bytes
            .as_deref()
            .map_or(Vec::new(), |b| b.chunks(CHUNK).collect());
        for (i, c) in chunks.iter().enumerate() {
            g.store.set(&format!("{tag}/{}/{i}", g.rank), c)?;
        }
        // Written last: rank 0 reads the count, then the chunks, which are all there by then.
        let count: i64 = if bytes.is_some() {
            chunks.len() as i64
        } else {
            -1
        };
        g.store
            .set(&format!("{tag}/{}/n", g.rank), &count.to_le_bytes())?;
        if g.rank != 0 {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for r in 0..g.world_size {
            let n = g.store.get(&format!("{tag}/{r}/n"), g.setup_timeout)?;
            let n = i64::from_le_bytes(
                n.get(..8)
                    .and_then(|b| b.try_into().ok())
                    .unwrap_or([0xff; 8]),
            );
            if n < 0 {
                continue;
            }
            let mut all = Vec::new();
            for i in 0..n {
                all.extend(g.store.get(&format!("{tag}/{r}/{i}"), g.setup_timeout)?);
            }
            let trace = RankTrace::from_bytes(&all).map_err(|reason| Error::InvalidArgument {
                op: "gather_trace",
                reason: format!("rank {r}: {reason}"),
            })?;
            out.push(trace);
        }
        Ok(out)
    }

    /// Collective: gathers every rank's trace ([`Comm::gather_trace`]); rank 0 writes the
    /// merged Chrome / Perfetto trace to `path` and returns the per-operation summary as text
    /// (`link_gbps`: the link's bandwidth, to print the achieved share). Other ranks return
    /// `None`.
    pub fn write_trace(&self, path: &Path, link_gbps: Option<f64>) -> Result<Option<String>> {
        let ranks = self.gather_trace()?;
        if self.rank() != 0 {
            return Ok(None);
        }
        chrome::write_file(&ranks, path)?;
        Ok(Some(summary::format(
            &summary::summarize(&ranks),
            link_gbps,
        )))
    }
}
