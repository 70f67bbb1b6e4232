//! The untuned tiles of a library's declared workloads (`aec compile
//! --workload`). A kernel library has no call shape at build time, so its
//! default forward is one tile for every shape; the Rust runtime's
//! `compile_for_shape` instead adapts the tile to the call
//! (`aec::run::untuned_choice`: the decoding rule's tile for packed or few
//! rows, on sm_90a the cost model's first plan where the default leaves the
//! grid short of a wave). For each declared workload on each CUDA product
//! target this module finds that choice; `aec compile` builds each one that
//! differs from the default once and lists the product and shape bucket in
//! the record's `tuned_for`, after the measured records, so that a result
//! of `aec tune` for the same bucket wins.

use super::compile::Target;
use aec::compiler::launch_plan::EntryPlan;
use aec::compiler::schedule::{DeviceConfig, KernelConfig};
use aec::compiler::{Elem, ForwardConfig, Isa};
use aec::frontend::Variant;
use aec::library::tuning_table::{BUCKET_SIZES, BUCKETED};
use aec::run::{HeadDims, Shape, UntunedReason, untuned_choice};
use aec::runtime::ShapeBucket;
use serde_json::{Map, Value, json};

/// One `--workload` as given and its sizes by name.
#[derive(Clone, Debug)]
pub(super) struct Declared {
    pub text: String,
    pub sizes: Map<String, Value>,
}

/// The `--workload` arguments: `SIZE=N` pairs separated by commas, each size
/// once, every value a positive integer.
pub(super) fn parse(given: &[String]) -> Result<Vec<Declared>, String> {
    given
        .iter()
        .map(|w| {
            let mut sizes = Map::new();
            for part in w.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let (k, n) = part.split_once('=').ok_or_else(|| {
                    format!("--workload `{w}`: expected SIZE=N pairs separated by commas, e.g. `B=4,H=16,Sq=4096,Skv=4096`")
                })?;
                let n: u64 = n.trim().parse().ok().filter(|&n| n >= 1).ok_or_else(|| {
                    format!(
                        "--workload `{w}`: `{}` must be a positive integer",
                        n.trim()
                    )
                })?;
                if sizes.insert(k.trim().to_string(), json!(n)).is_some() {
                    return Err(format!("--workload `{w}`: `{}` is given twice", k.trim()));
                }
            }
            if let (Some(h), Some(hkv)) = (
                sizes.get("H").and_then(Value::as_u64),
                sizes.get("Hkv").and_then(Value::as_u64),
            ) && h % hkv != 0
            {
                return Err(uneven_group(w, h, hkv));
            }
            Ok(Declared {
                text: w.clone(),
                sizes,
            })
        })
        .collect()
}

fn uneven_group(workload: &str, h: u64, hkv: u64) -> String {
    format!(
        "--workload `{workload}`: H = {h} is not a multiple of Hkv = {hkv} (each key/value head serves a group of query heads)"
    )
}

/// The names of a plan's free sizes: those a call binds from its tensors
/// (neither fixed by the variant nor equal to another size).
pub(super) fn free_sizes(plan: &EntryPlan) -> Vec<&str> {
    plan.sizes
        .iter()
        .filter(|s| s.fixed.is_none() && !plan.equal.iter().any(|[a, _]| *a == s.name))
        .map(|s| s.name.as_str())
        .collect()
}

/// The shape a declared workload gives a plan whose free sizes it names
/// exactly (fixed sizes from the plan, equal ones from their partner); None
/// when it names other sizes (it is for another kernel of the library).
fn shape_of(plan: &EntryPlan, declared: &Declared) -> Result<Option<Shape>, String> {
    let free = free_sizes(plan);
    if free.len() != declared.sizes.len() || !free.iter().all(|n| declared.sizes.contains_key(*n)) {
        return Ok(None);
    }
    let size = |name: &str| -> Option<usize> {
        let name = plan
            .equal
            .iter()
            .find(|[a, _]| a == name)
            .map_or(name, |[_, b]| b.as_str());
        declared
            .sizes
            .get(name)
            .and_then(Value::as_u64)
            .or_else(|| plan.sizes.iter().find(|s| s.name == name)?.fixed)
            .and_then(|n| usize::try_from(n).ok())
    };
    let [b, h, hkv, sq, skv] = BUCKET_SIZES.map(size);
    let (Some(b), Some(h), Some(hkv), Some(sq), Some(skv)) = (b, h, hkv, sq, skv) else {
        return Ok(None); // not a parallel forward's sizes
    };
    if h % hkv != 0 {
        // A size the variant fixes against one the workload gives.
        return Err(uneven_group(&declared.text, h as u64, hkv as u64));
    }
    Ok(Some(Shape::new(b, h, hkv, sq, skv)))
}

/// One configuration the declared workloads run untuned, other than the
/// default, with the `tuned_for` items (product, shape bucket, why) where
/// it runs.
#[derive(Debug)]
pub(super) struct UntunedTile {
    pub config: ForwardConfig,
    pub items: Vec<Value>,
}

/// A product's shape bucket and the first workload that fell in it.
struct HeldBucket<'a> {
    product: &'static str,
    bucket: [u64; 5],
    workload: &'a str,
    config: ForwardConfig,
}

/// What [`untuned_tiles`] reads besides the workloads.
pub(super) struct ForwardOfLibrary<'a> {
    pub variant: &'a Variant,
    pub dims: HeadDims,
    /// The default forward's launch plan (its sizes).
    pub plan: &'a EntryPlan,
    /// The default forward's configuration.
    pub default: &'a ForwardConfig,
    pub isa: Isa,
    /// The CUDA product targets of `isa`.
    pub targets: &'a [Target],
    pub v_in_k: bool,
}

/// The untuned configurations of `declared` (those that name the forward's
/// free sizes) on each of the forward's product targets that differ from
/// its default, in order of first appearance. Where two workloads fall in
/// one shape bucket the first one's choice holds it (a note says so when
/// they differ).
pub(super) fn untuned_tiles(
    forward: &ForwardOfLibrary<'_>,
    declared: &[Declared],
) -> Result<Vec<UntunedTile>, String> {
    let mut tiles: Vec<UntunedTile> = Vec::new();
    let mut held: Vec<HeldBucket<'_>> = Vec::new();
    for target in forward.targets {
        let Some(device) = DeviceConfig::named(target.name()) else {
            continue;
        };
        for d in declared {
            let Some(shape) = shape_of(forward.plan, d)? else {
                continue;
            };
            let choice = untuned_choice(
                forward.variant,
                forward.dims,
                shape,
                Elem::Bf16,
                forward.isa,
                &device,
                forward.v_in_k,
            );
            // The bucket as the tuning cache keys it (BUCKET_SIZES' order).
            let b = ShapeBucket::of(shape.b, shape.h, shape.hkv, shape.sq, shape.skv);
            let bucket = [b.b, b.h, b.hkv, b.sq, b.skv].map(u64::from);
            let product = target.name();
            if let Some(h) = held
                .iter()
                .find(|h| h.product == product && h.bucket == bucket)
            {
                if h.config != choice.config {
                    eprintln!(
                        "note: `{}`: --workload `{}` shares its shape bucket on {} with `{}`, whose untuned tile holds it",
                        forward.variant.name, d.text, product, h.workload
                    );
                }
                continue;
            }
            held.push(HeldBucket {
                product,
                bucket,
                workload: &d.text,
                config: choice.config,
            });
            if choice.config == *forward.default {
                continue;
            }
            let label = KernelConfig::Cuda(choice.config).label();
            let mut item = json!({
                "device": target.name(),
                "sms": device.sms,
                "sizes": BUCKET_SIZES
                    .iter()
                    .zip(bucket)
                    .map(|(n, v)| (n.to_string(), json!(v)))
                    .collect::<Map<String, Value>>(),
                "bucketed": BUCKETED,
                "config_label": label,
                "chosen_by": choice.reason.name(),
                "workload": d.text,
            });
            if let UntunedReason::Model { ratio } = choice.reason {
                item["model_speedup"] = json!((ratio * 100.0).round() / 100.0);
            }
            match tiles.iter_mut().find(|t| t.config == choice.config) {
                Some(t) => t.items.push(item),
                None => tiles.push(UntunedTile {
                    config: choice.config,
                    items: vec![item],
                }),
            }
        }
    }
    Ok(tiles)
}
