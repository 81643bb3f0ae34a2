//! The order in which a communicator issues the sends and recvs of one group as devcomm
//! `sendrecv` launches, decided by each rank alone.
//!
//! A group may send to and receive from any number of peers (an all-to-all written as sends
//! and recvs, a pipeline stage's send and recv, several messages to one peer). devcomm's
//! `sendrecv` moves one send and one recv per launch and a send of more than its window
//! completes only while the receiver runs its matching recv, so the launches must be ordered
//! so that no rank waits on a peer that waits on something later. Step `k` (1 <= k < world)
//! pairs the sends to rank `me + k` with the recvs from rank `me - k` (mod world), the j-th
//! of each in call order in the j-th launch of the step. A send from r to s = r + k is then
//! the j-th send of r's step k and the j-th recv (from r = s - k) of s's step k: both ends
//! run it in the same step and the same launch of it, and every rank goes through the steps
//! in the same order. So the lowest step any unfinished rank is in always finds its partners
//! in it (no cycle; the test below plays random groups through). Sends to and recvs from
//! the rank itself pair up in call order as local copies, first.
//!
//! Nothing is exchanged to agree on this: NCCL's rule that every send has its recv in the
//! peer's group is what makes both ends see the same steps. A group that breaks the rule
//! (counts or sizes that differ) is refused by devcomm's call agreement on the device (sizes
//! differ) or comes back as a timeout, never a wrong result.

/// One launch: a send and a recv (indices into the communicator's calls of the group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A copy from a send to this rank into the recv from this rank.
    Local {
        /// The send's index.
        send: usize,
        /// The recv's index.
        recv: usize,
    },
    /// A devcomm `sendrecv` with at most one of each.
    Peer {
        /// The send (to `me + k`).
        send: Option<usize>,
        /// The recv (from `me - k`).
        recv: Option<usize>,
    },
}

/// One send (`send` true) or recv of a group, as the schedule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// Send or recv.
    pub send: bool,
    /// The peer (< world).
    pub peer: usize,
}

/// The launches of rank `me`'s calls of one group, in order; an error when the sends to this
/// rank and the recvs from it do not pair up.
pub fn schedule(me: usize, world: usize, calls: &[Call]) -> Result<Vec<Step>, String> {
    let of = |send: bool, peer: usize| -> Vec<usize> {
        (0..calls.len())
            .filter(|&i| calls[i].send == send && calls[i].peer == peer)
            .collect()
    };
    let mut steps = Vec::new();
    let (to_self, from_self) = (of(true, me), of(false, me));
    if to_self.len() != from_self.len() {
        return Err(format!(
            "rank {me} sends itself {} message(s) and receives {} from itself in one group",
            to_self.len(),
            from_self.len()
        ));
    }
    steps.extend(
        to_self
            .into_iter()
            .zip(from_self)
            .map(|(send, recv)| Step::Local { send, recv }),
    );
    for k in 1..world {
        let sends = of(true, (me + k) % world);
        let recvs = of(false, (me + world - k) % world);
        for j in 0..sends.len().max(recvs.len()) {
            steps.push(Step::Peer {
                send: sends.get(j).copied(),
                recv: recvs.get(j).copied(),
            });
        }
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(peer: usize) -> Call {
        Call { send: true, peer }
    }
    fn recv(peer: usize) -> Call {
        Call { send: false, peer }
    }
    fn peer(send: Option<usize>, recv: Option<usize>) -> Step {
        Step::Peer { send, recv }
    }

    #[test]
    fn a_ring_is_one_launch_and_an_all_to_all_one_per_peer() {
        // nccl-tests' sendrecv: send to me + 1, recv from me - 1.
        assert_eq!(
            schedule(2, 4, &[send(3), recv(1)]).unwrap(),
            [peer(Some(0), Some(1))]
        );
        // Two ranks both ways.
        assert_eq!(
            schedule(1, 2, &[recv(0), send(0)]).unwrap(),
            [peer(Some(1), Some(0))]
        );
        // An all-to-all on 4 ranks, self included, calls in peer order.
        let calls: Vec<Call> = (0..4).flat_map(|p| [send(p), recv(p)]).collect();
        assert_eq!(
            schedule(1, 4, &calls).unwrap(),
            [
                Step::Local { send: 2, recv: 3 },
                peer(Some(4), Some(1)),
                peer(Some(6), Some(7)),
                peer(Some(0), Some(5)),
            ]
        );
    }

    #[test]
    fn several_messages_to_one_peer_keep_their_order() {
        let calls = [send(1), send(1), recv(3), send(1)];
        assert_eq!(
            schedule(0, 4, &calls).unwrap(),
            [
                peer(Some(0), Some(2)),
                peer(Some(1), None),
                peer(Some(3), None)
            ]
        );
        // A pipeline stage in the middle: recv from the previous rank only.
        assert_eq!(schedule(2, 4, &[recv(1)]).unwrap(), [peer(None, Some(0))]);
        assert_eq!(schedule(0, 1, &[]).unwrap(), []);
    }

    #[test]
    fn sends_to_self_need_their_recvs() {
        assert_eq!(
            schedule(0, 2, &[recv(0), send(0)]).unwrap(),
            [Step::Local { send: 1, recv: 0 }]
        );
        let e = schedule(3, 4, &[send(3), send(3), recv(3)]).unwrap_err();
        assert!(e.contains("sends itself 2"), "{e}");
    }

    /// A small deterministic generator (the tests take no crate for randomness).
    struct Lcg(u64);
    impl Lcg {
        fn below(&mut self, n: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 33) % n as u64) as usize
        }
    }

    /// Plays every rank's launches with strict rendezvous (a send moves only while its
    /// receiver's launch that holds the matching recv runs, as a send larger than devcomm's
    /// window does; a launch ends when its send and recv have both moved) and returns
    /// whether every rank finished.
    fn plays_through(world: usize, groups: &[Vec<Call>]) -> bool {
        type Half = Option<(usize, usize)>; // (peer, index among the calls alike)
        let plans: Vec<Vec<(Half, Half)>> = (0..world)
            .map(|r| {
                let calls = &groups[r];
                let nth = |i: usize| {
                    let c = calls[i];
                    let n = calls[..i].iter().filter(|d| **d == c).count();
                    (c.peer, n)
                };
                schedule(r, world, calls)
                    .unwrap()
                    .into_iter()
                    .filter_map(|s| match s {
                        Step::Local { .. } => None,
                        Step::Peer { send, recv } => Some((send.map(nth), recv.map(nth))),
                    })
                    .collect()
            })
            .collect();
        let mut at = vec![0usize; world];
        // Whether the current launch's send and recv have moved.
        let mut moved = vec![(false, false); world];
        loop {
            if (0..world).all(|r| at[r] == plans[r].len()) {
                return true;
            }
            let mut progress = false;
            // Every send whose recv is in the receiver's current launch moves.
            for r in 0..world {
                let Some(&(Some((s, n)), _)) = plans[r].get(at[r]) else {
                    continue;
                };
                if moved[r].0 {
                    continue;
                }
                if plans[s].get(at[s]).and_then(|l| l.1) == Some((r, n)) && !moved[s].1 {
                    moved[r].0 = true;
                    moved[s].1 = true;
                    progress = true;
                }
            }
            for r in 0..world {
                let Some(&(send, recv)) = plans[r].get(at[r]) else {
                    continue;
                };
                if (send.is_none() || moved[r].0) && (recv.is_none() || moved[r].1) {
                    at[r] += 1;
                    moved[r] = (false, false);
                    progress = true;
                }
            }
            if !progress {
                return false;
            }
        }
    }

    #[test]
    fn random_groups_never_wait_in_a_cycle() {
        let mut rng = Lcg(7);
        for round in 0..2000 {
            let world = 2 + rng.below(7);
            // Random messages r -> s (s != r), each a send in r's group and a recv in s's,
            // added to each group in a random position.
            let mut groups: Vec<Vec<Call>> = vec![Vec::new(); world];
            for _ in 0..rng.below(3 * world + 1) {
                let r = rng.below(world);
                let s = (r + 1 + rng.below(world - 1)) % world;
                let at = rng.below(groups[r].len() + 1);
                groups[r].insert(at, send(s));
                // Messages r -> s keep their order among themselves on both ends (NCCL's
                // matching), whatever else lies between them.
                let last = groups[s]
                    .iter()
                    .rposition(|c| *c == recv(r))
                    .map_or(0, |i| i + 1);
                let at = last + rng.below(groups[s].len() - last + 1);
                groups[s].insert(at, recv(r));
            }
            assert!(plays_through(world, &groups), "round {round}: {groups:?}");
        }
        // The order a rank's calls come in does not matter; a cycle of ring sends in the
        // opposite direction (everyone to me - 1) is one step too.
        let ring: Vec<Vec<Call>> = (0..5)
            .map(|r| vec![recv((r + 1) % 5), send((r + 4) % 5)])
            .collect();
        assert!(plays_through(5, &ring));
    }
}
