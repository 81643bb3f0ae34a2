//! Dispatch and combine on the host, in the kernels' order and rounding (`cuda/kernels/moe.cu`):
//! what the GPU results must equal bit for bit. Each rank can compute its own expected results
//! from every rank's routing (the tests draw them from shared seeds).

pub use super::elem::Elem;
use super::fp8::{dequantise_row, quantise_row};
use super::MoePlan;

/// One rank's routing: `topk_idx` and `topk_weights`, `[tokens, top_k]` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// Expert ids (-1: none).
    pub idx: Vec<i64>,
    /// Weights.
    pub weights: Vec<f32>,
}

impl Routing {
    /// Tokens of this routing (`top_k` entries each).
    pub fn tokens(&self, top_k: usize) -> usize {
        self.idx.len() / top_k
    }
}

/// Token `t`'s experts by entry: the id where valid (in range and not a repeat of an earlier
/// entry of the token), else `None` (the kernels' `entry`).
pub fn entries(idx: &[i64], top_k: usize, experts: usize, t: usize) -> Vec<Option<usize>> {
    let row = &idx[t * top_k..(t + 1) * top_k];
    (0..top_k)
        .map(|j| {
            let e = row[j];
            let valid = e >= 0 && (e as usize) < experts && !row[..j].contains(&e);
            valid.then_some(e as usize)
        })
        .collect()
}

/// The ranks token `t` of `routing` goes to, ascending.
pub fn destinations(plan: &MoePlan, routing: &Routing, t: usize) -> Vec<usize> {
    let c = &plan.config;
    let mut ranks: Vec<usize> = entries(&routing.idx, c.top_k, c.experts, t)
        .into_iter()
        .flatten()
        .map(|e| e / plan.local_experts)
        .collect();
    ranks.sort_unstable();
    ranks.dedup();
    ranks
}

/// Where an expert-major output row comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The rank that dispatched the token.
    pub rank: usize,
    /// The token's index on that rank.
    pub token: usize,
    /// The entry of the token's `topk_idx` that chose this expert.
    pub entry: usize,
}

/// Rank `me`'s expert-major output: for each local expert its rows in order (source rank, then
/// the source's token order), and the first row of each group (padded to `align`), with the
/// total rows needed last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Rows of each local expert.
    pub groups: Vec<Vec<Source>>,
    /// First output row of each group; `local_experts + 1` entries.
    pub bases: Vec<usize>,
}

impl Received {
    /// The output row of `(rank, token)`'s entry for local expert `le`, if it came here.
    pub fn row_of(&self, le: usize, rank: usize, token: usize) -> Option<usize> {
        self.groups[le]
            .iter()
            .position(|s| s.rank == rank && s.token == token)
            .map(|i| self.bases[le] + i)
    }
}

/// What rank `me` receives from `routings` (every rank's, by rank).
pub fn received(plan: &MoePlan, routings: &[Routing], me: usize) -> Received {
    let c = &plan.config;
    let first = me * plan.local_experts;
    let mut groups = vec![Vec::new(); plan.local_experts];
    for (rank, r) in routings.iter().enumerate() {
        for token in 0..r.tokens(c.top_k) {
            for (entry, e) in entries(&r.idx, c.top_k, c.experts, token)
                .into_iter()
                .enumerate()
            {
                if let Some(e) = e.filter(|e| (first..first + plan.local_experts).contains(e)) {
                    groups[e - first].push(Source { rank, token, entry });
                }
            }
        }
    }
    let mut bases = Vec::with_capacity(plan.local_experts + 1);
    let mut at = 0;
    for g in &groups {
        bases.push(at);
        at += g.len().div_ceil(c.align) * c.align;
    }
    bases.push(at);
    Received { groups, bases }
}

/// A token row as it arrives on an expert's rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrived<E> {
    /// The row of the input type: the row itself when it crosses as it is, its dequantised
    /// form when it crosses as FP8 (what a dequantising dispatch writes, and what an expert
    /// of an FP8 dispatch works on when it dequantises the same way).
    pub values: Vec<E>,
    /// The e4m3 codes and the scales, in order, when the row crosses as FP8.
    pub fp8: Option<(Vec<u8>, Vec<f32>)>,
}

/// Row `x` as the plan's wire delivers it (the pack kernel's quantisation, the unpack
/// kernel's dequantisation; `moe::fp8`).
pub fn arrived<E: Elem>(plan: &MoePlan, x: &[E]) -> Arrived<E> {
    if plan.scale_block == 0 {
        return Arrived {
            values: x.to_vec(),
            fp8: None,
        };
    }
    let (codes, scales) = quantise_row(x, plan.scale_block);
    Arrived {
        values: dequantise_row(&codes, &scales, plan.scale_block),
        fp8: Some((codes, scales)),
    }
}

/// Sum in the kernels' order: the first term as is, then `__fadd_rn` each next one.
fn ordered_sum(terms: impl IntoIterator<Item = f32>) -> Option<f32> {
    terms.into_iter().reduce(|acc, x| acc + x)
}

/// Rank `me`'s combined rows (`[tokens, hidden]`) for its routing `mine`: for each token, the
/// sum over the ranks it went to (ascending) of that rank's sum, rounded to `E`, of weight x
/// expert output over the token's experts there (ascending expert id), in `f32`.
/// `expert_out(e, t)` is expert `e`'s output row for token `t` of rank `me`.
pub fn combine<E: Elem>(
    plan: &MoePlan,
    mine: &Routing,
    expert_out: impl Fn(usize, usize) -> Vec<E>,
) -> Vec<E> {
    let c = &plan.config;
    let tokens = mine.tokens(c.top_k);
    let mut out = vec![E::default(); tokens * c.hidden];
    for t in 0..tokens {
        let mut chosen: Vec<(usize, f32)> = entries(&mine.idx, c.top_k, c.experts, t)
            .into_iter()
            .enumerate()
            .filter_map(|(j, e)| e.map(|e| (e, mine.weights[t * c.top_k + j])))
            .collect();
        chosen.sort_by_key(|&(e, _)| e);
        let rows: Vec<(usize, f32, Vec<E>)> = chosen
            .into_iter()
            .map(|(e, w)| (e / plan.local_experts, w, expert_out(e, t)))
            .collect();
        for h in 0..c.hidden {
            let partials = destinations(plan, mine, t).into_iter().map(|r| {
                let sum = ordered_sum(
                    rows.iter()
                        .filter(|(rank, _, _)| *rank == r)
                        .map(|(_, w, y)| w * y[h].to_f32()),
                );
                E::from_f32(sum.unwrap_or(0.0)).to_f32()
            });
            out[t * c.hidden + h] = E::from_f32(ordered_sum(partials).unwrap_or(0.0));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::MoeConfig;
    use crate::reduce::DataType;

    fn plan(experts: usize, top_k: usize, world: usize, align: usize) -> MoePlan {
        let config = MoeConfig {
            experts,
            top_k,
            hidden: 8,
            dtype: DataType::F32,
            max_tokens: 16,
            align,
            wire: crate::moe::Wire::Native,
        };
        MoePlan::new(config, world).unwrap()
    }

    #[test]
    fn invalid_and_repeated_entries_are_dropped() {
        let idx = [3, -1, 3, 9, 0, -2];
        assert_eq!(
            entries(&idx, 6, 8, 0),
            [Some(3), None, None, None, Some(0), None]
        );
    }

    #[test]
    fn a_token_goes_once_to_each_rank_of_its_experts() {
        let p = plan(8, 3, 4, 1); // 2 experts per rank
        let r = Routing {
            idx: vec![0, 1, 6, /* */ -1, -1, -1],
            weights: vec![0.5; 6],
        };
        assert_eq!(destinations(&p, &r, 0), [0, 3]);
        assert!(destinations(&p, &r, 1).is_empty());
    }

    #[test]
    fn groups_are_expert_major_in_rank_then_token_order_and_padded() {
        let p = plan(4, 2, 2, 4); // rank 1 holds experts 2 and 3
        let r0 = Routing {
            idx: vec![2, 3, /* */ 0, 3],
            weights: vec![1.0; 4],
        };
        let r1 = Routing {
            idx: vec![3, 1],
            weights: vec![1.0; 2],
        };
        let got = received(&p, &[r0, r1], 1);
        let s = |rank, token, entry| Source { rank, token, entry };
        assert_eq!(got.groups[0], [s(0, 0, 0)]);
        assert_eq!(got.groups[1], [s(0, 0, 1), s(0, 1, 1), s(1, 0, 0)]);
        assert_eq!(got.bases, [0, 4, 8]);
        assert_eq!(got.row_of(1, 0, 1), Some(5));
        assert_eq!(got.row_of(0, 1, 0), None);
    }

    #[test]
    fn combine_sums_per_rank_then_across_ranks_in_order() {
        let p = plan(4, 3, 2, 1);
        let mine = Routing {
            idx: vec![3, 0, 2, /* */ -1, -1, -1],
            weights: vec![0.25, 2.0, 0.5, 1.0, 1.0, 1.0],
        };
        // Expert e's output is the constant e + 1.
        let out = combine::<f32>(&p, &mine, |e, _| vec![(e + 1) as f32; 8]);
        // Rank 0: expert 0 (2.0 x 1); rank 1: experts 2 then 3 (0.5 x 3 + 0.25 x 4).
        assert_eq!(&out[..8], &[2.0 + (1.5 + 1.0); 8]);
        assert_eq!(&out[8..], &[0.0; 8]);
    }

    #[test]
    fn rows_arrive_as_they_are_or_quantised_as_the_wire_says() {
        use crate::moe::{Fp8Output, Fp8Scales, Wire};
        let row: Vec<half::bf16> = (0..256)
            .map(|i| half::bf16::from_f32((i as f32 - 100.0) / 7.0))
            .collect();
        let with = |wire: Wire| {
            let config = MoeConfig {
                experts: 4,
                top_k: 2,
                hidden: 256,
                dtype: DataType::BF16,
                max_tokens: 4,
                align: 1,
                wire,
            };
            arrived(&MoePlan::new(config, 2).unwrap(), &row)
        };
        let native = with(Wire::Native);
        assert_eq!(
            (native.values.as_slice(), native.fp8),
            (row.as_slice(), None)
        );
        let blocks = with(Wire::Fp8 {
            scales: Fp8Scales::Per128,
            output: Fp8Output::Fp8,
        });
        let (codes, scales) = blocks.fp8.clone().unwrap();
        // Block 0 holds -100/7 .. 27/7 (amax 100/7 in bf16), block 1 28/7 .. 155/7.
        assert_eq!(codes.len(), 256);
        assert_eq!(scales.len(), 2);
        assert_eq!(scales[0], row[0].to_f32().abs() / 448.0);
        assert_eq!(scales[1], row[255].to_f32() / 448.0);
        assert_eq!((codes[0], codes[255]), (0xfe, 0x7e));
        assert_ne!(blocks.values, row, "quantisation changes values");
        let per_row = with(Wire::Fp8 {
            scales: Fp8Scales::PerRow,
            output: Fp8Output::Dequantised,
        });
        assert_eq!(per_row.fp8.as_ref().unwrap().1, [row[255].to_f32() / 448.0]);
        // The two scale kinds quantise block 0 differently (its own amax against the row's).
        assert_ne!(per_row.values[..128], blocks.values[..128]);
    }

    #[test]
    fn combine_rounds_each_rank_s_sum_to_the_row_type() {
        let p = MoePlan::new(
            MoeConfig {
                experts: 4,
                top_k: 3,
                hidden: 8,
                dtype: DataType::BF16,
                max_tokens: 4,
                align: 1,
                wire: crate::moe::Wire::Native,
            },
            2,
        )
        .unwrap();
        let mine = Routing {
            idx: vec![0, 1, 2],
            weights: vec![1.0; 3],
        };
        // Rank 0's 1 + 2^-8 is a tie in bf16 and rounds to 1 before rank 1's 2^-8 is added (a
        // tie again): 1, where one f32 sum of all three would give 1 + 2^-7.
        let y = |e: usize, _| vec![half::bf16::from_f32(if e == 0 { 1.0 } else { 1.0 / 256.0 }); 8];
        let out = combine::<half::bf16>(&p, &mine, y);
        assert_eq!(out[0].to_f32(), 1.0);
    }
}
