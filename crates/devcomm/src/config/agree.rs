//! The ranks' agreement on the knobs that must be alike everywhere ([`Agreement::Must`]):
//! each rank publishes its values, and any difference becomes one setup error that names the
//! knob and which rank holds which value, instead of a device timeout later.

use super::{Agreement, Config, KNOBS};

/// This rank's values of the must-agree knobs, one `VARIABLE=value` line each (the text
/// every rank publishes at setup).
pub(crate) fn view(config: &Config) -> String {
    KNOBS
        .iter()
        .filter(|k| k.agreement == Agreement::Must)
        .map(|k| format!("{}={}\n", k.env, config.show(k)))
        .collect()
}

/// Compares every rank's [`view`] (index = rank): `None` when all agree, else one entry per
/// differing knob: the first rank whose value differs from rank 0's, and a message naming the
/// knob and grouping the ranks by the value they hold.
pub(crate) fn disagreements(views: &[String]) -> Option<Vec<(usize, String)>> {
    let parsed: Vec<Vec<(&str, &str)>> = views
        .iter()
        .map(|v| v.lines().filter_map(|l| l.split_once('=')).collect())
        .collect();
    let mut out = Vec::new();
    let first = parsed.first()?;
    for (i, (name, _)) in first.iter().enumerate() {
        // value -> ranks holding it, in order of first appearance.
        let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
        for (rank, p) in parsed.iter().enumerate() {
            let value = p.get(i).filter(|(n, _)| n == name).map_or("?", |(_, v)| *v);
            match groups.iter_mut().find(|(v, _)| *v == value) {
                Some((_, ranks)) => ranks.push(rank),
                None => groups.push((value, vec![rank])),
            }
        }
        if let Some((_, ranks)) = groups.get(1) {
            let held: Vec<String> = groups
                .iter()
                .map(|(v, ranks)| {
                    let v = if v.is_empty() { "unset" } else { v };
                    format!("{v:?} on rank(s) {ranks:?}")
                })
                .collect();
            out.push((
                ranks[0],
                format!("{name} must be the same on every rank: {}", held.join(", ")),
            ));
        }
    }
    // A view with another set of knobs (another build) differs as a whole.
    if parsed.iter().any(|p| p.len() != first.len()) {
        let odd = parsed
            .iter()
            .position(|p| p.len() != first.len())
            .unwrap_or(0);
        out.push((
            odd,
            "the ranks run builds with different settings tables".to_owned(),
        ));
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
#[allow(clippy::field_reassign_with_default)] // tests change one knob at a time
mod tests {
    use super::*;

    #[test]
    fn equal_configurations_agree() {
        let c = Config::default();
        assert_eq!(disagreements(&[view(&c), view(&c), view(&c)]), None);
    }

    #[test]
    fn a_difference_names_the_knob_and_the_ranks() {
        let a = Config::default();
        let mut b = Config::default();
        b.p2p_ce = false;
        b.zc_blocks = 8;
        let msgs = disagreements(&[view(&a), view(&b), view(&a)]).unwrap();
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert_eq!(msgs[0].0, 1, "{msgs:?}");
        assert!(msgs[0].1.contains("DEVCOMM_P2P_CE"), "{msgs:?}");
        assert!(msgs[0].1.contains("\"1\" on rank(s) [0, 2]"), "{msgs:?}");
        assert!(msgs[0].1.contains("\"0\" on rank(s) [1]"), "{msgs:?}");
        assert!(msgs[1].1.contains("DEVCOMM_ZC_BLOCKS"), "{msgs:?}");
    }

    #[test]
    fn local_knobs_may_differ() {
        let a = Config::default();
        let mut b = Config::default();
        b.device_timeout = std::time::Duration::from_secs(3);
        b.pdl = false;
        b.p2p_pull = super::super::Auto::Forced(true);
        assert_eq!(disagreements(&[view(&a), view(&b)]), None);
    }
}
