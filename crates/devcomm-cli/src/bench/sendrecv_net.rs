//! `devcomm bench --op sendrecv` (and `--op all_to_all`) with a network peer (links forced with
//! `DEVCOMM_TOPOLOGY_OVERRIDE`): what the records say, so that no one reads a loopback figure
//! as a network one, and which reference runs (pure).

/// Said by every record of a send/recv timed over the network route.
pub(crate) const NET_NOTE: &str =
    "network route forced over loopback tcp: says nothing of a real network";

/// Whether `--reference` asks for NCCL (`all`, `nccl`) or for devcomm alone (`none`), for
/// send/recv and all-to-all.
pub(crate) fn wants_nccl(reference: &str) -> Result<bool, String> {
    match reference {
        "all" | "nccl" => Ok(true),
        "none" => Ok(false),
        other => Err(format!(
            "--reference {other:?} for sendrecv or all_to_all: expected `all` or `nccl` (NCCL \
             send/recv) or `none` (devcomm alone)"
        )),
    }
}

/// The record's `reference` for a send/recv over the network route: what `nccl_us` is (NCCL
/// over NVLink, or nothing) and [`NET_NOTE`].
pub(crate) fn net_reference(nccl: bool) -> String {
    if nccl {
        format!("NCCL send/recv over NVLink; devcomm's {NET_NOTE}")
    } else {
        format!("none (devcomm alone); devcomm's {NET_NOTE}")
    }
}

/// The record's `config` for the network route: payload per staging slot.
pub(crate) fn net_config(slot_kib: u32, slots: u32) -> String {
    format!("net/proxy-ucx/{slots}x{slot_kib}K")
}

/// Options of the NVLink protocols that mean nothing over the network route.
pub(crate) fn refuse_options(sweep: bool, zero_copy: bool, blocks: bool) -> Result<(), String> {
    let bad: Vec<&str> = [
        (sweep, "--sweep"),
        (zero_copy, "--zero-copy"),
        (blocks, "--blocks"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, name)| *name)
    .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "bench --op sendrecv with a network peer: {} choose NVLink protocols, which the \
             network route does not use",
            bad.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_records_say_they_are_loopback() {
        assert!(net_reference(true).contains("NCCL send/recv over NVLink"));
        for nccl in [true, false] {
            let r = net_reference(nccl);
            assert!(
                r.contains("loopback tcp") && r.contains("nothing of a real network"),
                "{r}"
            );
        }
        assert!(net_reference(false).starts_with("none"));
        assert_eq!(net_config(1024, 4), "net/proxy-ucx/4x1024K");
    }

    #[test]
    fn references_and_options() {
        assert_eq!(wants_nccl("all"), Ok(true));
        assert_eq!(wants_nccl("nccl"), Ok(true));
        assert_eq!(wants_nccl("none"), Ok(false));
        assert!(wants_nccl("nccl-window").unwrap_err().contains("sendrecv"));
        assert!(refuse_options(false, false, false).is_ok());
        let e = refuse_options(true, false, true).unwrap_err();
        assert!(e.contains("--sweep, --blocks"), "{e}");
    }
}
