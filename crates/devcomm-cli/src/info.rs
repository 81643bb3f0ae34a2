//! `devcomm info`: per rank, the GPU, its PCI id and the link kind to every peer.

use devcomm::Comm;

/// Arguments of `devcomm info`.
#[derive(Debug, clap::Args)]
pub struct InfoArgs {
    /// Print JSON (one array of per-rank records) instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct RankRecord {
    rank: usize,
    local_rank: usize,
    gpu: String,
    pci_bus_id: String,
    uuid: String,
    sm_count: i32,
    compute_capability: (i32, i32),
    links: Vec<String>,
}

/// Runs on every rank; rank 0 prints everyone's record.
pub fn run(args: &InfoArgs) -> Result<i32, String> {
    let comm = Comm::from_env().map_err(|e| e.to_string())?;
    let d = comm.device_info();
    let me = RankRecord {
        rank: comm.rank(),
        local_rank: comm.local_rank(),
        gpu: d.name.clone(),
        pci_bus_id: d.pci_bus_id.clone(),
        uuid: d.uuid.clone(),
        sm_count: d.sm_count,
        compute_capability: d.compute_capability,
        links: comm
            .topology()
            .kinds
            .iter()
            .map(|k| k.to_string())
            .collect(),
    };
    let blob = serde_json::to_vec(&me).map_err(|e| e.to_string())?;
    let all = comm
        .store()
        .all_gather("__devcomm_cli/info", &blob, comm.setup_timeout())
        .map_err(|e| e.to_string())?;
    if comm.rank() != 0 {
        return Ok(0);
    }
    let records: Vec<RankRecord> = all
        .iter()
        .map(|b| serde_json::from_slice(b).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&records).map_err(|e| e.to_string())?
        );
        return Ok(0);
    }
    let n = records.len();
    let peers: String = (0..n).map(|p| format!("{:>5}", format!("r{p}"))).collect();
    println!(
        "{:<5} {:<22} {:<14} {:>4}  links:{peers}",
        "rank", "gpu", "pci", "sms"
    );
    for r in &records {
        let links: String = r.links.iter().map(|k| format!("{k:>5}")).collect();
        println!(
            "{:<5} {:<22} {:<14} {:>4}        {links}",
            r.rank,
            truncate(&r.gpu, 22),
            r.pci_bus_id,
            r.sm_count
        );
    }
    Ok(0)
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
