//! Scheduling: which tile configuration a kernel runs with.
//!
//! - [`device`]: what each GPU offers ([`DeviceConfig`]).
//! - [`space`]: level 1, the configurations of a kernel for a problem, each
//!   checked by its template's own rules;
//! - [`intermediate`]: level 2, where each intermediate tile lives
//!   (registers, shared, global), demoting the largest until the plan fits;
//! - [`cost`]: the analytic model that ranks what fits;
//! - [`backward_cost`]: its counterpart for the backward's tiles.
//!
//! Profiling the top of the ranking and remembering the winner (the tuning
//! cache) need a GPU and files: they live in the runtime and the `aec`
//! crate, which call [`rank_forward`].

pub mod backward_cost;
pub mod cost;
pub mod device;
pub mod intermediate;
pub mod space;

use crate::ForwardConfig;
pub use backward_cost::{RankedBackward, estimate_backward, rank_backward, useful_backward_flops};
pub use cost::{Engine, Estimate, TilePlan, estimate, useful_flops};
pub use device::{DeviceConfig, Features, Target};
pub use intermediate::{Budget, IntermediateTensor, Placement, Tier, place};
pub use space::{Candidate, KernelConfig, Problem, Rejected, Space, VariantFacts, forward_space};

use aec_frontend::Variant;
use serde::Serialize;

/// A candidate with the model's estimate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ranked {
    pub candidate: Candidate,
    pub estimate: Estimate,
}

/// The forward's space for `problem` on `device`, what fits ordered by the
/// model (fastest first; ties keep enumeration order), and what was rejected.
pub fn rank_forward(
    variant: &Variant,
    problem: &Problem,
    device: &DeviceConfig,
) -> (Vec<Ranked>, Vec<Rejected>) {
    let facts = VariantFacts::of(variant);
    let space = forward_space(variant, problem, device);
    let mut ranked: Vec<Ranked> = space
        .candidates
        .into_iter()
        .map(|candidate| Ranked {
            estimate: estimate(problem, &facts, &candidate.plan, device),
            candidate,
        })
        .collect();
    ranked.sort_by(|a, b| a.estimate.micros.total_cmp(&b.estimate.micros));
    (ranked, space.rejected)
}

/// How much faster than the default the model must rank its first plan
/// before an untuned call takes that plan instead ([`model_choice`]). The
/// model's absolute times are off (about half of what the kernels take),
/// but its ratios follow the grid: on an H100 at small training shapes
/// (B·H·Sq of 3600–16384 rows, ten examples), 33 of 50 shape and variant
/// pairs ranked 1.39–2.95× ahead of the persistent default and that plan
/// measured 1.09–2.42× faster (geometric mean 1.55× over the 33), except
/// two of DiffTransformer's (0.92× and 0.98×: a persistent tile with Dv
/// split in two); where the two ranked within 1.11× (four or more waves of
/// row blocks, every benchmark workload) the default had been as fast or
/// faster (bench/NOTES.md, session 42).
pub const MODEL_CHOICE_MARGIN: f64 = 1.3;

/// The model's first plan in `ranked` where it estimates the `default`
/// configuration at least [`MODEL_CHOICE_MARGIN`] times slower, with that
/// ratio; None otherwise (the default stays). The default's estimate is its
/// own where the space holds it, else that of the space's plan of the same
/// tile (block rows and keys, warps, stages, template, persistence, Dv
/// split — the placement decides Q's tier and what follows from it); a
/// default the space holds in no such form stays.
pub fn model_choice(ranked: &[Ranked], default: &ForwardConfig) -> Option<(ForwardConfig, f64)> {
    let same_tile = |c: &ForwardConfig| {
        (
            c.block_m,
            c.block_n,
            c.warps,
            c.stages,
            c.wgmma,
            c.warp_specialized,
            c.persistent,
            c.dv_split,
            c.pack_gqa,
        ) == (
            default.block_m,
            default.block_n,
            default.warps,
            default.stages,
            default.wgmma,
            default.warp_specialized,
            default.persistent,
            default.dv_split,
            default.pack_gqa,
        )
    };
    let cuda = |r: &Ranked| match r.candidate.config {
        KernelConfig::Cuda(c) => Some((c, r.estimate.micros)),
        KernelConfig::Hip(_) => None,
    };
    let default_micros = ranked
        .iter()
        .filter_map(cuda)
        .find(|(c, _)| c == default)
        .or_else(|| ranked.iter().filter_map(cuda).find(|(c, _)| same_tile(c)))?
        .1;
    let (first, micros) = ranked.iter().find_map(cuda)?;
    let ratio = default_micros / micros;
    (first != *default && ratio >= MODEL_CHOICE_MARGIN).then_some((first, ratio))
}
