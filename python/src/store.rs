//! `Store`: a fresh devcomm store for a group that meets through another channel (torchrun's
//! agent store, a torch.distributed process group's store), which the package's Python side
//! (`devcomm/_rendezvous.py`) carries the address over. Rank 0 hosts it on an ephemeral port
//! with a fresh token (`Store.host`) and the Python side publishes `Store.address`; the others
//! read it and join (`Store.join`). `Comm.from_store` then builds the communicator on it.

use std::sync::Mutex;
use std::time::Duration;

use devcomm_bootstrap::{RankInfo, Store, StoreAddress};
use pyo3::prelude::*;

use crate::errors::{invalid, IntoPy};

/// A joined store, until a communicator takes it.
#[pyclass(frozen, name = "Store", module = "devcomm._native")]
#[derive(Debug)]
pub struct PyStore {
    store: Mutex<Option<Store>>,
    rank: usize,
    world_size: usize,
    /// Whether the caller gave the local rank (otherwise the communicator takes it from the
    /// topology, and needs the device given).
    local_known: bool,
    address: Option<String>,
}

/// The rank description: the local rank and size when given, else a placeholder that
/// validates (the communicator then takes the local rank from the topology).
fn rank_info(rank: usize, world_size: usize, local: Option<(usize, usize)>) -> PyResult<RankInfo> {
    let (local_rank, local_world) = local.unwrap_or((0, 1));
    let info = RankInfo::new(rank, world_size).with_local(local_rank, local_world);
    info.validate().map_err(devcomm::Error::from).py()?;
    Ok(info)
}

fn setup_timeout(timeout_ms: Option<u64>) -> PyResult<Duration> {
    match timeout_ms {
        Some(ms) => Ok(Duration::from_millis(ms)),
        None => Ok(devcomm::Config::from_env().py()?.setup_timeout),
    }
}

/// The setup timeout in milliseconds (`DEVCOMM_SETUP_TIMEOUT_MS` or its default), which bounds
/// the Python side's wait for rank 0's address too.
#[pyfunction]
pub fn setup_timeout_ms() -> PyResult<u64> {
    Ok(setup_timeout(None)?.as_millis() as u64)
}

fn both(
    local_rank: Option<usize>,
    local_world_size: Option<usize>,
) -> PyResult<Option<(usize, usize)>> {
    match (local_rank, local_world_size) {
        (Some(r), Some(n)) => Ok(Some((r, n))),
        (None, None) => Ok(None),
        _ => Err(invalid(
            "Store",
            "give local_rank and local_world_size together, or neither",
        )),
    }
}

impl PyStore {
    fn new(store: Store, local_known: bool) -> Self {
        Self {
            rank: store.rank(),
            world_size: store.world_size(),
            address: store.address().map(|a| a.encode()),
            local_known,
            store: Mutex::new(Some(store)),
        }
    }

    pub(crate) fn local_known(&self) -> bool {
        self.local_known
    }

    /// Takes the store for a communicator; a second taker is refused. Returns it with
    /// whether the local rank was given.
    pub(crate) fn take(&self) -> PyResult<(Store, bool)> {
        let mut slot = self
            .store
            .lock()
            .map_err(|_| invalid("Comm.from_store", "a thread panicked inside devcomm"))?;
        let store = slot.take().ok_or_else(|| {
            invalid(
                "Comm.from_store",
                "this store was taken by a communicator already; every communicator needs a \
                 fresh store",
            )
        })?;
        Ok((store, self.local_known))
    }
}

#[pymethods]
impl PyStore {
    /// Rank 0: hosts a new store on an ephemeral port of `host` (an address of this host)
    /// with a fresh job token and joins it, without waiting for the others. Publish
    /// `address` for them. `timeout_ms`: bound of the store's operations (default: the setup
    /// timeout, `DEVCOMM_SETUP_TIMEOUT_MS`).
    #[staticmethod]
    #[pyo3(signature = (world_size, host, local_rank = None, local_world_size = None, timeout_ms = None))]
    fn host(
        py: Python<'_>,
        world_size: usize,
        host: String,
        local_rank: Option<usize>,
        local_world_size: Option<usize>,
        timeout_ms: Option<u64>,
    ) -> PyResult<Self> {
        let local = both(local_rank, local_world_size)?;
        let info = rank_info(0, world_size, local)?;
        let timeout = setup_timeout(timeout_ms)?;
        let store = py
            .detach(|| Store::host_fresh(&info, &host, timeout))
            .map_err(devcomm::Error::from)
            .py()?;
        Ok(Self::new(store, local.is_some()))
    }

    /// A rank other than 0: joins the store at `address` (`ADDR:PORT:TOKEN`, as rank 0's
    /// `address` gives it), retrying until the timeout.
    #[staticmethod]
    #[pyo3(signature = (address, rank, world_size, local_rank = None, local_world_size = None, timeout_ms = None))]
    fn join(
        py: Python<'_>,
        address: &str,
        rank: usize,
        world_size: usize,
        local_rank: Option<usize>,
        local_world_size: Option<usize>,
        timeout_ms: Option<u64>,
    ) -> PyResult<Self> {
        let local = both(local_rank, local_world_size)?;
        let info = rank_info(rank, world_size, local)?;
        let timeout = setup_timeout(timeout_ms)?;
        let address = StoreAddress::parse(address)
            .map_err(devcomm::Error::from)
            .py()?;
        let store = py
            .detach(|| Store::join_address(&info, &address, timeout))
            .map_err(devcomm::Error::from)
            .py()?;
        Ok(Self::new(store, local.is_some()))
    }

    /// `ADDR:PORT:TOKEN`: what the other ranks join with.
    #[getter]
    fn address(&self) -> Option<String> {
        self.address.clone()
    }

    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    #[getter]
    fn world_size(&self) -> usize {
        self.world_size
    }

    /// Whether a communicator has taken the store.
    #[getter]
    fn taken(&self) -> bool {
        self.store.lock().map(|s| s.is_none()).unwrap_or(true)
    }

    /// Waits until every rank reaches the barrier `tag` (for tests of the rendezvous).
    #[pyo3(signature = (tag, timeout_ms = 10_000))]
    fn barrier(&self, py: Python<'_>, tag: &str, timeout_ms: u64) -> PyResult<()> {
        let slot = self
            .store
            .lock()
            .map_err(|_| invalid("Store.barrier", "a thread panicked inside devcomm"))?;
        let store = slot
            .as_ref()
            .ok_or_else(|| invalid("Store.barrier", "a communicator has taken the store"))?;
        py.detach(|| store.barrier(tag, Duration::from_millis(timeout_ms)))
            .map_err(devcomm::Error::from)
            .py()
    }
}
