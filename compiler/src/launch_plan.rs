//! Launch plans: everything a loader needs to run a generated kernel, as
//! data. A plan names the sizes a call binds, the buffers (inputs, outputs,
//! workspaces) with their dtypes and shapes as expressions of those sizes,
//! and the launches in order with their grids and arguments.
//!
//! The manifest of a kernel library carries one plan per entry point
//! (`forward`, `backward`) and architecture; the C header is generated from
//! it and the Python and Rust loaders interpret it, so the three agree by
//! construction. Most entry points live in one module (the build's `cubin`);
//! a launch with a [`module`](LaunchPlan::module) names another one of the
//! same build (the recurrent backward's states pass, a second source). Plans are plain serde data: a loader written in another
//! language needs only JSON and the small expression language of
//! [`SizeExpr`].

use crate::cuda::forward::{
    ArgKind, KernelSource, KvSplitInputs, MAX_KV_SPLITS, Residency, TensorMapSpec, kv_split_rule,
};
use crate::cuda::recurrent::{RecurrentBackwardSource, RecurrentGridX, RecurrentSource};
use crate::{Elem, Grid, Launch};
use aec_frontend::Variant;
use aec_frontend::ir::Axis;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A size as an expression of the call's sizes (`B`, `H`, `Hkv`, `Sq`,
/// `Skv`, `S`), `kv_splits` and, in launch grids only, [`SMS`] (the device's
/// multiprocessor count). In JSON: a number, a name, or `{"mul": [..]}`,
/// `{"ceil_div": [a, b]}`, `{"floor_div": [a, b]}`, `{"min": [a, b]}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SizeExpr {
    Const(u64),
    Var(String),
    Op(SizeOp),
}

/// The operations of [`SizeExpr`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SizeOp {
    /// The product of the terms.
    Mul(Vec<SizeExpr>),
    /// `ceil(a / b)`, b ≥ 1.
    CeilDiv(Box<SizeExpr>, Box<SizeExpr>),
    /// `floor(a / b)`, b ≥ 1 (the clusters of two that `sms` multiprocessors
    /// hold).
    FloorDiv(Box<SizeExpr>, Box<SizeExpr>),
    /// The smaller of `a` and `b`.
    Min(Box<SizeExpr>, Box<SizeExpr>),
}

/// The name under which launch grids read the device's multiprocessor count
/// (persistent kernels launch one block per multiprocessor at most).
pub const SMS: &str = "sms";

impl SizeExpr {
    pub fn var(name: &str) -> SizeExpr {
        SizeExpr::Var(name.to_string())
    }

    pub fn mul(terms: impl IntoIterator<Item = SizeExpr>) -> SizeExpr {
        let terms: Vec<SizeExpr> = terms.into_iter().collect();
        if terms.len() == 1 {
            return terms.into_iter().next().expect("one term");
        }
        SizeExpr::Op(SizeOp::Mul(terms))
    }

    pub fn ceil_div(a: SizeExpr, b: SizeExpr) -> SizeExpr {
        if b == SizeExpr::Const(1) {
            return a;
        }
        SizeExpr::Op(SizeOp::CeilDiv(Box::new(a), Box::new(b)))
    }

    pub fn floor_div(a: SizeExpr, b: SizeExpr) -> SizeExpr {
        if b == SizeExpr::Const(1) {
            return a;
        }
        SizeExpr::Op(SizeOp::FloorDiv(Box::new(a), Box::new(b)))
    }

    pub fn min(a: SizeExpr, b: SizeExpr) -> SizeExpr {
        SizeExpr::Op(SizeOp::Min(Box::new(a), Box::new(b)))
    }

    /// The value for the sizes `vars` gives; `None` for a name it lacks or
    /// an overflow of 64 bits.
    pub fn eval(&self, vars: &dyn Fn(&str) -> Option<u64>) -> Option<u64> {
        match self {
            SizeExpr::Const(n) => Some(*n),
            SizeExpr::Var(v) => vars(v),
            SizeExpr::Op(SizeOp::Mul(ts)) => ts
                .iter()
                .try_fold(1u64, |acc, t| acc.checked_mul(t.eval(vars)?)),
            SizeExpr::Op(SizeOp::CeilDiv(a, b)) => {
                let (a, b) = (a.eval(vars)?, b.eval(vars)?);
                (b > 0).then(|| a.div_ceil(b))
            }
            SizeExpr::Op(SizeOp::FloorDiv(a, b)) => {
                let (a, b) = (a.eval(vars)?, b.eval(vars)?);
                (b > 0).then(|| a / b)
            }
            SizeExpr::Op(SizeOp::Min(a, b)) => Some(a.eval(vars)?.min(b.eval(vars)?)),
        }
    }

    /// The names the expression reads.
    pub fn vars(&self) -> Vec<&str> {
        match self {
            SizeExpr::Const(_) => vec![],
            SizeExpr::Var(v) => vec![v.as_str()],
            SizeExpr::Op(SizeOp::Mul(ts)) => ts.iter().flat_map(|t| t.vars()).collect(),
            SizeExpr::Op(SizeOp::CeilDiv(a, b) | SizeOp::FloorDiv(a, b) | SizeOp::Min(a, b)) => {
                let mut v = a.vars();
                v.extend(b.vars());
                v
            }
        }
    }
}

impl std::fmt::Display for SizeExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SizeExpr::Const(n) => write!(f, "{n}"),
            SizeExpr::Var(v) => f.write_str(v),
            SizeExpr::Op(SizeOp::Mul(ts)) => {
                for (i, t) in ts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" * ")?;
                    }
                    write!(f, "{t}")?;
                }
                Ok(())
            }
            SizeExpr::Op(SizeOp::CeilDiv(a, b)) => write!(f, "ceil({a} / {b})"),
            SizeExpr::Op(SizeOp::FloorDiv(a, b)) => write!(f, "floor({a} / {b})"),
            SizeExpr::Op(SizeOp::Min(a, b)) => write!(f, "min({a}, {b})"),
        }
    }
}

/// The element types of buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    Bf16,
    F16,
    F32,
}

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
        }
    }

    /// The `CUtensorMapDataType` of a tensor map over this type.
    pub fn tensor_map_data_type(self) -> u32 {
        match self {
            Dtype::F16 => 6,
            Dtype::F32 => 7,
            Dtype::Bf16 => 9,
        }
    }

    fn of(elem: Elem) -> Dtype {
        match elem {
            Elem::Bf16 => Dtype::Bf16,
            Elem::F16 => Dtype::F16,
        }
    }
}

/// What a buffer is to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Given by the caller, read.
    Input,
    /// Given by the caller or absent (a null pointer; the plan says what
    /// absence means).
    OptionalInput,
    /// Allocated by the loader (or given, in C) and returned.
    Output,
    /// Returned only when the caller asks for it; a null pointer otherwise.
    OptionalOutput,
    /// Scratch memory of the call, freed after it.
    Workspace,
}

/// One buffer of an entry point: contiguous, row-major in `shape`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferPlan {
    pub name: String,
    pub role: Role,
    pub dtype: Dtype,
    pub shape: Vec<SizeExpr>,
    /// The loader fills it with zeros before the first launch (the kernels
    /// add to it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub zeroed: bool,
    /// Only allocated (and passed non-null) when the condition holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Condition>,
    /// What the buffer is, for people and error messages.
    pub doc: String,
}

impl BufferPlan {
    /// The element count for the sizes `vars` gives.
    pub fn elements(&self, vars: &dyn Fn(&str) -> Option<u64>) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |acc, e| acc.checked_mul(e.eval(vars)?))
    }
}

/// When a launch runs or a buffer exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// The forward runs with more than one KV split.
    SplitKv,
}

/// One kernel argument.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgPlan {
    /// The device address of a buffer (null for an absent optional one or a
    /// buffer whose condition does not hold).
    Ptr(String),
    /// A 32-bit signed integer.
    I32(SizeExpr),
    /// A null pointer for the kernel parameter named here, which this entry
    /// never fills (the recurrent backward's states pass does not write the
    /// final state: `{"null": "state_out"}`).
    Null(String),
    /// A CUDA tensor map of a buffer, passed by value (a 128-byte,
    /// 64-byte-aligned `CUtensorMap`), which the loader encodes per call
    /// with `cuTensorMapEncodeTiled`: see [`TensorMapPlan`].
    TensorMap(TensorMapPlan),
}

/// A tensor map the loader encodes with `cuTensorMapEncodeTiled` for each
/// call: rank 3 over the buffer's elements (its dtype: `bf16` is
/// `CU_TENSOR_MAP_DATA_TYPE_BFLOAT16`, `f16` `FLOAT16`), global address the
/// buffer's, extents `dims` (innermost first), byte strides `dims[0] ·
/// bytes` and `dims[0] · dims[1] · bytes` (the buffer is contiguous), box
/// `box` with element strides 1, no interleave, 128-byte swizzle
/// (`CU_TENSOR_MAP_SWIZZLE_128B`), 128-byte L2 promotion, and elements
/// outside the tensor filled with zeros (`CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE`).
/// The encoder refuses a buffer address that is not 16-byte aligned and
/// extents above 2³²: loaders check both before encoding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMapPlan {
    pub buffer: String,
    pub dims: [SizeExpr; 3],
    #[serde(rename = "box")]
    pub box_dims: [u32; 3],
}

/// The module key of the recurrent backward's states pass (see
/// [`LaunchPlan::module`]).
pub const STATES_MODULE: &str = "states";

/// One kernel launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchPlan {
    pub entry: String,
    /// The module (cubin) that defines `entry`: absent for the record's own
    /// (each build's `cubin`), otherwise a key of each build's `modules`
    /// (`{"states": "kernels/….sm_90a.cubin"}`), which the loader loads as
    /// well. Only the recurrent backward uses it: its states pass is a
    /// second source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    pub grid: [SizeExpr; 3],
    pub threads: u32,
    pub dynamic_smem_bytes: u32,
    pub args: Vec<ArgPlan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Condition>,
}

/// How many KV splits a split-KV forward launches with: 1 when `blocks`
/// (the grid without splits) is at least `2 · SMs`; otherwise the splits
/// from 1 to `min(clamp(key_blocks / 4, 1, max_splits), max(1, resident ·
/// SMs / blocks))` for which the busiest multiprocessor finishes first
/// ([`split_cost`](crate::cuda::forward::split_cost)), the fewest among
/// equals. `resident`, the blocks a multiprocessor holds at once, is the
/// driver's occupancy count for the split launch's function (registers
/// included) where a loader has it, else `floor(smem_per_sm /
/// (block_smem_bytes + 1024))` where `block_smem_bytes` is not 0, else
/// unknown (no wave cap)
/// ([`KernelSource::kv_splits`](crate::KernelSource::kv_splits)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvSplitPlan {
    pub blocks: SizeExpr,
    pub key_blocks: SizeExpr,
    pub max_splits: u64,
    /// The split launch's dynamic shared memory per block (0: the
    /// shared-memory form of the wave cap does not apply).
    #[serde(default)]
    pub block_smem_bytes: u64,
    /// K/V bytes one block of the split launch keeps in flight (0: not
    /// known, counted as half of
    /// [`KV_BYTES_IN_FLIGHT_PER_SM`](crate::cuda::forward::KV_BYTES_IN_FLIGHT_PER_SM)).
    #[serde(default)]
    pub block_bytes_in_flight: u64,
    /// A block's fixed work in 1024ths of a key block (0: not known, one
    /// key block;
    /// [`SplitTile::split_fixed_work`](crate::cuda::forward::SplitTile::split_fixed_work)).
    #[serde(default)]
    pub block_fixed_work: u64,
    pub rule: String,
}

impl KvSplitPlan {
    /// The rule above for a GPU with `sms` multiprocessors, capped by
    /// `residency` ([`Residency`]).
    pub fn splits(
        &self,
        vars: &dyn Fn(&str) -> Option<u64>,
        sms: u64,
        residency: Residency,
    ) -> u64 {
        let (Some(blocks), Some(key_blocks)) = (self.blocks.eval(vars), self.key_blocks.eval(vars))
        else {
            return 1;
        };
        kv_split_rule(KvSplitInputs {
            blocks,
            key_blocks,
            max_splits: self.max_splits,
            block_smem: self.block_smem_bytes,
            block_bytes_in_flight: self.block_bytes_in_flight,
            block_fixed_work: self.block_fixed_work,
            sms,
            residency,
        })
    }
}

/// A size a call binds: free (read from the tensors' shapes) or fixed by
/// the variant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizePlan {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed: Option<u64>,
}

/// Everything to run one entry point of one variant on one architecture.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryPlan {
    /// `forward` or `backward`.
    pub pass: String,
    /// The sizes a call binds, in the kernels' order.
    pub sizes: Vec<SizePlan>,
    /// Pairs `[a, b]`: `a` must be a multiple of `b` (query heads of a
    /// key/value group).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub multiple_of: Vec<[String; 2]>,
    /// Pairs `[a, b]`: `a` must equal `b` (k and v declared with `H` heads).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub equal: Vec<[String; 2]>,
    pub buffers: Vec<BufferPlan>,
    /// Pairs `[a, b]`: input `a` must be the very tensor given as `b` (a
    /// forward whose V is read from K's rows takes the one cache as `k` and
    /// `v`); every loader refuses a call that passes two tensors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub same_tensor: Vec<[String; 2]>,
    pub launches: Vec<LaunchPlan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_splits: Option<KvSplitPlan>,
}

impl EntryPlan {
    pub fn buffer(&self, name: &str) -> Option<&BufferPlan> {
        self.buffers.iter().find(|b| b.name == name)
    }

    /// The index of the launch whose grid reads `kv_splits` (the split
    /// launch, whose occupancy caps the splits), if any.
    pub fn split_launch(&self) -> Option<usize> {
        self.launches
            .iter()
            .position(|l| l.grid.iter().any(|g| g.vars().contains(&"kv_splits")))
    }
}

fn axis_expr(a: Axis, dims: &BTreeMap<Axis, u32>) -> SizeExpr {
    match dims.get(&a) {
        Some(&d) => SizeExpr::Const(d as u64),
        None => SizeExpr::var(a.name()),
    }
}

fn shape_of(axes: &[Axis], dims: &BTreeMap<Axis, u32>) -> Vec<SizeExpr> {
    axes.iter().map(|a| axis_expr(*a, dims)).collect()
}

/// A custom input's shape: its named axes, then its user axes (fixed sizes;
/// the templates refuse user axes without one before a plan is made).
fn custom_shape(
    decl: &aec_frontend::variant::TensorDecl,
    dims: &BTreeMap<Axis, u32>,
) -> Vec<SizeExpr> {
    let mut shape = shape_of(&decl.axes, dims);
    shape.extend(
        decl.user_axes
            .iter()
            .filter_map(|(_, n)| n.map(|n| c(n as u32))),
    );
    shape
}

fn sizes_of(variant: &Variant, names: &[Axis]) -> Vec<SizePlan> {
    names
        .iter()
        .map(|a| SizePlan {
            name: a.name().to_string(),
            fixed: variant
                .fixed_sizes
                .iter()
                .find(|(x, _)| x == a)
                .map(|(_, n)| *n as u64),
        })
        .collect()
}

/// The declared inputs (q, k, v and the custom inputs) as buffers.
fn declared_inputs(variant: &Variant, dims: &BTreeMap<Axis, u32>, elem: Elem) -> Vec<BufferPlan> {
    let qkv = [&variant.q, &variant.k, &variant.v]
        .into_iter()
        .map(|d| BufferPlan {
            name: d.name.clone(),
            role: Role::Input,
            dtype: Dtype::of(elem),
            shape: shape_of(&d.axes, dims),
            zeroed: false,
            when: None,
            doc: format!("{} input", d.name),
        });
    let customs = variant.customs.iter().map(|d| BufferPlan {
        name: d.name.clone(),
        role: Role::Input,
        dtype: Dtype::F32,
        shape: custom_shape(d, dims),
        zeroed: false,
        when: None,
        doc: "custom input".to_string(),
    });
    qkv.chain(customs).collect()
}

fn output(name: &str, dtype: Dtype, shape: Vec<SizeExpr>, doc: &str) -> BufferPlan {
    BufferPlan {
        name: name.to_string(),
        role: Role::Output,
        dtype,
        shape,
        zeroed: false,
        when: None,
        doc: doc.to_string(),
    }
}

fn v(name: &str) -> SizeExpr {
    SizeExpr::var(name)
}

fn c(n: u32) -> SizeExpr {
    SizeExpr::Const(n as u64)
}

/// The kernel arguments of a parallel kernel (forward or backward).
fn parallel_args(
    args: &[ArgKind],
    dims: &BTreeMap<Axis, u32>,
    maps: &[TensorMapSpec],
) -> Vec<ArgPlan> {
    args.iter()
        .map(|a| match a {
            ArgKind::TensorMap(n) => {
                let spec = maps
                    .iter()
                    .find(|m| m.tensor == *n)
                    .expect("every tensor-map argument has its spec");
                ArgPlan::TensorMap(TensorMapPlan {
                    buffer: n.to_string(),
                    dims: spec.dims.clone(),
                    box_dims: spec.box_dims,
                })
            }
            ArgKind::Tensor(n) | ArgKind::Workspace(n) | ArgKind::State(n) => {
                ArgPlan::Ptr(n.to_string())
            }
            ArgKind::RowOut => ArgPlan::Ptr("row_outputs".to_string()),
            ArgKind::Custom(n) => ArgPlan::Ptr(n.clone()),
            ArgKind::CustomGrad(n) => ArgPlan::Ptr(grad_name(n)),
            ArgKind::Size(a) => ArgPlan::I32(axis_expr(*a, dims)),
            ArgKind::KvSplits => ArgPlan::I32(v("kv_splits")),
            other => unreachable!("a parallel kernel takes no {other:?}"),
        })
        .collect()
}

/// The name of a custom input's gradient buffer.
pub fn grad_name(input: &str) -> String {
    format!("d{input}")
}

fn parallel_dims(dqk: u32, dv: u32) -> BTreeMap<Axis, u32> {
    BTreeMap::from([(Axis::Dqk, dqk), (Axis::Dv, dv)])
}

fn parallel_constraints(variant: &Variant) -> (Vec<[String; 2]>, Vec<[String; 2]>) {
    let gqa = variant.parallel().is_some_and(|p| p.kv_heads == Axis::Hkv);
    if gqa {
        (vec![["H".into(), "Hkv".into()]], vec![])
    } else {
        (vec![], vec![["Hkv".into(), "H".into()]])
    }
}

const PARALLEL_SIZES: [Axis; 5] = [Axis::B, Axis::H, Axis::Hkv, Axis::Sq, Axis::Skv];

/// The plan of a parallel forward (either target's [`KernelSource`]).
pub fn forward_plan(variant: &Variant, k: &KernelSource) -> EntryPlan {
    let dims = parallel_dims(k.dqk, k.dv);
    let rows = || [v("B"), v("H"), v("Sq")];
    let mut buffers = declared_inputs(variant, &dims, k.elem);
    let mut same_tensor = Vec::new();
    if k.v_in_k {
        // V is read from K's rows: the kernel takes the one cache as both
        // (as `ParallelKernels::forward` does with `v_in_k`), so `v` is k's
        // tensor again and is checked as one.
        let key = buffers[1].clone();
        let value = &mut buffers[2];
        value.shape = key.shape;
        value.doc = format!(
            "the same tensor as {} (V is the first Dv = {} columns of each of its rows)",
            key.name, k.dv
        );
        same_tensor.push([value.name.clone(), key.name]);
    }
    buffers.push(output(
        "o",
        Dtype::of(k.elem),
        vec![v("B"), v("H"), v("Sq"), c(k.dv)],
        "the attention output",
    ));
    let n_rows = k.row_outputs.len().max(1) as u64;
    buffers.push(output(
        "row_outputs",
        Dtype::F32,
        std::iter::once(SizeExpr::Const(n_rows))
            .chain(rows())
            .collect(),
        &format!(
            "per query row: {} (the backward reads them)",
            if k.row_outputs.is_empty() {
                "nothing (one unused row)".to_string()
            } else {
                k.row_outputs.join(", ")
            }
        ),
    ));
    let (block_rows, y) = if k.packed_gqa {
        (
            SizeExpr::ceil_div(
                SizeExpr::mul([SizeExpr::ceil_div(v("H"), v("Hkv")), v("Sq")]),
                c(k.block_m),
            ),
            v("Hkv"),
        )
    } else {
        (SizeExpr::ceil_div(v("Sq"), c(k.block_m)), v("H"))
    };
    let x = SizeExpr::mul(
        [block_rows.clone()]
            .into_iter()
            .chain((k.dv_split > 1).then(|| c(k.dv_split))),
    );
    let mut launches = Vec::new();
    let mut kv_splits = None;
    let args = parallel_args(&k.args, &dims, &k.tensor_maps);
    // A persistent kernel walks pairs of row blocks (per Dv slice, head row
    // and batch) with at most one block per multiprocessor
    // ([`KernelSource::persistent_units`]).
    let grid = if k.persistent {
        let units = SizeExpr::mul(
            [SizeExpr::ceil_div(block_rows.clone(), c(2))]
                .into_iter()
                .chain((k.dv_split > 1).then(|| c(k.dv_split)))
                .chain([y.clone(), v("B")]),
        );
        // (Clusters of two: an even grid, a cluster per two multiprocessors.)
        let blocks = if k.cluster_pairs {
            SizeExpr::mul([
                c(2),
                SizeExpr::min(
                    SizeExpr::ceil_div(units, c(2)),
                    SizeExpr::floor_div(v(SMS), c(2)),
                ),
            ])
        } else {
            SizeExpr::min(units, v(SMS))
        };
        [blocks, c(1), c(1)]
    } else {
        [x.clone(), y.clone(), v("B")]
    };
    if !k.split_kv {
        launches.push(LaunchPlan {
            entry: k.name.clone(),
            module: None,
            grid,
            threads: k.threads,
            dynamic_smem_bytes: k.smem_bytes,
            args,
            when: None,
        });
    } else {
        for (name, per_row) in [("opart", k.dv), ("spart", k.split_state_words)] {
            buffers.push(BufferPlan {
                name: name.to_string(),
                role: Role::Workspace,
                dtype: Dtype::F32,
                shape: vec![v("kv_splits"), v("B"), v("H"), v("Sq"), c(per_row)],
                zeroed: false,
                when: Some(Condition::SplitKv),
                doc: format!(
                    "split-KV partial {}",
                    if name == "opart" { "outputs" } else { "states" }
                ),
            });
        }
        if k.merges_splits_in_kernel() {
            // The main kernel merges the splits: the last block of a row
            // block to finish, counted here (the kernel leaves it zero). The
            // counters are i32; plans have no integer buffers, and a zeroed
            // 4-byte word is the same bits either way.
            buffers.push(BufferPlan {
                name: "split_count".to_string(),
                role: Role::Workspace,
                dtype: Dtype::F32,
                shape: vec![x.clone(), y.clone(), v("B")],
                zeroed: true,
                when: Some(Condition::SplitKv),
                doc: "finished blocks per row block of a split-KV launch".to_string(),
            });
        }
        kv_splits = Some(KvSplitPlan {
            blocks: SizeExpr::mul([x.clone(), y.clone(), v("B")]),
            key_blocks: SizeExpr::ceil_div(v("Skv"), c(k.block_n)),
            max_splits: MAX_KV_SPLITS,
            block_smem_bytes: u64::from(k.smem_bytes),
            block_bytes_in_flight: k.kv_bytes_in_flight,
            block_fixed_work: k.split_fixed_work,
            rule: "1 when the grid already has 2 blocks per multiprocessor; otherwise \
                   the splits s from 1 to min(clamp(key_blocks / 4, 1, max_splits), \
                   max(1, resident * SMs / blocks)) with the least cost \
                   n * (ceil(key_blocks / s) * 1024 + w) / 1024 * (2^20 + d * d * 80 / 1024) \
                   / 1024 (w = block_fixed_work, 1024 where 0), \
                   n = ceil(blocks * s / SMs) (the busiest multiprocessor's blocks), \
                   d = max(0, 65536 * 1024 / f - 1024), f = max(1, min(n, resident)) \
                   * block_bytes_in_flight (the K/V bytes its resident blocks keep in \
                   flight; block_bytes_in_flight 0 counts as 32768), integer \
                   arithmetic, the fewest among equals; resident \
                   being the driver's occupancy count for the split launch's function \
                   where known, else floor(smem_per_sm / (block_smem_bytes + 1024)) \
                   where block_smem_bytes > 0, else unknown (no cap, min(n, resident) \
                   = n)"
                .to_string(),
        });
        launches.push(LaunchPlan {
            entry: k.name.clone(),
            module: None,
            grid: [SizeExpr::mul([x, v("kv_splits")]), y, v("B")],
            threads: k.threads,
            dynamic_smem_bytes: k.smem_bytes,
            args: args.clone(),
            when: None,
        });
        if let Some(combine) = &k.combine {
            launches.push(LaunchPlan {
                entry: combine.clone(),
                module: None,
                grid: [
                    SizeExpr::ceil_div(SizeExpr::mul(rows()), c(k.combine_rows())),
                    c(1),
                    c(1),
                ],
                threads: k.combine_threads(),
                dynamic_smem_bytes: 0,
                args,
                when: Some(Condition::SplitKv),
            });
        }
    }
    let (multiple_of, equal) = parallel_constraints(variant);
    EntryPlan {
        pass: "forward".to_string(),
        sizes: sizes_of(variant, &PARALLEL_SIZES),
        multiple_of,
        equal,
        buffers,
        same_tensor,
        launches,
        kv_splits,
    }
}

/// What a backward's plan takes from its generated source (CUDA's
/// `BackwardSource` or HIP's `HipBackwardSource`, through their `kernels`).
#[derive(Clone, Copy, Debug)]
pub struct BackwardKernels<'a> {
    /// `pre`, `main`, `post`, launched in order with the same arguments.
    pub launches: [&'a Launch; 3],
    pub args: &'a [ArgKind],
    /// The tensor maps among `args` (TMA loads of q and dO).
    pub tensor_maps: &'a [TensorMapSpec],
    pub row_outputs: &'a [String],
    /// Whether the row kernel fills the `qmod` workspace.
    pub modifies_q: bool,
}

/// The plan of a parallel backward: its three kernels (`pre`, `main`,
/// `post`, any target) launched in order with the same arguments.
pub fn backward_plan(
    variant: &Variant,
    (dqk, dv): (u32, u32),
    elem: Elem,
    kernels: BackwardKernels<'_>,
) -> EntryPlan {
    let BackwardKernels {
        launches,
        args,
        tensor_maps,
        row_outputs,
        modifies_q,
    } = kernels;
    let dims = parallel_dims(dqk, dv);
    let el = Dtype::of(elem);
    let mut buffers = declared_inputs(variant, &dims, elem);
    let q_rows = [v("B"), v("H"), v("Sq")];
    let kv_rows = [v("B"), v("Hkv"), v("Skv")];
    let with = |rows: &[SizeExpr; 3], d: u32| rows.iter().cloned().chain([c(d)]).collect();
    buffers.push(BufferPlan {
        role: Role::Input,
        ..output("o", el, with(&q_rows, dv), "the forward's output")
    });
    buffers.push(BufferPlan {
        role: Role::Input,
        ..output(
            "row_outputs",
            Dtype::F32,
            std::iter::once(SizeExpr::Const(row_outputs.len().max(1) as u64))
                .chain(q_rows.iter().cloned())
                .collect(),
            "the forward's row outputs",
        )
    });
    buffers.push(BufferPlan {
        role: Role::Input,
        ..output("dout", el, with(&q_rows, dv), "the gradient of the output")
    });
    let work = |name: &str, dtype: Dtype, shape: Vec<SizeExpr>, doc: &str| BufferPlan {
        role: Role::Workspace,
        ..output(name, dtype, shape, doc)
    };
    buffers.push(work(
        "dot",
        Dtype::F32,
        q_rows.to_vec(),
        "the row reduction of dO and O",
    ));
    buffers.push(work(
        "qmod",
        el,
        if modifies_q {
            with(&q_rows, dqk)
        } else {
            vec![c(1)]
        },
        "the modified queries",
    ));
    buffers.push(work(
        "dq_acc",
        Dtype::F32,
        with(&q_rows, dqk),
        "dq accumulated in f32",
    ));
    buffers.push(output("dq", el, with(&q_rows, dqk), "the gradient of q"));
    buffers.push(output("dk", el, with(&kv_rows, dqk), "the gradient of k"));
    buffers.push(output("dv", el, with(&kv_rows, dv), "the gradient of v"));
    for cst in &variant.customs {
        buffers.push(BufferPlan {
            zeroed: true,
            ..output(
                &grad_name(&cst.name),
                Dtype::F32,
                custom_shape(cst, &dims),
                &format!("the gradient of `{}`", cst.name),
            )
        });
    }
    let args = parallel_args(args, &dims, tensor_maps);
    let launches = launches
        .into_iter()
        .map(|l| {
            let grid = match l.grid {
                Grid::Rows { per_block } => [
                    SizeExpr::ceil_div(SizeExpr::mul(q_rows.clone()), c(per_block)),
                    c(1),
                    c(1),
                ],
                Grid::KeyBlocks { block_n, groups } => {
                    let blocks = SizeExpr::ceil_div(v("Skv"), c(block_n));
                    let x = if groups == 1 {
                        blocks
                    } else {
                        SizeExpr::mul([blocks, c(groups)])
                    };
                    [x, v("Hkv"), v("B")]
                }
                Grid::Elements { per_block } => [
                    SizeExpr::ceil_div(
                        SizeExpr::mul(q_rows.iter().cloned().chain([c(dqk)])),
                        c(per_block),
                    ),
                    c(1),
                    c(1),
                ],
            };
            LaunchPlan {
                entry: l.name.clone(),
                module: None,
                grid,
                threads: l.threads,
                dynamic_smem_bytes: l.smem_bytes,
                args: args.clone(),
                when: None,
            }
        })
        .collect();
    let (multiple_of, equal) = parallel_constraints(variant);
    EntryPlan {
        pass: "backward".to_string(),
        sizes: sizes_of(variant, &PARALLEL_SIZES),
        multiple_of,
        equal,
        buffers,
        same_tensor: Vec::new(),
        launches,
        kv_splits: None,
    }
}

/// The plan of a recurrent forward: one launch, the initial state and
/// normaliser optional inputs (absent: zero), the final ones optional
/// outputs.
pub fn recurrent_forward_plan(variant: &Variant, k: &RecurrentSource) -> EntryPlan {
    let dims = BTreeMap::from([(Axis::Dk, k.dk), (Axis::Dv, k.dv)]);
    let mut buffers = declared_inputs(variant, &dims, k.config.elem);
    buffers.push(output(
        "o",
        Dtype::of(k.config.elem),
        vec![v("B"), v("H"), v("S"), c(k.dv)],
        "the output",
    ));
    let state = || vec![v("B"), v("H"), c(k.dk), c(k.dv)];
    let norm = || vec![v("B"), v("H"), c(k.dk)];
    let optional = |name: &str, role: Role, shape: Vec<SizeExpr>, doc: &str| BufferPlan {
        role,
        ..output(name, Dtype::F32, shape, doc)
    };
    buffers.push(optional(
        "state_in",
        Role::OptionalInput,
        state(),
        "the initial state (absent: zero)",
    ));
    buffers.push(optional(
        "state_out",
        Role::OptionalOutput,
        state(),
        "the final state",
    ));
    if k.normalized {
        buffers.push(optional(
            "norm_in",
            Role::OptionalInput,
            norm(),
            "the initial normaliser (absent: zero)",
        ));
        buffers.push(optional(
            "norm_out",
            Role::OptionalOutput,
            norm(),
            "the final normaliser",
        ));
    }
    let args = k
        .args
        .iter()
        .map(|a| match a {
            // Libraries walk every chain of the sm_90a forward whole so far:
            // no segment schedule (its sizes are then ignored).
            ArgKind::Workspace(n @ ("sched" | "carry")) => ArgPlan::Null(n.to_string()),
            ArgKind::Segments(_) => ArgPlan::I32(c(0)),
            ArgKind::Tensor(n) | ArgKind::State(n) | ArgKind::Workspace(n) => {
                ArgPlan::Ptr(n.to_string())
            }
            ArgKind::Custom(n) => ArgPlan::Ptr(n.clone()),
            ArgKind::Size(a) => ArgPlan::I32(axis_expr(*a, &dims)),
            // Libraries launch batches of equal lengths so far.
            ArgKind::CuSeqlens => ArgPlan::Null("cu_seqlens".to_string()),
            other => unreachable!("a recurrent forward takes no {other:?}"),
        })
        .collect();
    EntryPlan {
        pass: "forward".to_string(),
        sizes: sizes_of(variant, &[Axis::B, Axis::H, Axis::S]),
        multiple_of: vec![],
        equal: vec![],
        buffers,
        same_tensor: Vec::new(),
        launches: vec![LaunchPlan {
            entry: k.name.clone(),
            module: None,
            grid: [c(k.dv / k.config.dv_tile), v("H"), v("B")],
            threads: k.threads,
            dynamic_smem_bytes: k.smem_bytes,
            args,
            when: None,
        }],
        kv_splits: None,
    }
}

/// The x extent of a recurrent backward kernel's grid as an expression of
/// `S`: what [`RecurrentGridX::extent`] computes (Dv slices, chunks of
/// `chunk` steps times a split, row groups, or 1).
pub fn recurrent_grid_x(x: RecurrentGridX, dv: u32, chunk: u32) -> SizeExpr {
    match x {
        RecurrentGridX::DvSlices(n) => c(dv / n),
        RecurrentGridX::Chunks(n) => {
            let chunks = SizeExpr::ceil_div(v("S"), c(chunk));
            if n == 1 {
                chunks
            } else {
                SizeExpr::mul([chunks, c(n)])
            }
        }
        RecurrentGridX::Rows(n) => SizeExpr::ceil_div(v("S"), c(n)),
        RecurrentGridX::One => c(1),
    }
}

/// The kernel arguments of a recurrent kernel: buffers by the argument's
/// name except where `rename` maps it (the states pass writes its `o` into
/// the workspace `o_raw`) or `null` lists it (a null pointer).
fn recurrent_args(
    args: &[ArgKind],
    dims: &BTreeMap<Axis, u32>,
    rename: &[(&str, &str)],
    null: &[&str],
) -> Vec<ArgPlan> {
    args.iter()
        .map(|a| match a {
            ArgKind::Tensor(n) | ArgKind::State(n) | ArgKind::Workspace(n) => {
                if null.contains(n) {
                    ArgPlan::Null(n.to_string())
                } else {
                    let to = rename.iter().find(|(from, _)| from == n).map(|(_, to)| *to);
                    ArgPlan::Ptr(to.unwrap_or(n).to_string())
                }
            }
            ArgKind::Custom(n) => ArgPlan::Ptr(n.clone()),
            ArgKind::CustomGrad(n) => ArgPlan::Ptr(grad_name(n)),
            ArgKind::Size(a) => ArgPlan::I32(axis_expr(*a, dims)),
            ArgKind::CuSeqlens => ArgPlan::Null("cu_seqlens".to_string()),
            other => unreachable!("a recurrent kernel takes no {other:?}"),
        })
        .collect()
}

/// The plan of a recurrent backward ([`RecurrentBackwardSource`]): the
/// states pass (in the module [`STATES_MODULE`], a second source) recomputes
/// the state before each chunk from the forward's inputs and initial state,
/// then the backward kernels run in order on one argument list.
///
/// Inputs: q, k, v, the custom inputs, `do` (the output's gradient), and
/// optionally the forward's `state_in` (and `norm_in`) and the gradients of
/// its final state `d_state_out` (and `d_norm_out`); absent ones are zero.
/// Outputs: dq, dk, dv, the custom inputs' gradients (f32, zero-filled: the
/// kernels add into them) and, when asked for, `d_state_in` (and
/// `d_norm_in`). Workspaces: `states`, `dstates` (`[B, H, chunks, Dk, Dv]`,
/// chunks = ceil(S / chunk)); with a normaliser `norm_states`,
/// `dnorm_states`, `o_raw`, `dob`, `row_n`, `dn`; with a decay `dlog`
/// (zero-filled).
pub fn recurrent_backward_plan(variant: &Variant, b: &RecurrentBackwardSource) -> EntryPlan {
    let (dk, dv, chunk) = (b.dk, b.dv, b.config.chunk);
    let dims = BTreeMap::from([(Axis::Dk, dk), (Axis::Dv, dv)]);
    let el = Dtype::of(b.config.elem);
    let rows = || vec![v("B"), v("H"), v("S")];
    let with = |d: u32| {
        let mut r = rows();
        r.push(c(d));
        r
    };
    let chunks = || SizeExpr::ceil_div(v("S"), c(chunk));
    let state = || vec![v("B"), v("H"), c(dk), c(dv)];
    let norm = || vec![v("B"), v("H"), c(dk)];
    let buf = |name: &str, role: Role, dtype: Dtype, shape: Vec<SizeExpr>, doc: &str| BufferPlan {
        role,
        ..output(name, dtype, shape, doc)
    };
    let mut buffers = declared_inputs(variant, &dims, b.config.elem);
    buffers.push(buf(
        "do",
        Role::Input,
        el,
        with(dv),
        "the gradient of the output",
    ));
    buffers.push(buf(
        "state_in",
        Role::OptionalInput,
        Dtype::F32,
        state(),
        "the forward's initial state (absent: zero)",
    ));
    if b.normalized {
        buffers.push(buf(
            "norm_in",
            Role::OptionalInput,
            Dtype::F32,
            norm(),
            "the forward's initial normaliser (absent: zero)",
        ));
    }
    buffers.push(buf(
        "d_state_out",
        Role::OptionalInput,
        Dtype::F32,
        state(),
        "the gradient of the final state (absent: zero)",
    ));
    if b.normalized {
        buffers.push(buf(
            "d_norm_out",
            Role::OptionalInput,
            Dtype::F32,
            norm(),
            "the gradient of the final normaliser (absent: zero)",
        ));
    }
    buffers.push(output("dq", el, with(dk), "the gradient of q"));
    buffers.push(output("dk", el, with(dk), "the gradient of k"));
    buffers.push(output("dv", el, with(dv), "the gradient of v"));
    for cst in &variant.customs {
        buffers.push(BufferPlan {
            zeroed: true,
            ..output(
                &grad_name(&cst.name),
                Dtype::F32,
                custom_shape(cst, &dims),
                &format!("the gradient of `{}`", cst.name),
            )
        });
    }
    buffers.push(buf(
        "d_state_in",
        Role::OptionalOutput,
        Dtype::F32,
        state(),
        "the gradient of the initial state",
    ));
    if b.normalized {
        buffers.push(buf(
            "d_norm_in",
            Role::OptionalOutput,
            Dtype::F32,
            norm(),
            "the gradient of the initial normaliser",
        ));
    }
    let per_chunk = |d: Vec<SizeExpr>| {
        let mut s = vec![v("B"), v("H"), chunks()];
        s.extend(d);
        s
    };
    buffers.push(buf(
        "states",
        Role::Workspace,
        el,
        per_chunk(vec![c(dk), c(dv)]),
        "the state before each chunk (the states pass writes it)",
    ));
    buffers.push(buf(
        "dstates",
        Role::Workspace,
        el,
        per_chunk(vec![c(dk), c(dv)]),
        "the state's gradient after each chunk",
    ));
    if b.normalized {
        buffers.push(buf(
            "norm_states",
            Role::Workspace,
            Dtype::F32,
            per_chunk(vec![c(dk)]),
            "the key sum before each chunk",
        ));
        buffers.push(buf(
            "dnorm_states",
            Role::Workspace,
            Dtype::F32,
            per_chunk(vec![c(dk)]),
            "the key sum's gradient after each chunk",
        ));
        buffers.push(buf(
            "o_raw",
            Role::Workspace,
            el,
            with(dv),
            "the output before normalisation",
        ));
        buffers.push(buf(
            "dob",
            Role::Workspace,
            el,
            with(dv),
            "the gradient of the output before normalisation",
        ));
        buffers.push(buf(
            "row_n",
            Role::Workspace,
            Dtype::F32,
            rows(),
            "each row's normaliser",
        ));
        buffers.push(buf(
            "dn",
            Role::Workspace,
            Dtype::F32,
            rows(),
            "the gradient of each row's normaliser",
        ));
    }
    if b.decay {
        let (shape, what) = if b.per_key {
            (
                with(dk),
                "the gradient of each step's log decay per key dimension (the kernels add into it)",
            )
        } else {
            (
                rows(),
                "the gradient of each step's log decay (the kernels add into it)",
            )
        };
        buffers.push(BufferPlan {
            zeroed: true,
            ..buf("dlog", Role::Workspace, Dtype::F32, shape, what)
        });
    }
    let st = &b.states;
    let mut launches = vec![LaunchPlan {
        entry: st.name.clone(),
        module: Some(STATES_MODULE.to_string()),
        grid: [c(st.dv / st.config.dv_tile), v("H"), v("B")],
        threads: st.threads,
        dynamic_smem_bytes: st.smem_bytes,
        args: recurrent_args(
            &st.args,
            &dims,
            &[("o", "o_raw")],
            &["state_out", "norm_out"],
        ),
        when: None,
    }];
    let args = recurrent_args(&b.args, &dims, &[], &[]);
    launches.extend(b.kernels.iter().map(|k| LaunchPlan {
        entry: k.name.clone(),
        module: None,
        grid: [recurrent_grid_x(k.grid_x, dv, chunk), v("H"), v("B")],
        threads: k.threads,
        dynamic_smem_bytes: k.smem_bytes,
        args: args.clone(),
        when: None,
    }));
    EntryPlan {
        pass: "backward".to_string(),
        sizes: sizes_of(variant, &[Axis::B, Axis::H, Axis::S]),
        multiple_of: vec![],
        equal: vec![],
        buffers,
        same_tensor: Vec::new(),
        launches,
        kv_splits: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_evaluate_and_round_trip_through_json() {
        let e = SizeExpr::mul([
            SizeExpr::ceil_div(SizeExpr::mul([v("H"), v("Sq")]), c(128)),
            c(2),
        ]);
        let vars = |n: &str| match n {
            "H" => Some(3),
            "Sq" => Some(100),
            _ => None,
        };
        assert_eq!(e.eval(&vars), Some(6));
        assert_eq!(e.to_string(), "ceil(H * Sq / 128) * 2");
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(json, r#"{"mul":[{"ceil_div":[{"mul":["H","Sq"]},128]},2]}"#);
        assert_eq!(serde_json::from_str::<SizeExpr>(&json).unwrap(), e);
        assert_eq!(v("Skv").eval(&vars), None);
        // A persistent grid: the units, at most one block per multiprocessor.
        let g = SizeExpr::min(SizeExpr::mul([v("H"), v("Sq")]), v(SMS));
        let on = |sms: u64| move |n: &str| if n == SMS { Some(sms) } else { vars(n) };
        assert_eq!(g.eval(&on(132)), Some(132));
        assert_eq!(g.eval(&on(1000)), Some(300));
        assert_eq!(g.eval(&vars), None);
        assert_eq!(g.to_string(), "min(H * Sq, sms)");
        let json = serde_json::to_string(&g).unwrap();
        assert_eq!(json, r#"{"min":[{"mul":["H","Sq"]},"sms"]}"#);
        assert_eq!(serde_json::from_str::<SizeExpr>(&json).unwrap(), g);
        assert_eq!(g.vars(), ["H", "Sq", "sms"]);
    }

    #[test]
    fn kv_split_rule_matches_the_runtime_heuristic() {
        let p = KvSplitPlan {
            blocks: v("blocks"),
            key_blocks: v("kb"),
            max_splits: 128,
            block_smem_bytes: 0,
            block_bytes_in_flight: 0,
            block_fixed_work: 0,
            rule: String::new(),
        };
        let at = |blocks: u64, kb: u64| {
            move |n: &str| match n {
                "blocks" => Some(blocks),
                "kb" => Some(kb),
                _ => None,
            }
        };
        let unknown = Residency::Unknown;
        assert_eq!(p.splits(&at(264, 100), 132, unknown), 1);
        // 8 blocks, 256 key blocks: 32 splits put two blocks of 8 key
        // blocks on each busy SM; 33 would be no faster, 16 (one block of
        // 16 on each) slower.
        assert_eq!(p.splits(&at(8, 256), 132, unknown), 32);
        assert_eq!(p.splits(&at(8, 8), 132, unknown), 2);
        assert_eq!(p.splits(&at(1, 100_000), 132, unknown), 128);
        // Blocks of 93 KB, two per 228 KB SM: one wave of 264 blocks.
        let big = KvSplitPlan {
            block_smem_bytes: 93_440,
            ..p.clone()
        };
        let h100 = Residency::SharedMemory(228 * 1024);
        assert_eq!(big.splits(&at(128, 128), 132, h100), 2);
        assert_eq!(big.splits(&at(128, 128), 132, unknown), 2);
        assert_eq!(big.splits(&at(200, 128), 132, h100), 1);
        // 32 blocks: 8 splits (two blocks on every SM), not the 9 that
        // ceil(2 · 132 / 32) gave (three on some), whatever the residency.
        for r in [unknown, h100, Residency::Blocks(2), Residency::Blocks(3)] {
            assert_eq!(p.splits(&at(32, 128), 132, r), 8, "{r:?}");
        }
        assert_eq!(p.splits(&at(200, 128), 132, Residency::Blocks(1)), 1);
        // 140 blocks: a second split is a second wave where two fit an SM,
        // and takes the busiest SM from two whole blocks to three halves
        // where three fit.
        assert_eq!(p.splits(&at(140, 128), 132, Residency::Blocks(2)), 1);
        assert_eq!(p.splits(&at(140, 128), 132, Residency::Blocks(3)), 2);
        use crate::cuda::forward::split_cost;
        // The busiest SM's time: blocks × (key blocks + 1) × 1024, slower
        // by 1 + 0.078 · (64 KiB / in flight − 1)² below 64 KiB in flight on
        // the SM (1104 / 1024 at half of it, 1744 / 1024 at a quarter); a
        // block whose bytes in flight are not known counts as 32 KiB.
        assert_eq!(split_cost(32, 64, 8, 132, Some(3), 0, 0), 2 * 9 * 1024);
        assert_eq!(split_cost(32, 64, 9, 132, Some(3), 0, 0), 3 * 9 * 1024);
        assert_eq!(split_cost(32, 64, 4, 132, Some(3), 0, 0), 17 * 1104);
        assert_eq!(split_cost(8, 256, 33, 132, Some(1), 0, 0), 2 * 9 * 1104);
        assert_eq!(split_cost(8, 256, 33, 132, Some(1), 16384, 0), 2 * 9 * 1744);
        // 16 KiB per block: two resident stream 8% slower than four.
        assert_eq!(
            split_cost(256, 128, 1, 132, Some(6), 16384, 0),
            2 * 129 * 1104
        );
        assert_eq!(
            split_cost(256, 128, 2, 132, Some(6), 16384, 0),
            4 * 65 * 1024
        );
        assert_eq!(
            split_cost(32, 64, 4, 132, Some(1), 128 * 1024, 0),
            17 * 1024
        );
    }

    #[test]
    fn kv_split_rule_keeps_the_dram_busy() {
        // The d128 decoding tile (16 KiB of K/V in flight per block, six
        // resident per SM) at the shapes of the H200 sweep (bench/NOTES.md
        // session 67): (grid blocks, key blocks, the fastest splits, the
        // rule's). B16 × 4096 ran 66.9 µs at 5 splits and 67.4 at 4; B24 ×
        // 4096 96.6 at 3 and 96.7 at 2; the others are the fastest.
        let p = KvSplitPlan {
            blocks: v("blocks"),
            key_blocks: v("kb"),
            max_splits: 128,
            block_smem_bytes: 36_864,
            block_bytes_in_flight: 16 * 1024,
            block_fixed_work: 1792,
            rule: String::new(),
        };
        for (blocks, kb, splits) in [
            (32 * 8, 128, 2),
            (16 * 8, 128, 4),
            (24 * 8, 128, 2),
            (8 * 8, 512, 8),
            (16 * 8, 256, 4),
            (4 * 8, 1024, 16),
            (48 * 8, 128, 1),
        ] {
            let at = move |n: &str| match n {
                "blocks" => Some(blocks),
                "kb" => Some(kb),
                _ => None,
            };
            assert_eq!(
                p.splits(&at, 132, Residency::Blocks(6)),
                splits,
                "{blocks} × {kb}"
            );
        }
        // The same grid with 128 KiB in flight per block (the fat tile):
        // two blocks of 128 keys cost no more than one of 256, so 1.
        let fat = KvSplitPlan {
            block_bytes_in_flight: 128 * 1024,
            ..p.clone()
        };
        let at = |n: &str| match n {
            "blocks" => Some(256),
            "kb" => Some(128),
            _ => None,
        };
        assert_eq!(fat.splits(&at, 132, Residency::Blocks(6)), 1);
    }
}
