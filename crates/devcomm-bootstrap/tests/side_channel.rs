//! Ranks in separate processes meet through a store they already share (as they would through
//! torchrun's or torch.distributed's): the group's rank 0 hosts a fresh store on an ephemeral
//! port and publishes its address there; the others read it and join.
//!
//! The test process hosts the side channel (its rank 0, not a member of the group); the
//! group's ranks are children, the test binary re-executed with a role (tests/common).

mod common;

use std::io::Read;
use std::time::Duration;

use common::{spawn_role, wait_ok, ROLE};
use devcomm_bootstrap::{RankInfo, Store, StoreAddress};

const T: Duration = Duration::from_secs(10);
const KEY: &str = "devcomm/group/0";

/// Dispatcher for child processes; a no-op in the normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let result = match role.as_str() {
        "member" => member(),
        other => Err(format!("unknown role {other}")),
    };
    if let Err(e) = result {
        eprintln!("child role {role} failed: {e}");
        std::process::exit(1);
    }
    std::process::exit(0);
}

/// A member of the group: joins the side channel (its rank there is the group rank + 1),
/// meets the others on a fresh store, checks an all-gather and a barrier on it.
fn member() -> Result<(), String> {
    let side_info = RankInfo::from_env().map_err(|e| format!("from_env: {e}"))?;
    let side = Store::connect(&side_info, T).map_err(|e| format!("side channel: {e}"))?;
    let rank = side_info.rank - 1;
    let world = side_info.world_size - 1;
    let info = RankInfo::new(rank, world);
    let store = if rank == 0 {
        let s = Store::host_fresh(&info, "127.0.0.1", T).map_err(|e| e.to_string())?;
        let address = s.address().ok_or("the fresh store has no token")?;
        side.set(KEY, address.encode().as_bytes())
            .map_err(|e| e.to_string())?;
        s
    } else {
        let raw = side.get(KEY, T).map_err(|e| e.to_string())?;
        let address =
            StoreAddress::parse(&String::from_utf8_lossy(&raw)).map_err(|e| e.to_string())?;
        Store::join_address(&info, &address, T).map_err(|e| e.to_string())?
    };
    if store.master_port() == side_info.master_port {
        return Err("the fresh store took the side channel's port".into());
    }
    let got = store
        .all_gather("who", format!("pid {}", std::process::id()).as_bytes(), T)
        .map_err(|e| e.to_string())?;
    if got.len() != world || got.iter().any(|g| !g.starts_with(b"pid ")) {
        return Err(format!("all-gather gave {got:?}"));
    }
    store.barrier("done", T).map_err(|e| e.to_string())?;
    // The side channel's host waits for this before the test ends.
    side.barrier("done", T).map_err(|e| e.to_string())
}

#[test]
fn processes_meet_on_a_fresh_store_through_a_shared_one() {
    let members = 3;
    let world = members + 1;
    let side = Store::connect(&RankInfo::new(0, world).with_master("127.0.0.1", 0), T)
        .expect("side channel");
    let port = side.master_port();
    let mut children: Vec<_> = (1..world)
        .map(|r| {
            spawn_role(
                "member",
                &[
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", world.to_string()),
                    ("LOCAL_RANK", r.to_string()),
                    ("LOCAL_WORLD_SIZE", world.to_string()),
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.to_string()),
                ],
            )
        })
        .collect();
    side.barrier("done", T).expect("every member finished");
    let published = side.get(KEY, T).expect("rank 0 published");
    let address = StoreAddress::parse(&String::from_utf8_lossy(&published)).expect("parses");
    assert_eq!(address.addr, "127.0.0.1");
    assert_ne!(address.port, port);
    for (r, c) in children.iter_mut().enumerate() {
        let ok = wait_ok(c, T);
        let mut err = String::new();
        if let Some(mut e) = c.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        assert!(ok, "member {r} failed: {err}");
    }
}
