//! Scheduling: which tile configuration a kernel runs with.
//!
//! - [`device`]: what each GPU offers ([`DeviceConfig`]).
//! - [`space`]: level 1, the configurations of a kernel for a problem, each
//!   checked by its template's own rules;
//! - [`intermediate`]: level 2, where each intermediate tile lives
//!   (registers, shared, global), demoting the largest until the plan fits;
//! - [`cost`]: the analytic model that ranks what fits.
//!
//! Profiling the top of the ranking and remembering the winner (the tuning
//! cache) need a GPU and files: they live in the runtime and the `aec`
//! crate, which call [`rank_forward`].

pub mod cost;
pub mod device;
pub mod intermediate;
pub mod space;

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
