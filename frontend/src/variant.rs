//! A traced, validated variant: its declared tensors, its forward regions and
//! the backward regions derived from them.

use crate::ir::{Axis, Region};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Flash-attention style: scores, online row normalisation, aggregation.
    Parallel,
    /// Linear attention with a decayed hidden state carried along the sequence.
    Recurrent,
}

/// A declared input tensor. Memory layout: `axes` (broadcast over the reading
/// closure's point), then `user_axes` (read by explicit index, `rel[i - j]`),
/// outermost first, contiguous.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TensorDecl {
    pub name: String,
    pub axes: Vec<Axis>,
    /// Axes no closure iterates, with their fixed size if declared.
    pub user_axes: Vec<(String, Option<usize>)>,
}

/// An online-normalisation state field and its initial value (the prologue).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StateField {
    pub name: String,
    pub init: f64,
}

#[derive(Clone, Debug)]
pub struct Online {
    pub state: Vec<StateField>,
    /// Per KV block: params `s` (the block's scores) and the incoming state;
    /// outputs `p` (weights), `state.<field>` (new state), `alpha` (rescale of
    /// the running output).
    pub fwd: Region,
    /// Params `o` (the accumulated output row) and the final state; outputs `o`
    /// and `scale.<name>` (final row scales).
    pub epilogue: Region,
    /// Names of the epilogue's final row scales.
    pub scales: Vec<String>,
    /// True when the variant wrote no `online` block (weights are the scores).
    pub implicit: bool,
}

/// Backward regions of the parallel pattern.
#[derive(Clone, Debug)]
pub struct ParallelBackward {
    /// `P = g(s, state)`: the weights recomputed from a score and the saved
    /// final row state. Params `s`, state fields; output `p`.
    pub recompute: Region,
    /// `dS` from `dP`: params `s`, `dp`, state fields; output `ds`. Row
    /// reductions in it run over the row's unmasked keys. Further outputs
    /// `fact.<field>` state how the forward computed each saved field from
    /// `s` (equalities for the simplifier, not values to compute).
    pub norm: Region,
    /// For each modification closure: params as forward plus the seed `d<out>`;
    /// outputs `d<element>` and `grad.<input>` for each custom input it reads.
    /// A `grad.<input>` output is the contribution at one point; the evaluator
    /// (reference or kernel) sums it over the axes the input is broadcast along.
    pub modify_q: Option<Region>,
    pub modify_k: Option<Region>,
    pub modify_v: Option<Region>,
    pub modify_scores: Option<Region>,
}

#[derive(Clone, Debug)]
pub struct Parallel {
    /// The head axis of k and v: `Hkv` (grouped-query) or `H`.
    pub kv_heads: Axis,
    pub modify_q: Option<Region>,
    pub modify_k: Option<Region>,
    pub modify_v: Option<Region>,
    pub modify_scores: Option<Region>,
    /// Output `mask`: true where the key is visible to the query.
    pub mask: Option<Region>,
    pub online: Online,
    pub backward: ParallelBackward,
}

/// The per-step decay of the recurrent state.
#[derive(Clone, Debug)]
pub struct Decay {
    /// Output `decay`: over `[B, H, S]` (scalar per head and step) or
    /// `[B, H, S, Dk]` (per key dimension).
    pub region: Region,
    pub per_key_dim: bool,
}

#[derive(Clone, Debug)]
pub struct RecurrentBackward {
    pub modify_q: Option<Region>,
    pub modify_k: Option<Region>,
    pub modify_v: Option<Region>,
    /// Seed `ddecay`; outputs `d<custom input>`.
    pub decay: Option<Region>,
    /// Seed `do`; outputs `do` and `dn`.
    pub normalize: Option<Region>,
}

#[derive(Clone, Debug)]
pub struct Recurrent {
    pub modify_q: Option<Region>,
    pub modify_k: Option<Region>,
    pub modify_v: Option<Region>,
    /// None: no decay (plain linear attention).
    pub decay: Option<Decay>,
    /// `|o, n|`: the output row `o = q·S` and the normaliser `n = q·z`, where
    /// `z` is the decayed running sum of keys. None: the output is `o`.
    pub normalize: Option<Region>,
    pub backward: RecurrentBackward,
}

#[derive(Clone, Debug)]
pub enum Body {
    Parallel(Box<Parallel>),
    Recurrent(Box<Recurrent>),
}

#[derive(Clone, Debug)]
pub struct Variant {
    pub name: String,
    pub doc: String,
    pub pattern: Pattern,
    pub q: TensorDecl,
    pub k: TensorDecl,
    pub v: TensorDecl,
    pub customs: Vec<TensorDecl>,
    /// Axes whose size the variant fixes (`Dqk = 192`, `Sq = 1`).
    pub fixed_sizes: Vec<(Axis, usize)>,
    pub body: Body,
}

impl Variant {
    pub fn custom_names(&self) -> Vec<String> {
        self.customs.iter().map(|c| c.name.clone()).collect()
    }

    pub fn parallel(&self) -> Option<&Parallel> {
        match &self.body {
            Body::Parallel(p) => Some(p),
            Body::Recurrent(_) => None,
        }
    }

    pub fn recurrent(&self) -> Option<&Recurrent> {
        match &self.body {
            Body::Recurrent(r) => Some(r),
            Body::Parallel(_) => None,
        }
    }

    /// Every forward region, in evaluation order.
    pub fn forward_regions(&self) -> Vec<&Region> {
        match &self.body {
            Body::Parallel(p) => [
                p.modify_q.as_ref(),
                p.modify_k.as_ref(),
                p.modify_v.as_ref(),
                p.modify_scores.as_ref(),
                p.mask.as_ref(),
                Some(&p.online.fwd),
                Some(&p.online.epilogue),
            ]
            .into_iter()
            .flatten()
            .collect(),
            Body::Recurrent(r) => [
                r.modify_q.as_ref(),
                r.modify_k.as_ref(),
                r.modify_v.as_ref(),
                r.decay.as_ref().map(|d| &d.region),
                r.normalize.as_ref(),
            ]
            .into_iter()
            .flatten()
            .collect(),
        }
    }

    /// Every derived backward region, in evaluation order.
    pub fn backward_regions(&self) -> Vec<&Region> {
        match &self.body {
            Body::Parallel(p) => {
                let b = &p.backward;
                [
                    Some(&b.recompute),
                    Some(&b.norm),
                    b.modify_scores.as_ref(),
                    b.modify_q.as_ref(),
                    b.modify_k.as_ref(),
                    b.modify_v.as_ref(),
                ]
                .into_iter()
                .flatten()
                .collect()
            }
            Body::Recurrent(r) => {
                let b = &r.backward;
                [
                    b.normalize.as_ref(),
                    b.decay.as_ref(),
                    b.modify_q.as_ref(),
                    b.modify_k.as_ref(),
                    b.modify_v.as_ref(),
                ]
                .into_iter()
                .flatten()
                .collect()
            }
        }
    }
}
