//! The C interface of a kernel library: [`generate`] writes
//! `DIR/include/aec_library.h` from the library's manifest, over the
//! header-only loader [`LOADER_H`] (`DIR/include/aec_loader.h`).
//!
//! For each variant the header declares `aec_<variant>_sizes` (the sizes a
//! call binds and the head dims, all `int`), and for each pass with a launch
//! plan (`forward`, `backward`):
//!
//! - `aec_<variant>_<pass>_buffers`: one device pointer per caller buffer
//!   (inputs, outputs, optional ones), in plan order, typed by dtype
//!   (`const void*` for bf16/f16 inputs, `float*` for f32 outputs, …);
//! - `size_t aec_<variant>_<pass>_workspace_bytes(lib, sizes)`;
//! - `const char *aec_<variant>_<pass>_kernel(lib, sizes)`: the kernel a
//!   call of `sizes` launches first on the library's GPU (a tuning-table
//!   kernel where the table has one for the GPU and the sizes' bucket);
//! - `int aec_<variant>_<pass>(lib, sizes, buffers, workspace, stream)`.
//!
//! The generated C follows the plan: it makes every call-time check (sizes at
//! least 1, fixed sizes, multiple-of and equal rules, the head dims, required
//! pointers, grid and 32-bit limits) before any launch, picks the build for
//! the GPU's architecture, lays the workspace out in 256-byte aligned
//! sub-buffers, zero-fills the buffers the plan marks, computes `kv_splits`
//! with the plan's rule, encodes the tensor maps the sm_90a kernels take by
//! value (`cuTensorMapEncodeTiled`, extents checked with the sizes, maps
//! encoded before anything is allocated or launched) and launches the
//! kernels in order. The text depends on the manifest only, so the same
//! manifest gives the same header.

use crate::library::loader::{TunedBucket, TunedGpu, parse_tuned_bucket};
use aec_compiler::launch_plan::{
    ArgPlan, Condition, Dtype, EntryPlan, Role, SMS, SizeExpr, SizeOp, TensorMapPlan,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// The header-only loader every generated header includes; `aec compile`
/// writes it as `DIR/include/aec_loader.h`.
pub const LOADER_H: &str = include_str!("../../templates/library/aec_loader.h");

/// The loader's public identifiers, which generated names must not take.
const LOADER_NAMES: &[&str] = &[
    "AEC_LOADER_H",
    "AEC_LIBRARY_H",
    "AEC_LOADER_VERSION",
    "AEC_OK",
    "AEC_ERROR_ARGUMENT",
    "AEC_ERROR_SHAPE",
    "AEC_ERROR_NO_KERNEL",
    "AEC_ERROR_NO_DRIVER",
    "AEC_ERROR_DRIVER",
    "AEC_ERROR_FILE",
    "AEC_ERROR_MEMORY",
    "AEC_ERROR_CAPACITY",
    "AEC_WORKSPACE_INVALID",
    "AEC_WORKSPACE_ALIGN",
    "AEC_TENSOR_ALIGN",
    "aec_library",
    "aec_library_open",
    "aec_library_close",
    "aec_last_error",
    "aec_status_name",
    "aec_device_alloc",
    "aec_device_free",
    "aec_copy_to_device",
    "aec_copy_to_host",
    "aec_synchronize",
    "aec_stream_synchronize",
];

/// C and C++ keywords and the macros of the standard headers the loader
/// includes: a field with one of these names gets a `_` appended.
const RESERVED: &str = "\
    auto break case char const continue default do double else enum extern float for goto if \
    inline int long register restrict return short signed sizeof static struct switch typedef \
    union unsigned void volatile while alignas alignof and and_eq asm bitand bitor bool catch \
    char8_t char16_t char32_t class compl concept consteval constexpr constinit const_cast \
    co_await co_return co_yield decltype delete dynamic_cast explicit export false friend \
    mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public \
    reinterpret_cast requires static_assert static_cast template this thread_local throw true \
    try typeid typename using virtual wchar_t xor xor_eq errno stdin stdout stderr NULL EOF \
    offsetof va_arg va_start va_end va_copy unix linux i386 assert complex imaginary I";

/// A C identifier for `name`: characters outside `[A-Za-z0-9_]` become `_`,
/// a leading digit, a reserved `_X`/`__` start or a keyword gets fixed.
pub fn c_identifier(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert_str(0, "x_");
    } else if !s.contains(|c: char| c.is_ascii_alphanumeric()) {
        s.insert(0, 'x');
    }
    if s.starts_with("__")
        || (s.starts_with('_') && s[1..].starts_with(|c: char| c.is_ascii_uppercase()))
    {
        s.insert(0, 'x');
    }
    if RESERVED.split_whitespace().any(|k| k == s) {
        s.push('_');
    }
    s
}

/// The snake_case C name part of a variant name: `SoftmaxGQA` →
/// `softmax_gqa`, `Mamba2` → `mamba2`, `RetNetParallel` →
/// `ret_net_parallel`; other characters become `_`, runs of `_` collapse.
pub fn snake_name(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() {
            let prev = i.checked_sub(1).map(|j| chars[j]);
            let next = chars.get(i + 1).copied();
            let boundary = prev.is_some_and(|p| p.is_ascii_lowercase() || p.is_ascii_digit())
                || (prev.is_some_and(|p| p.is_ascii_uppercase())
                    && next.is_some_and(|n| n.is_ascii_lowercase()));
            if boundary {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else if c.is_ascii_alphanumeric() {
            out.push(c);
        } else {
            out.push('_');
        }
    }
    let mut collapsed = String::new();
    for c in out.chars() {
        if c == '_' && (collapsed.is_empty() || collapsed.ends_with('_')) {
            continue;
        }
        collapsed.push(c);
    }
    collapsed.trim_end_matches('_').to_string()
}

/// A C string literal's contents for `s`: `\`, `"`, `?` (trigraphs) and
/// control or non-ASCII bytes escaped (octal); `%` doubled when `format`.
fn c_str(s: &str, format: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'"' => out.push_str("\\\""),
            b'?' => out.push_str("\\?"),
            b'%' if format => out.push_str("%%"),
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
    out
}

/// Text for a C comment: no `*/`, one line.
fn comment(s: &str) -> String {
    s.replace("*/", "* /").replace(['\n', '\r'], " ")
}

/// `e` as C: 64-bit arithmetic through the loader's overflow-checked
/// helpers, which set the local `ovf`; names map through `var`.
pub fn c_expr(e: &SizeExpr, var: &dyn Fn(&str) -> String) -> String {
    match e {
        SizeExpr::Const(n) => format!("{n}u"),
        SizeExpr::Var(v) => var(v),
        SizeExpr::Op(SizeOp::Mul(ts)) => {
            let mut it = ts.iter();
            let Some(first) = it.next() else {
                return "1u".to_string();
            };
            it.fold(c_expr(first, var), |acc, t| {
                format!("aecl_mul({acc}, {}, &ovf)", c_expr(t, var))
            })
        }
        SizeExpr::Op(SizeOp::CeilDiv(a, b)) => {
            format!(
                "aecl_ceil_div({}, {}, &ovf)",
                c_expr(a, var),
                c_expr(b, var)
            )
        }
        SizeExpr::Op(SizeOp::FloorDiv(a, b)) => {
            format!(
                "aecl_floor_div({}, {}, &ovf)",
                c_expr(a, var),
                c_expr(b, var)
            )
        }
        SizeExpr::Op(SizeOp::Min(a, b)) => {
            format!("aecl_min({}, {})", c_expr(a, var), c_expr(b, var))
        }
    }
}

fn shape_text(shape: &[SizeExpr]) -> String {
    let dims: Vec<String> = shape.iter().map(|e| e.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

fn role_text(r: Role) -> &'static str {
    match r {
        Role::Input => "input",
        Role::OptionalInput => "optional input (NULL: absent)",
        Role::Output => "output",
        Role::OptionalOutput => "optional output (NULL: not wanted)",
        Role::Workspace => "workspace",
    }
}

fn size_doc(name: &str) -> &'static str {
    match name {
        "B" => "batch size",
        "H" => "heads (query heads)",
        "Hkv" => "key/value heads",
        "Sq" => "query positions",
        "Skv" => "key/value positions",
        "S" => "sequence length",
        "Dqk" => "head dim of q and k",
        "Dk" => "head dim of q and k",
        "Dv" => "head dim of v and the output",
        _ => "size",
    }
}

/// One build of a kernel record.
#[derive(Clone, Debug)]
struct Build {
    target: String,
    arch: String,
    /// The cubin or code object, relative to the library directory.
    file: Option<String>,
    hip: bool,
    /// The record's other modules by key (`states`), cubins relative to
    /// the library directory.
    modules: Vec<(String, Option<String>)>,
}

#[derive(Clone, Debug)]
struct Record {
    /// Where it is in the manifest, for messages.
    at: String,
    head_dims: Vec<(String, u64)>,
    builds: Vec<Build>,
    plan: EntryPlan,
    /// A tuning-table record's GPUs and buckets (empty: a default record).
    tuned_for: Vec<TunedBucket>,
}

#[derive(Clone, Debug)]
struct Pass {
    name: String,
    records: Vec<Record>,
    /// Records without a plan for this pass (`skipped`), as notes.
    skipped: Vec<String>,
}

#[derive(Clone, Debug)]
struct SizeField {
    name: String,
    field: String,
    fixed: Option<u64>,
    head_dim: bool,
}

#[derive(Clone, Debug)]
struct VariantC {
    name: String,
    file: String,
    pattern: String,
    ident: String,
    sizes: Vec<SizeField>,
    passes: Vec<Pass>,
    /// Passes without any plan, with the reason.
    missing: Vec<(String, String)>,
}

fn str_field<'a>(v: &'a Value, key: &str, at: &str) -> Result<&'a str, String> {
    v.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("manifest {at}: `{key}` is missing or not a string"))
}

fn parse_builds(k: &Value, at: &str) -> Result<Vec<Build>, String> {
    let arr = k
        .get("builds")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("manifest {at}: `builds` is missing or not an array"))?;
    arr.iter()
        .enumerate()
        .map(|(i, b)| {
            let bat = format!("{at}.builds[{i}]");
            let target = str_field(b, "target", &bat)?.to_string();
            let arch = str_field(b, "arch", &bat)?.to_string();
            let (key, hip) = if b.get("cubin").is_some() {
                ("cubin", false)
            } else if b.get("code_object").is_some() {
                ("code_object", true)
            } else {
                return Err(format!(
                    "manifest {bat}: neither `cubin` (CUDA) nor `code_object` (HIP) is there"
                ));
            };
            let file = match &b[key] {
                Value::Null => None,
                Value::String(s) => Some(s.clone()),
                _ => {
                    return Err(format!(
                        "manifest {bat}: `{key}` is neither a path nor null"
                    ));
                }
            };
            let mut modules = Vec::new();
            if let Some(m) = b.get("modules") {
                let m = m.as_object().ok_or_else(|| {
                    format!("manifest {bat}: `modules` is not an object of paths")
                })?;
                for (k, path) in m {
                    modules.push((
                        k.clone(),
                        match path {
                            Value::Null => None,
                            Value::String(s) => Some(s.clone()),
                            _ => {
                                return Err(format!(
                                    "manifest {bat}: module `{k}` is neither a path nor null"
                                ));
                            }
                        },
                    ));
                }
            }
            Ok(Build {
                target,
                arch,
                file,
                hip,
                modules,
            })
        })
        .collect()
}

fn parse_head_dims(k: &Value, at: &str) -> Result<Vec<(String, u64)>, String> {
    let obj = k
        .get("head_dims")
        .and_then(Value::as_object)
        .ok_or_else(|| format!("manifest {at}: `head_dims` is missing or not an object"))?;
    obj.iter()
        .map(|(n, v)| {
            v.as_u64()
                .filter(|&d| d >= 1 && d <= i32::MAX as u64)
                .map(|d| (n.clone(), d))
                .ok_or_else(|| {
                    format!("manifest {at}: head dim `{n}` is not a positive 32-bit integer")
                })
        })
        .collect()
}

/// Checks a plan refers only to its own sizes and buffers.
fn validate_plan(p: &EntryPlan, at: &str) -> Result<(), String> {
    let mut names = BTreeSet::new();
    for s in &p.sizes {
        if s.name == "kv_splits" || s.name == SMS {
            return Err(format!(
                "manifest {at}: a size may not be called `{}`",
                s.name
            ));
        }
        if !names.insert(s.name.as_str()) {
            return Err(format!(
                "manifest {at}: the size `{}` is listed twice",
                s.name
            ));
        }
        if s.fixed.is_some_and(|f| f < 1 || f > i32::MAX as u64) {
            return Err(format!(
                "manifest {at}: the size `{}` is fixed to {}, outside [1, 2^31 - 1]",
                s.name,
                s.fixed.unwrap_or(0)
            ));
        }
    }
    let known = |v: &str| names.contains(v) || v == "kv_splits";
    let check_expr_in = |e: &SizeExpr, what: &str, grid: bool| -> Result<(), String> {
        match e
            .vars()
            .into_iter()
            .find(|v| !(known(v) || grid && *v == SMS))
        {
            Some(v) => Err(format!(
                "manifest {at}: {what} uses `{v}`, which is not one of the plan's sizes"
            )),
            None => Ok(()),
        }
    };
    let check_expr = |e: &SizeExpr, what: &str| check_expr_in(e, what, false);
    for pair in p.multiple_of.iter().chain(&p.equal) {
        for n in pair {
            if !names.contains(n.as_str()) {
                return Err(format!(
                    "manifest {at}: a size rule names `{n}`, which is not one of the plan's sizes"
                ));
            }
        }
    }
    let mut bufs = BTreeSet::new();
    for b in &p.buffers {
        if !bufs.insert(b.name.as_str()) {
            return Err(format!(
                "manifest {at}: the buffer `{}` is listed twice",
                b.name
            ));
        }
        for e in &b.shape {
            check_expr(e, &format!("the shape of buffer `{}`", b.name))?;
        }
        if b.role != Role::Workspace && b.shape.iter().any(|e| e.vars().contains(&"kv_splits")) {
            return Err(format!(
                "manifest {at}: the caller's buffer `{}` has a shape depending on kv_splits, which only a workspace may",
                b.name
            ));
        }
    }
    if let Some(kv) = &p.kv_splits {
        for (e, what) in [
            (&kv.blocks, "kv_splits.blocks"),
            (&kv.key_blocks, "kv_splits.key_blocks"),
        ] {
            check_expr(e, what)?;
            if e.vars().contains(&"kv_splits") {
                return Err(format!("manifest {at}: {what} depends on kv_splits itself"));
            }
        }
    }
    if p.launches.is_empty() {
        return Err(format!("manifest {at}: the plan has no launches"));
    }
    for (i, l) in p.launches.iter().enumerate() {
        if l.entry.is_empty() {
            return Err(format!("manifest {at}: launch {i} has no entry name"));
        }
        if l.threads == 0 || l.threads > 1024 {
            return Err(format!(
                "manifest {at}: launch {i} ({}) has {} threads, outside [1, 1024]",
                l.entry, l.threads
            ));
        }
        for (d, e) in l.grid.iter().enumerate() {
            check_expr_in(e, &format!("launch {i} ({}) grid[{d}]", l.entry), true)?;
        }
        for (j, a) in l.args.iter().enumerate() {
            match a {
                ArgPlan::Ptr(n) if !bufs.contains(n.as_str()) => {
                    return Err(format!(
                        "manifest {at}: launch {i} ({}) argument {j} points to `{n}`, which is not one of the plan's buffers",
                        l.entry
                    ));
                }
                ArgPlan::I32(e) => {
                    check_expr(e, &format!("launch {i} ({}) argument {j}", l.entry))?
                }
                ArgPlan::Ptr(_) | ArgPlan::Null(_) => {}
                ArgPlan::TensorMap(m) => {
                    validate_tensor_map(
                        p,
                        m,
                        &format!("{at}: launch {i} ({}) argument {j}", l.entry),
                    )?;
                    for (d, e) in m.dims.iter().enumerate() {
                        check_expr(
                            e,
                            &format!(
                                "launch {i} ({}) argument {j} (the tensor map of `{}`) dims[{d}]",
                                l.entry, m.buffer
                            ),
                        )?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The largest box extent `cuTensorMapEncodeTiled` takes, and the width in
/// bytes of the 128-byte swizzle, which a box row may not exceed.
const MAX_TENSOR_MAP_BOX: u32 = 256;
const SWIZZLE_BYTES: u64 = 128;

/// Checks a tensor-map argument (`at` names it): the generated call
/// encodes it from the caller's pointer, so it must map a required 16-bit
/// input (what the sm_90a kernels load through TMA), with a box the
/// encoder and the 128-byte swizzle take.
fn validate_tensor_map(p: &EntryPlan, m: &TensorMapPlan, at: &str) -> Result<(), String> {
    let n = &m.buffer;
    let Some(b) = p.buffer(n) else {
        return Err(format!(
            "manifest {at} is a tensor map of `{n}`, which is not one of the plan's buffers"
        ));
    };
    let not_required = match (b.role, b.when) {
        (Role::Input, None) => None,
        (Role::Input, Some(Condition::SplitKv)) => Some("an input only used when kv_splits > 1"),
        (Role::OptionalInput, _) => Some("an optional input"),
        (Role::Output | Role::OptionalOutput, _) => Some("an output"),
        (Role::Workspace, _) => Some("a workspace"),
    };
    if let Some(what) = not_required {
        return Err(format!(
            "manifest {at} is a tensor map of `{n}`, which is {what}: tensor maps are encoded from required inputs only"
        ));
    }
    if b.dtype == Dtype::F32 {
        return Err(format!(
            "manifest {at} is a tensor map of `{n}`, an f32 buffer: the kernels' tensor maps read bf16 or f16 elements only"
        ));
    }
    if let Some(x) = m
        .box_dims
        .iter()
        .find(|&&x| x == 0 || x > MAX_TENSOR_MAP_BOX)
    {
        return Err(format!(
            "manifest {at} (the tensor map of `{n}`) has the box {:?}: {x} is outside [1, {MAX_TENSOR_MAP_BOX}]",
            m.box_dims
        ));
    }
    let row = u64::from(m.box_dims[0]) * b.dtype.bytes();
    if row > SWIZZLE_BYTES {
        return Err(format!(
            "manifest {at} (the tensor map of `{n}`) has box rows of {} {} elements, {row} bytes: wider than the {SWIZZLE_BYTES}-byte swizzle",
            m.box_dims[0],
            b.dtype.name()
        ));
    }
    Ok(())
}

/// The caller's buffers of a plan (everything but workspaces).
fn caller_buffers(p: &EntryPlan) -> impl Iterator<Item = &aec_compiler::launch_plan::BufferPlan> {
    p.buffers.iter().filter(|b| b.role != Role::Workspace)
}

fn parse_variant(v: &Value, i: usize) -> Result<VariantC, String> {
    let at = format!("variants[{i}]");
    let name = str_field(v, "name", &at)?.to_string();
    let at = format!("variants[{i}] (`{name}`)");
    let file = v
        .get("file")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let pattern = v
        .get("pattern")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let kernels = v
        .get("kernels")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("manifest {at}: `kernels` is missing or not an array"))?;
    let mut passes: Vec<Pass> = Vec::new();
    let mut skipped: Vec<(String, String)> = Vec::new();
    for (j, k) in kernels.iter().enumerate() {
        let kat = format!("{at}.kernels[{j}]");
        let pass = str_field(k, "pass", &kat)?.to_string();
        let Some(plan) = k.get("plan") else {
            if let Some(note) = k.get("skipped").and_then(Value::as_str) {
                let target = k.get("target").and_then(Value::as_str);
                skipped.push((
                    pass,
                    match target {
                        Some(t) => format!("{t}: {note}"),
                        None => note.to_string(),
                    },
                ));
                continue;
            }
            return Err(format!(
                "manifest {kat}: neither a `plan` nor a `skipped` note"
            ));
        };
        let plan: EntryPlan = serde_json::from_value(plan.clone())
            .map_err(|e| format!("manifest {kat}.plan: {e}"))?;
        if plan.pass != pass {
            return Err(format!(
                "manifest {kat}: the record's pass is `{pass}` but its plan's is `{}`",
                plan.pass
            ));
        }
        validate_plan(&plan, &format!("{kat}.plan"))?;
        let builds = parse_builds(k, &kat)?;
        for (i, l) in plan.launches.iter().enumerate() {
            let Some(key) = &l.module else { continue };
            // A build with a code object needs the module's too (one
            // without is never picked).
            for (b, build) in builds.iter().enumerate() {
                if build.file.is_none() {
                    continue;
                }
                let module = build.modules.iter().find(|(k, _)| k == key);
                if !matches!(module, Some((_, Some(_)))) {
                    return Err(format!(
                        "manifest {kat}.builds[{b}]: launch {i} ({}) is in the module `{key}`, for which the build has no cubin",
                        l.entry
                    ));
                }
            }
        }
        let tuned_for = match k.get("tuned_for") {
            None | Some(Value::Null) => Vec::new(),
            Some(t) => t
                .as_array()
                .ok_or_else(|| format!("manifest {kat}.tuned_for: not an array"))?
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    parse_tuned_bucket(item, &format!("{kat}.tuned_for[{i}]"))
                        .map_err(|e| format!("manifest {e}"))
                })
                .collect::<Result<_, _>>()?,
        };
        let record = Record {
            at: kat.clone(),
            head_dims: parse_head_dims(k, &kat)?,
            builds,
            plan,
            tuned_for,
        };
        match passes.iter_mut().find(|p| p.name == pass) {
            Some(p) => p.records.push(record),
            None => passes.push(Pass {
                name: pass,
                records: vec![record],
                skipped: vec![],
            }),
        }
    }
    let mut missing = Vec::new();
    for (pass, note) in skipped {
        match passes.iter_mut().find(|p| p.name == pass) {
            Some(p) => p.skipped.push(note),
            None => missing.push((pass, note)),
        }
    }
    if v.get("backward").is_some_and(Value::is_null) && !passes.iter().any(|p| p.name == "backward")
    {
        let note = v
            .get("backward_note")
            .and_then(Value::as_str)
            .unwrap_or("the manifest has no backward for it");
        missing.push(("backward".to_string(), note.to_string()));
    }
    // Every record of a variant binds the same sizes and head dims; every
    // record of a pass takes the same caller buffers and rules.
    let mut sizes: Vec<SizeField> = Vec::new();
    if let Some(first) = passes.first().and_then(|p| p.records.first()) {
        for s in &first.plan.sizes {
            sizes.push(SizeField {
                name: s.name.clone(),
                field: c_identifier(&s.name),
                fixed: s.fixed,
                head_dim: false,
            });
        }
        for (n, _) in &first.head_dims {
            if sizes.iter().any(|s| &s.name == n) {
                return Err(format!(
                    "manifest {}: the head dim `{n}` is also one of the plan's sizes",
                    first.at
                ));
            }
            sizes.push(SizeField {
                name: n.clone(),
                field: c_identifier(n),
                fixed: None,
                head_dim: true,
            });
        }
        let dims_of = |r: &Record| {
            r.head_dims
                .iter()
                .map(|(n, _)| n.clone())
                .collect::<Vec<_>>()
        };
        for p in &passes {
            let r0 = &p.records[0];
            for r in &p.records {
                if r.plan.sizes != first.plan.sizes || dims_of(r) != dims_of(first) {
                    return Err(format!(
                        "manifest {}: its sizes or head dims differ from those of {}; one C sizes struct cannot serve both",
                        r.at, first.at
                    ));
                }
                if r.plan.multiple_of != r0.plan.multiple_of || r.plan.equal != r0.plan.equal {
                    return Err(format!(
                        "manifest {}: its size rules differ from those of {} (same variant and pass)",
                        r.at, r0.at
                    ));
                }
                let sig = |r: &Record| {
                    caller_buffers(&r.plan)
                        .map(|b| (b.name.clone(), b.role, b.dtype, b.zeroed, b.when))
                        .collect::<Vec<_>>()
                };
                if sig(r) != sig(r0) {
                    return Err(format!(
                        "manifest {}: its caller buffers (names, roles, dtypes) differ from those of {} (same variant and pass); one C buffers struct cannot serve both",
                        r.at, r0.at
                    ));
                }
                if r.head_dims == r0.head_dims {
                    let shapes = |r: &Record| {
                        caller_buffers(&r.plan)
                            .map(|b| b.shape.clone())
                            .collect::<Vec<_>>()
                    };
                    if shapes(r) != shapes(r0) {
                        return Err(format!(
                            "manifest {}: its buffer shapes differ from those of {} for the same head dims",
                            r.at, r0.at
                        ));
                    }
                }
            }
        }
    }
    let mut fields = BTreeMap::new();
    for s in &sizes {
        if let Some(other) = fields.insert(s.field.clone(), s.name.clone()) {
            return Err(format!(
                "variant `{name}`: the sizes `{other}` and `{}` both become the C field `{}`",
                s.name, s.field
            ));
        }
    }
    for p in &passes {
        for r in &p.records {
            for t in &r.tuned_for {
                if let Some((n, _)) = t
                    .sizes
                    .iter()
                    .find(|(n, _)| !sizes.iter().any(|s| &s.name == n))
                {
                    return Err(format!(
                        "manifest {}.tuned_for: the bucket size `{n}` is not one of the variant's sizes",
                        r.at
                    ));
                }
            }
        }
        // Caller buffers and workspaces both become C names (fields, locals).
        for r in &p.records {
            let mut fields = BTreeMap::new();
            for b in &r.plan.buffers {
                let f = c_identifier(&b.name);
                if let Some(other) = fields.insert(f.clone(), b.name.clone()) {
                    return Err(format!(
                        "variant `{name}`, {} pass: the buffers `{other}` and `{}` both become the C name `{f}`; rename one",
                        p.name, b.name
                    ));
                }
            }
        }
        let ok = !p.name.is_empty()
            && p.name.starts_with(|c: char| c.is_ascii_lowercase())
            && p.name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ok {
            return Err(format!(
                "manifest {at}: the pass name `{}` is not a lowercase identifier",
                p.name
            ));
        }
    }
    let ident = snake_name(&name);
    if ident.is_empty() {
        return Err(format!(
            "manifest {at}: the variant name `{name}` has no letters or digits for a C name"
        ));
    }
    Ok(VariantC {
        name,
        file,
        pattern,
        ident,
        sizes,
        passes,
        missing,
    })
}

/// The C header `aec_library.h` of the library whose `manifest.json` is
/// `manifest`: one typed entry point per variant and pass with a launch
/// plan, over `aec_loader.h`. Errors name what is malformed in the manifest
/// or which names collide in C.
pub fn generate(manifest: &Value) -> Result<String, String> {
    let variants = manifest
        .get("variants")
        .and_then(Value::as_array)
        .ok_or("manifest: `variants` is missing or not an array")?;
    let parsed = variants
        .iter()
        .enumerate()
        .map(|(i, v)| parse_variant(v, i))
        .collect::<Result<Vec<_>, _>>()?;
    // Every global identifier once.
    let mut globals: BTreeMap<String, String> = LOADER_NAMES
        .iter()
        .map(|n| (n.to_string(), "the loader (aec_loader.h)".to_string()))
        .collect();
    for v in &parsed {
        let mut mine = vec![format!("aec_{}_sizes", v.ident)];
        for (dim, _) in single_head_dims(v) {
            mine.push(format!("AEC_{}_{}", v.ident, dim).to_ascii_uppercase());
        }
        for p in &v.passes {
            let base = format!("{}_{}", v.ident, p.name);
            mine.extend([
                format!("AEC_HAVE_{base}").to_ascii_uppercase(),
                format!("aec_{base}"),
                format!("aec_{base}_buffers"),
                format!("aec_{base}_workspace_bytes"),
                format!("aec_{base}_kernel"),
                format!("aecg_{base}_check"),
                format!("aecg_{base}_pick"),
            ]);
            for r in 0..p.records.len() {
                mine.push(format!("aecg_{base}_r{r}_layout"));
                mine.push(format!("aecg_{base}_r{r}_plan"));
                mine.push(format!("aecg_{base}_r{r}_run"));
            }
        }
        for g in mine {
            if let Some(other) = globals.insert(g.clone(), format!("variant `{}`", v.name)) {
                return Err(format!(
                    "variant `{}` needs the C name `{g}`, which {other} already uses; rename the variant",
                    v.name
                ));
            }
        }
    }
    let mut out = String::new();
    header_preamble(&mut out, manifest, &parsed);
    for v in &parsed {
        emit_variant(&mut out, v);
    }
    out.push_str("#ifdef __cplusplus\n}\n#endif\n\n#endif /* AEC_LIBRARY_H */\n");
    Ok(out)
}

fn header_preamble(out: &mut String, manifest: &Value, vs: &[VariantC]) {
    let version = manifest
        .get("aec_version")
        .and_then(Value::as_str)
        .unwrap_or("?");
    let _ = writeln!(
        out,
        "/*\n * aec_library.h: the C interface of this aec kernel library, generated by aec {} from\n * manifest.json (do not edit; `aec compile` writes it again).\n *",
        comment(version)
    );
    out.push_str(" * Variants and entry points:\n");
    for v in vs {
        let passes: Vec<String> = v
            .passes
            .iter()
            .map(|p| format!("aec_{}_{}", v.ident, p.name))
            .collect();
        let _ = writeln!(
            out,
            " *   {} ({}, {}): {}",
            comment(&v.name),
            comment(&v.file),
            comment(&v.pattern),
            if passes.is_empty() {
                "no entry points".to_string()
            } else {
                passes.join(", ")
            }
        );
    }
    out.push_str(
        r#" *
 * Usage (link with -ldl; the driver, libcuda.so.1 or libamdhip64.so, is
 * loaded at run time):
 *
 *     aec_library lib;
 *     if (aec_library_open(&lib, "DIR") != AEC_OK) { puts(aec_last_error(&lib)); return 1; }
 *     aec_<variant>_sizes sizes;          (set every field, head dims included)
 *     aec_<variant>_forward_buffers bufs; (device pointers, contiguous row-major)
 *     int status = aec_<variant>_forward(&lib, &sizes, &bufs, NULL, stream);
 *     if (status != AEC_OK) puts(aec_last_error(&lib));
 *
 * A call checks everything it can before launching anything (sizes, rules,
 * head dims, required pointers, launch limits) and returns a status with a
 * message naming the size or buffer; it picks the build for the GPU's
 * architecture (AEC_ERROR_NO_KERNEL lists the ones the library has). Calls
 * are asynchronous on `stream` (a CUstream or hipStream_t; NULL: the
 * default stream).
 *
 * Workspace: aec_<variant>_<pass>_workspace_bytes says how many bytes a
 * call needs (0: none). Pass that much device memory, 256-byte aligned, as
 * `workspace`; with NULL the call allocates it (cuMemAlloc, hipMalloc) and frees it
 * after synchronizing `stream`, which is slow: give a workspace where calls
 * repeat.
 */
#ifndef AEC_LIBRARY_H
#define AEC_LIBRARY_H

"#,
    );
    // aec_library_open tries the backends the library has builds for.
    let mut cuda = false;
    let mut hip = false;
    for b in vs
        .iter()
        .flat_map(|v| &v.passes)
        .flat_map(|p| &p.records)
        .flat_map(|r| &r.builds)
    {
        if b.hip {
            hip = true;
        } else {
            cuda = true;
        }
    }
    let backends = match (cuda, hip) {
        (true, false) => "AEC_BACKEND_CUDA",
        (false, true) => "AEC_BACKEND_HIP",
        _ => "AEC_BACKEND_CUDA | AEC_BACKEND_HIP",
    };
    let _ = writeln!(
        out,
        "/* The backends aec_library_open tries: those this library has builds for. */\n#define AEC_LIBRARY_BACKENDS ({backends})\n"
    );
    out.push_str(
        r#"#include "aec_loader.h"

#if !defined(AEC_LOADER_VERSION) || AEC_LOADER_VERSION != 3
#error "aec_library.h needs the aec_loader.h written with it (AEC_LOADER_VERSION 3)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

"#,
    );
}

fn dtype_c(d: Dtype, input: bool) -> &'static str {
    match (d, input) {
        (Dtype::F32, true) => "const float *",
        (Dtype::F32, false) => "float *",
        (_, true) => "const void *",
        (_, false) => "void *",
    }
}

/// The list of builds for messages: `sm_80 (a100), sm_90a (h100)`.
fn builds_text(p: &Pass, with_dims: bool) -> String {
    let mut parts = Vec::new();
    for r in &p.records {
        let dims = if with_dims {
            let d: Vec<String> = r
                .head_dims
                .iter()
                .map(|(n, v)| format!("{n} = {v}"))
                .collect();
            format!(" for {}", d.join(", "))
        } else {
            String::new()
        };
        for b in &r.builds {
            let what = match (&b.file, b.hip) {
                (Some(_), false) => String::new(),
                (None, false) => {
                    "; no cubin: NVRTC was absent when the library was built".to_string()
                }
                (Some(_), true) => String::new(),
                (None, true) => {
                    "; no code object: the HIP compiler was absent when the library was built"
                        .to_string()
                }
            };
            parts.push(format!("{} ({}{what}){dims}", b.arch, b.target));
        }
    }
    for s in &p.skipped {
        parts.push(format!("skipped: {s}"));
    }
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(", ")
    }
}

fn emit_variant(out: &mut String, v: &VariantC) {
    let _ = writeln!(
        out,
        "/* ==== {} ({}, {}) ==== */\n",
        comment(&v.name),
        comment(&v.file),
        comment(&v.pattern)
    );
    for (pass, note) in &v.missing {
        let _ = writeln!(out, "/* No aec_{}_{pass}: {} */\n", v.ident, comment(note));
    }
    if v.passes.is_empty() {
        return;
    }
    // The sizes struct: the plan's sizes, then the head dims.
    let first = &v.passes[0].records[0];
    let mut rules: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for [a, b] in &first.plan.multiple_of {
        rules
            .entry(a.as_str())
            .or_default()
            .push(format!("a multiple of {b}"));
    }
    for [a, b] in &first.plan.equal {
        rules
            .entry(a.as_str())
            .or_default()
            .push(format!("must equal {b}"));
    }
    let _ = writeln!(
        out,
        "/* The sizes of a {} call: set every field (each at least 1). */\ntypedef struct aec_{}_sizes {{",
        comment(&v.name),
        v.ident
    );
    for s in &v.sizes {
        let mut doc = size_doc(&s.name).to_string();
        if let Some(f) = s.fixed {
            let _ = write!(doc, "; fixed by the variant: must be {f}");
        }
        if let Some(r) = rules.get(s.name.as_str()) {
            let _ = write!(doc, "; {}", r.join(", "));
        }
        if s.head_dim {
            let mut vals: Vec<u64> = v
                .passes
                .iter()
                .flat_map(|p| &p.records)
                .filter_map(|r| r.head_dims.iter().find(|(n, _)| *n == s.name).map(|x| x.1))
                .collect();
            vals.sort();
            vals.dedup();
            let vals: Vec<String> = vals.iter().map(u64::to_string).collect();
            let _ = write!(doc, "; this library has {}", vals.join(" or "));
        }
        let _ = writeln!(
            out,
            "    int {}; /* {}: {} */",
            s.field,
            comment(&s.name),
            comment(&doc)
        );
    }
    let _ = writeln!(out, "}} aec_{}_sizes;\n", v.ident);
    for (dim, value) in single_head_dims(v) {
        let _ = writeln!(
            out,
            "/* The head dim {dim} of every {} kernel in this library. */\n#define {} {value}\n",
            comment(&v.name),
            format!("AEC_{}_{}", v.ident, dim).to_ascii_uppercase()
        );
    }
    for p in &v.passes {
        let _ = writeln!(
            out,
            "#define {} 1 /* aec_{}_{} exists */",
            format!("AEC_HAVE_{}_{}", v.ident, p.name).to_ascii_uppercase(),
            v.ident,
            p.name
        );
    }
    out.push('\n');
    for p in &v.passes {
        emit_pass(out, v, p);
    }
}

/// The head dims with one value in all of a variant's records (field name,
/// value): `AEC_<VARIANT>_<DIM>` macros.
fn single_head_dims(v: &VariantC) -> Vec<(String, u64)> {
    v.sizes
        .iter()
        .filter(|s| s.head_dim)
        .filter_map(|s| {
            let mut vals = v
                .passes
                .iter()
                .flat_map(|p| &p.records)
                .filter_map(|r| r.head_dims.iter().find(|(n, _)| *n == s.name).map(|x| x.1));
            let first = vals.next()?;
            vals.all(|x| x == first).then(|| (s.field.clone(), first))
        })
        .collect()
}

/// The C local holding a size (`n_<field>`) or `kv_splits`, or the
/// library's multiprocessor count.
fn local_of<'a>(v: &'a VariantC) -> impl Fn(&str) -> String + 'a {
    move |name: &str| {
        if name == "kv_splits" {
            return "n_kv_splits".to_string();
        }
        if name == SMS {
            return "n_sms".to_string();
        }
        match v.sizes.iter().find(|s| s.name == name) {
            Some(s) => format!("n_{}", s.field),
            None => format!("n_{}", c_identifier(name)),
        }
    }
}

/// A shape for messages with the values of the sizes: the format text
/// (`B=%d, H=%d, 128`) and the arguments (`s->B, s->H`).
fn shape_format(v: &VariantC, shape: &[SizeExpr], sizes: &str) -> (String, Vec<String>) {
    let mut parts = Vec::new();
    let mut args = Vec::new();
    for e in shape {
        match e {
            SizeExpr::Var(n) => match v.sizes.iter().find(|s| &s.name == n) {
                Some(s) => {
                    parts.push(format!("{}=%d", c_str(n, true)));
                    args.push(format!("{sizes}->{}", s.field));
                }
                None => parts.push(c_str(n, true)),
            },
            other => parts.push(c_str(&other.to_string(), true)),
        }
    }
    (format!("[{}]", parts.join(", ")), args)
}

fn emit_pass(out: &mut String, v: &VariantC, p: &Pass) {
    let base = format!("{}_{}", v.ident, p.name);
    let fname = format!("aec_{base}");
    let r0 = &p.records[0];
    let bufs: Vec<_> = caller_buffers(&r0.plan).collect();
    let dims_note = |r: &Record| -> String {
        let d: Vec<String> = r
            .head_dims
            .iter()
            .map(|(n, v)| format!("{n} = {v}"))
            .collect();
        d.join(", ")
    };
    // The buffers struct.
    let _ = writeln!(
        out,
        "/* The device buffers of {fname}: contiguous, row-major, shapes in the\n   sizes' names (for {}). */\ntypedef struct {fname}_buffers {{",
        dims_note(r0)
    );
    for b in &bufs {
        let input = matches!(b.role, Role::Input | Role::OptionalInput);
        let mut doc = format!(
            "{}, {} {}: {}",
            role_text(b.role),
            b.dtype.name(),
            shape_text(&b.shape),
            b.doc
        );
        if b.zeroed {
            doc.push_str(" (zero-filled by the call: the kernels add into it)");
        }
        if b.when == Some(Condition::SplitKv) {
            doc.push_str(" (only used, and required, when kv_splits > 1)");
        }
        let _ = writeln!(
            out,
            "    {}{}; /* {} */",
            dtype_c(b.dtype, input),
            c_identifier(&b.name),
            comment(&doc)
        );
    }
    let _ = writeln!(out, "}} {fname}_buffers;\n");
    let has_ws = p
        .records
        .iter()
        .any(|r| r.plan.buffers.iter().any(|b| b.role == Role::Workspace));
    let _ = writeln!(
        out,
        "/* The workspace bytes {fname} needs for `sizes` on the library's GPU\n   ({}): enough for the call, whose KV splits are at most the ones assumed\n   here (it also counts the kernel's registers); AEC_WORKSPACE_INVALID when\n   it cannot run them (the call says why). */\nstatic inline size_t {fname}_workspace_bytes(const aec_library *lib, const aec_{}_sizes *sizes);\n",
        if has_ws {
            "0 when none"
        } else {
            "0 for every build in this library"
        },
        v.ident
    );
    let _ = writeln!(
        out,
        "/* The kernel {fname} launches first for `sizes` on the library's GPU: its\n   name spells the tile configuration (a tuning-table kernel where the\n   library's tuning table has one for this GPU and the sizes' bucket).\n   NULL when it cannot run them (the call says why). */\nstatic inline const char *{fname}_kernel(const aec_library *lib, const aec_{}_sizes *sizes);\n",
        v.ident
    );
    let _ = writeln!(
        out,
        "/* Runs the {} {} on `stream` (a CUstream or hipStream_t; NULL: the default stream).\n   `workspace`: device memory of {fname}_workspace_bytes bytes, 256-byte\n   aligned, or NULL (allocated and freed by the call, after synchronizing\n   `stream`: slow). Returns AEC_OK or a status; aec_last_error(lib) says\n   what is wrong. Nothing is launched when a check fails. */\nstatic inline int {fname}(aec_library *lib, const aec_{}_sizes *sizes,\n    const {fname}_buffers *buffers, void *workspace, void *stream);\n",
        comment(&v.name),
        p.name,
        v.ident
    );
    emit_check(out, v, p, &base);
    emit_pick(out, v, p, &base);
    for (i, r) in p.records.iter().enumerate() {
        emit_record(out, v, &base, i, r);
    }
    // workspace_bytes
    let _ = writeln!(
        out,
        "static inline size_t {fname}_workspace_bytes(const aec_library *lib, const aec_{}_sizes *sizes)\n{{\n    char err[AEC_ERROR_CAPACITY];\n    int record = -1;\n    const char *cubin = NULL;\n    if (lib == NULL || sizes == NULL || !lib->is_open)\n        return AEC_WORKSPACE_INVALID;\n    if (aecg_{base}_check(sizes, NULL, err, sizeof err) != AEC_OK || aecg_{base}_pick(lib, sizes, &record, &cubin, err, sizeof err) != AEC_OK)\n        return AEC_WORKSPACE_INVALID;\n    switch (record) {{",
        v.ident
    );
    for i in 0..p.records.len() {
        let _ = writeln!(
            out,
            "    case {i}: {{\n        aecg_{base}_r{i}_layout layout;\n        if (aecg_{base}_r{i}_plan(lib, sizes, 0, &layout, err, sizeof err) != AEC_OK || (uint64_t)(size_t)layout.workspace_bytes != layout.workspace_bytes)\n            return AEC_WORKSPACE_INVALID;\n        return (size_t)layout.workspace_bytes;\n    }}"
        );
    }
    out.push_str("    default:\n        return AEC_WORKSPACE_INVALID;\n    }\n}\n\n");
    // kernel
    let _ = writeln!(
        out,
        "static inline const char *{fname}_kernel(const aec_library *lib, const aec_{}_sizes *sizes)\n{{\n    char err[AEC_ERROR_CAPACITY];\n    int record = -1;\n    const char *cubin = NULL;\n    if (lib == NULL || sizes == NULL || !lib->is_open)\n        return NULL;\n    if (aecg_{base}_check(sizes, NULL, err, sizeof err) != AEC_OK || aecg_{base}_pick(lib, sizes, &record, &cubin, err, sizeof err) != AEC_OK)\n        return NULL;\n    switch (record) {{",
        v.ident
    );
    for (i, r) in p.records.iter().enumerate() {
        let entry = r.plan.launches.first().map_or("", |l| l.entry.as_str());
        let _ = writeln!(
            out,
            "    case {i}:\n        return \"{}\";",
            c_str(entry, false)
        );
    }
    out.push_str("    default:\n        return NULL;\n    }\n}\n\n");
    // the call
    let _ = writeln!(
        out,
        "static inline int {fname}(aec_library *lib, const aec_{}_sizes *sizes,\n    const {fname}_buffers *buffers, void *workspace, void *stream)\n{{\n    int status, record = -1;\n    const char *cubin = NULL;\n    if (lib == NULL)\n        return AEC_ERROR_ARGUMENT;\n    if (sizes == NULL || buffers == NULL)\n        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT, \"{fname}: %s is NULL\", sizes == NULL ? \"sizes\" : \"buffers\");\n    if ((status = aecg_{base}_check(sizes, buffers, lib->error, sizeof lib->error)) != AEC_OK)\n        return status;\n    if ((status = aecl_enter(lib, \"{fname}\")) != AEC_OK)\n        return status;\n    if ((status = aecg_{base}_pick(lib, sizes, &record, &cubin, lib->error, sizeof lib->error)) != AEC_OK)\n        return status;\n    switch (record) {{",
        v.ident
    );
    for i in 0..p.records.len() {
        let _ = writeln!(
            out,
            "    case {i}:\n        return aecg_{base}_r{i}_run(lib, sizes, buffers, workspace, stream, cubin);"
        );
    }
    let _ = writeln!(
        out,
        "    default:\n        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_NO_KERNEL, \"{fname}: no record picked\");\n    }}\n}}\n"
    );
}

/// `aecg_<base>_check`: the sizes, the head dims and the required pointers
/// (`b` may be NULL: sizes only).
fn emit_check(out: &mut String, v: &VariantC, p: &Pass, base: &str) {
    let fname = format!("aec_{base}");
    let r0 = &p.records[0];
    let _ = writeln!(
        out,
        "static inline int aecg_{base}_check(const aec_{}_sizes *s, const aec_{base}_buffers *b, char *err, size_t errn)\n{{",
        v.ident
    );
    for s in &v.sizes {
        let _ = writeln!(
            out,
            "    if (s->{f} < 1)\n        return aecl_fail(err, errn, AEC_ERROR_SHAPE, \"{fname}: sizes->{f} = %d: every size must be at least 1\", s->{f});",
            f = s.field
        );
    }
    for s in &v.sizes {
        if let Some(fixed) = s.fixed {
            let _ = writeln!(
                out,
                "    if (s->{f} != {fixed})\n        return aecl_fail(err, errn, AEC_ERROR_SHAPE, \"{fname}: sizes->{f} = %d, but {} fixes {} = {fixed}\", s->{f});",
                c_str(&v.name, true),
                c_str(&s.name, true),
                f = s.field
            );
        }
    }
    let field = |n: &str| {
        v.sizes
            .iter()
            .find(|s| s.name == n)
            .map(|s| s.field.clone())
            .unwrap_or_else(|| c_identifier(n))
    };
    for [a, b] in &r0.plan.multiple_of {
        let (fa, fb) = (field(a), field(b));
        let _ = writeln!(
            out,
            "    if (s->{fa} % s->{fb} != 0)\n        return aecl_fail(err, errn, AEC_ERROR_SHAPE, \"{fname}: sizes->{fa} = %d must be a multiple of sizes->{fb} = %d\", s->{fa}, s->{fb});"
        );
    }
    for [a, b] in &r0.plan.equal {
        let (fa, fb) = (field(a), field(b));
        let _ = writeln!(
            out,
            "    if (s->{fa} != s->{fb})\n        return aecl_fail(err, errn, AEC_ERROR_SHAPE, \"{fname}: sizes->{fa} = %d must equal sizes->{fb} = %d in {}\", s->{fa}, s->{fb});",
            c_str(&v.name, true)
        );
    }
    // Head dims: some record must take them.
    let dim_fields: Vec<&SizeField> = v.sizes.iter().filter(|s| s.head_dim).collect();
    if !dim_fields.is_empty() {
        let mut combos: Vec<Vec<(String, u64)>> =
            p.records.iter().map(|r| r.head_dims.clone()).collect();
        combos.sort();
        combos.dedup();
        let conds: Vec<String> = combos
            .iter()
            .map(|c| {
                let parts: Vec<String> = c
                    .iter()
                    .map(|(n, d)| format!("s->{} == {d}", field(n)))
                    .collect();
                format!("({})", parts.join(" && "))
            })
            .collect();
        let given: Vec<String> = dim_fields
            .iter()
            .map(|s| format!("sizes->{} = %d", s.field))
            .collect();
        let have: Vec<String> = combos
            .iter()
            .map(|c| {
                c.iter()
                    .map(|(n, d)| format!("{n} = {d}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .collect();
        let args: Vec<String> = dim_fields
            .iter()
            .map(|s| format!("s->{}", s.field))
            .collect();
        let _ = writeln!(
            out,
            "    if (!({}))\n        return aecl_fail(err, errn, AEC_ERROR_SHAPE, \"{fname}: {}: this library has {} {} kernels for {} only (aec compile --head-dims)\", {});",
            conds.join(" || "),
            given.join(", "),
            c_str(&v.name, true),
            p.name,
            c_str(&have.join("; "), true),
            args.join(", ")
        );
    }
    let required: Vec<_> = caller_buffers(&r0.plan)
        .filter(|b| matches!(b.role, Role::Input | Role::Output) && b.when.is_none())
        .collect();
    let all_buffers: Vec<_> = caller_buffers(&r0.plan).collect();
    if !all_buffers.is_empty() {
        out.push_str("    if (b == NULL)\n        return AEC_OK;\n");
    }
    for b in required {
        let f = c_identifier(&b.name);
        let (shape, args) = shape_format(v, &b.shape, "s");
        let mut all = vec![];
        all.extend(args);
        let _ = writeln!(
            out,
            "    if (b->{f} == NULL)\n        return aecl_fail(err, errn, AEC_ERROR_ARGUMENT, \"{fname}: buffers->{f} is NULL: the {} {} ({} {shape}) is required\"{});",
            role_text(b.role),
            c_str(&b.name, true),
            b.dtype.name(),
            all.iter().map(|a| format!(", {a}")).collect::<String>()
        );
    }
    // Inputs that must be one tensor (V read from K's rows: the cache as both).
    for [one, other] in &r0.plan.same_tensor {
        let (f, g) = (c_identifier(one), c_identifier(other));
        let doc = r0.plan.buffer(one).map_or("", |b| b.doc.as_str());
        let _ = writeln!(
            out,
            "    if (b->{f} != b->{g})\n        return aecl_fail(err, errn, AEC_ERROR_ARGUMENT, \"{fname}: buffers->{f} must be buffers->{g}: {}\");",
            c_str(doc, true)
        );
    }
    // Optional buffers too, when given: a misaligned pointer would fault in
    // a 16-byte load or store, or read the wrong bytes.
    for b in all_buffers {
        let f = c_identifier(&b.name);
        let _ = writeln!(
            out,
            "    if (b->{f} != NULL && (uintptr_t)b->{f} % AEC_TENSOR_ALIGN != 0)\n        return aecl_fail(err, errn, AEC_ERROR_ARGUMENT, \"{fname}: buffers->{f} = %p is not 16-byte aligned: the kernels access the {} {} 16 bytes at a time (a pointer into the middle of an allocation?)\", (const void *)b->{f});",
            role_text(b.role),
            c_str(&b.name, true),
        );
    }
    out.push_str("    return AEC_OK;\n}\n\n");
}

/// `aecg_<base>_pick`: the record and cubin for the GPU's arch and the
/// sizes' head dims.
fn emit_pick(out: &mut String, v: &VariantC, p: &Pass, base: &str) {
    let fname = format!("aec_{base}");
    let _ = writeln!(
        out,
        "static inline int aecg_{base}_pick(const aec_library *lib, const aec_{}_sizes *s, int *record, const char **cubin, char *err, size_t errn)\n{{",
        v.ident
    );
    let mut any = false;
    // The tuning table's records first: each for its GPU and buckets.
    let order = p
        .records
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.tuned_for.is_empty())
        .chain(
            p.records
                .iter()
                .enumerate()
                .filter(|(_, r)| r.tuned_for.is_empty()),
        );
    for (i, r) in order {
        let buckets: Vec<String> = r
            .tuned_for
            .iter()
            .map(|t| {
                let sizes: Vec<String> = t
                    .sizes
                    .iter()
                    .map(|(n, want)| {
                        let f = &v
                            .sizes
                            .iter()
                            .find(|s| &s.name == n)
                            .expect("checked")
                            .field;
                        if t.bucketed.contains(n) {
                            format!(" && aecl_bucket(s->{f}) == {want}u")
                        } else {
                            format!(" && (uint64_t)s->{f} == {want}u")
                        }
                    })
                    .collect();
                let gpu = match &t.gpu {
                    TunedGpu::Named(name) => {
                        format!("strcmp(lib->device_name, \"{}\") == 0", c_str(name, false))
                    }
                    TunedGpu::Product { device, sms } => {
                        format!("aecl_is_product(lib, \"{}\", {sms})", c_str(device, false))
                    }
                };
                format!("({gpu}{})", sizes.concat())
            })
            .collect();
        let tuned = if buckets.is_empty() {
            String::new()
        } else {
            format!(" && ({})", buckets.join(" || "))
        };
        let dims: Vec<String> = r
            .head_dims
            .iter()
            .filter_map(|(n, d)| {
                v.sizes
                    .iter()
                    .find(|s| &s.name == n)
                    .map(|s| format!(" && s->{} == {d}", s.field))
            })
            .collect();
        for b in &r.builds {
            if let Some(file) = &b.file {
                any = true;
                let _ = writeln!(
                    out,
                    "    if (strcmp(lib->arch, \"{}\") == 0{}{tuned}) {{\n        *record = {i};\n        *cubin = \"{}\";\n        return AEC_OK;\n    }}",
                    c_str(&b.arch, false),
                    dims.concat(),
                    c_str(file, false)
                );
            }
        }
    }
    if !any {
        out.push_str("    (void)record;\n    (void)cubin;\n");
    }
    let distinct_dims = p
        .records
        .iter()
        .any(|r| r.head_dims != p.records[0].head_dims);
    if !distinct_dims {
        out.push_str("    (void)s;\n");
    }
    let _ = writeln!(
        out,
        "    return aecl_fail(err, errn, AEC_ERROR_NO_KERNEL, \"{fname}: no kernel for this GPU (%s, compute capability %d.%d, builds %s){}: the library has {} {} kernels for {}\", lib->device_name, lib->cc_major, lib->cc_minor, lib->arch);\n}}\n",
        if distinct_dims {
            " and these head dims"
        } else {
            ""
        },
        c_str(&v.name, true),
        p.name,
        c_str(&builds_text(p, distinct_dims), true)
    );
}

/// The layout struct, `_plan` (sizes → kv_splits, workspace layout, grids,
/// 32-bit arguments, all checked) and `_run` (the launches) of one record.
fn emit_record(out: &mut String, v: &VariantC, base: &str, i: usize, r: &Record) {
    let fname = format!("aec_{base}");
    let plan = &r.plan;
    let local = local_of(v);
    let buf_field = |n: &str| c_identifier(n);
    let workspaces: Vec<_> = plan
        .buffers
        .iter()
        .filter(|b| b.role == Role::Workspace)
        .collect();
    let zeroed_caller: Vec<_> = caller_buffers(plan).filter(|b| b.zeroed).collect();
    let uses_split = plan.kv_splits.is_some();
    // The layout struct.
    let _ = writeln!(
        out,
        "/* {}: builds {} */\ntypedef struct aecg_{base}_r{i}_layout {{\n    uint64_t kv_splits;\n    uint64_t workspace_bytes;",
        comment(&r.at),
        comment(
            &r.builds
                .iter()
                .map(|b| format!("{} ({})", b.arch, b.target))
                .collect::<Vec<_>>()
                .join(", ")
        )
    );
    for b in &workspaces {
        let f = buf_field(&b.name);
        let _ = writeln!(out, "    uint64_t off_{f}, bytes_{f};");
    }
    for b in &zeroed_caller {
        let _ = writeln!(out, "    uint64_t bytes_{};", buf_field(&b.name));
    }
    let _ = writeln!(out, "    uint64_t grid[{}][3];", plan.launches.len());
    // The distinct 32-bit argument values, in order of first use, with the
    // first launch that takes each (for messages).
    let i32_args = distinct_args(plan, |a| match a {
        ArgPlan::I32(e) => Some(e),
        _ => None,
    });
    for (a, (e, _)) in i32_args.iter().enumerate() {
        let _ = writeln!(
            out,
            "    uint64_t arg{a}; /* {} */",
            comment(&e.to_string())
        );
    }
    let arg_index = |e: &SizeExpr| {
        i32_args
            .iter()
            .position(|(x, _)| *x == e)
            .expect("collected above")
    };
    // The distinct tensor maps, likewise: their extents and the element
    // count of the buffer each maps (which the extents must not exceed).
    let maps = distinct_args(plan, |a| match a {
        ArgPlan::TensorMap(m) => Some(m),
        _ => None,
    });
    for (k, (m, _)) in maps.iter().enumerate() {
        let _ = writeln!(
            out,
            "    uint64_t map{k}[3], map{k}_elements; /* the tensor map of {}: {} innermost first */",
            comment(&m.buffer),
            comment(&shape_text(&m.dims)),
        );
    }
    let map_index = |m: &TensorMapPlan| {
        maps.iter()
            .position(|(x, _)| *x == m)
            .expect("collected above")
    };
    let mapped = |m: &TensorMapPlan| plan.buffer(&m.buffer).expect("validate_plan checked it");
    let _ = writeln!(out, "}} aecg_{base}_r{i}_layout;\n");

    // _plan
    let _ = writeln!(
        out,
        "static inline int aecg_{base}_r{i}_plan(const aec_library *lib, const aec_{}_sizes *s, int resident, aecg_{base}_r{i}_layout *L, char *err, size_t errn)\n{{\n    int ovf = 0, status;",
        v.ident
    );
    // Which size locals are read.
    let mut exprs: Vec<&SizeExpr> = Vec::new();
    if let Some(kv) = &plan.kv_splits {
        exprs.push(&kv.blocks);
        exprs.push(&kv.key_blocks);
    }
    for b in workspaces.iter().chain(zeroed_caller.iter()) {
        exprs.extend(&b.shape);
    }
    for l in &plan.launches {
        exprs.extend(&l.grid);
    }
    exprs.extend(i32_args.iter().map(|x| x.0));
    for (m, _) in &maps {
        exprs.extend(&m.dims);
        exprs.extend(&mapped(m).shape);
    }
    let used: BTreeSet<&str> = exprs.iter().flat_map(|e| e.vars()).collect();
    for s in &v.sizes {
        if used.contains(s.name.as_str()) {
            let _ = writeln!(out, "    uint64_t n_{f} = (uint64_t)s->{f};", f = s.field);
        }
    }
    if used.contains(SMS) {
        out.push_str("    uint64_t n_sms = lib->sm_count < 1 ? 1u : (uint64_t)lib->sm_count;\n");
    }
    let uses_kv_var = used.contains("kv_splits");
    if uses_kv_var || uses_split {
        out.push_str("    uint64_t n_kv_splits = 1;\n");
    }
    out.push_str("    memset(L, 0, sizeof *L);\n");
    if !uses_split && !uses_kv_var {
        out.push_str("    (void)lib;\n");
    }
    if plan.kv_splits.is_none() {
        out.push_str("    (void)resident;\n");
    }
    if let Some(kv) = &plan.kv_splits {
        let _ = writeln!(
            out,
            "    /* kv_splits: {} */\n    n_kv_splits = aecl_kv_splits({}, {}, {}u, {}u, {}u, {}u, lib->sm_count, lib->smem_per_sm, resident);",
            comment(&kv.rule),
            c_expr(&kv.blocks, &local),
            c_expr(&kv.key_blocks, &local),
            kv.max_splits,
            kv.block_smem_bytes,
            kv.block_bytes_in_flight,
            kv.block_fixed_work
        );
    }
    if uses_kv_var || uses_split {
        out.push_str("    L->kv_splits = n_kv_splits;\n");
    } else {
        out.push_str("    L->kv_splits = 1;\n");
    }
    if !workspaces.is_empty() {
        out.push_str("    /* the workspace: 256-byte aligned sub-buffers */\n");
    }
    for b in &workspaces {
        let f = buf_field(&b.name);
        let elements = c_expr(&SizeExpr::Op(SizeOp::Mul(b.shape.clone())), &local);
        let body = format!(
            "L->bytes_{f} = aecl_mul({elements}, {}u, &ovf);\n        L->off_{f} = L->workspace_bytes;\n        L->workspace_bytes = aecl_add(L->workspace_bytes, aecl_align(L->bytes_{f}, &ovf), &ovf);",
            b.dtype.bytes()
        );
        match b.when {
            Some(Condition::SplitKv) => {
                let _ = writeln!(
                    out,
                    "    if (n_kv_splits > 1) {{ /* {} */\n        {body}\n    }}",
                    comment(&b.name)
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "    {{ /* {} */\n        {body}\n    }}",
                    comment(&b.name)
                );
            }
        }
    }
    for b in &zeroed_caller {
        let f = buf_field(&b.name);
        let elements = c_expr(&SizeExpr::Op(SizeOp::Mul(b.shape.clone())), &local);
        let _ = writeln!(
            out,
            "    L->bytes_{f} = aecl_mul({elements}, {}u, &ovf);",
            b.dtype.bytes()
        );
    }
    for (l, launch) in plan.launches.iter().enumerate() {
        for d in 0..3 {
            let _ = writeln!(
                out,
                "    L->grid[{l}][{d}] = {};",
                c_expr(&launch.grid[d], &local)
            );
        }
    }
    for (a, (e, _)) in i32_args.iter().enumerate() {
        let _ = writeln!(out, "    L->arg{a} = {};", c_expr(e, &local));
    }
    for (k, (m, _)) in maps.iter().enumerate() {
        for (d, e) in m.dims.iter().enumerate() {
            let _ = writeln!(out, "    L->map{k}[{d}] = {};", c_expr(e, &local));
        }
        let elements = c_expr(&SizeExpr::Op(SizeOp::Mul(mapped(m).shape.clone())), &local);
        let _ = writeln!(out, "    L->map{k}_elements = {elements};");
    }
    let sizes_fmt: Vec<String> = v
        .sizes
        .iter()
        .map(|s| format!("{}=%d", c_str(&s.name, true)))
        .collect();
    let sizes_args: Vec<String> = v
        .sizes
        .iter()
        .map(|s| format!(", s->{}", s.field))
        .collect();
    let _ = writeln!(
        out,
        "    if (ovf)\n        return aecl_fail(err, errn, AEC_ERROR_SHAPE, \"{fname}: the sizes ({}) overflow 64-bit arithmetic\"{});",
        sizes_fmt.join(", "),
        sizes_args.concat()
    );
    for (l, launch) in plan.launches.iter().enumerate() {
        let _ = writeln!(
            out,
            "    if ((status = aecl_check_grid(lib, err, errn, \"{fname}\", \"{}\", L->grid[{l}], {}u)) != AEC_OK)\n        return status;",
            c_str(&launch.entry, false),
            launch.threads
        );
    }
    for (a, (e, l)) in i32_args.iter().enumerate() {
        // Plain sizes fit by construction (`int` fields at least 1).
        if matches!(e, SizeExpr::Var(n) if n != "kv_splits") {
            continue;
        }
        let _ = writeln!(
            out,
            "    if ((status = aecl_check_i32(err, errn, \"{fname}\", \"{}\", \"{}\", L->arg{a})) != AEC_OK)\n        return status;",
            c_str(&plan.launches[*l].entry, false),
            c_str(&e.to_string(), false)
        );
    }
    // Before any launch: the encoder's limits on the extents.
    for (k, (m, l)) in maps.iter().enumerate() {
        let _ = writeln!(
            out,
            "    if ((status = aecl_check_tensor_map(err, errn, \"{fname}\", \"{}\", \"{}\", L->map{k}, {}u, L->map{k}_elements)) != AEC_OK)\n        return status;",
            c_str(&plan.launches[*l].entry, false),
            c_str(&m.buffer, false),
            mapped(m).dtype.bytes()
        );
    }
    out.push_str("    return AEC_OK;\n}\n\n");

    // _run
    let _ = writeln!(
        out,
        "static inline int aecg_{base}_r{i}_run(aec_library *lib, const aec_{}_sizes *s, const aec_{base}_buffers *b,\n    void *workspace, void *stream, const char *cubin)\n{{\n    aecg_{base}_r{i}_layout L;\n    aecl_devptr ws = aecl_dptr(workspace);\n    int status, owned = 0;",
        v.ident
    );
    let nl = plan.launches.len();
    let _ = writeln!(out, "    aecl_kernel fn[{nl}];");
    // The record's other modules (`LaunchPlan::module`), by architecture.
    let mut module_keys: Vec<&str> = Vec::new();
    for l in &plan.launches {
        if let Some(k) = &l.module
            && !module_keys.contains(&k.as_str())
        {
            module_keys.push(k);
        }
    }
    let module_local = |k: &str| {
        format!(
            "module_{}",
            module_keys.iter().position(|m| *m == k).unwrap_or(0)
        )
    };
    for k in &module_keys {
        let _ = writeln!(
            out,
            "    const char *{} = NULL; /* the module `{}` */",
            module_local(k),
            comment(k)
        );
    }
    let uses_null = plan
        .launches
        .iter()
        .any(|l| l.args.iter().any(|a| matches!(a, ArgPlan::Null(_))));
    if uses_null {
        out.push_str("    aecl_devptr null_arg = 0;\n");
    }
    if !maps.is_empty() {
        // C99 has no alignas: the maps live in bytes aligned by hand.
        let _ = writeln!(
            out,
            "    unsigned char map_storage[{}u * AECL_TENSOR_MAP_BYTES + AECL_TENSOR_MAP_ALIGN - 1u];\n    unsigned char *maps = aecl_tensor_map_storage(map_storage);",
            maps.len()
        );
    }
    for b in &plan.buffers {
        let _ = writeln!(out, "    aecl_devptr p_{} = 0;", buf_field(&b.name));
    }
    for k in &module_keys {
        let local = module_local(k);
        let mut seen: Vec<&str> = Vec::new();
        for b in r.builds.iter().filter(|b| b.file.is_some()) {
            if seen.contains(&b.arch.as_str()) {
                continue;
            }
            seen.push(&b.arch);
            if let Some((_, Some(path))) = b.modules.iter().find(|(m, _)| m == k) {
                let _ = writeln!(
                    out,
                    "    if (strcmp(lib->arch, \"{}\") == 0)\n        {local} = \"{}\";",
                    c_str(&b.arch, false),
                    c_str(path, false)
                );
            }
        }
        let _ = writeln!(
            out,
            "    if ({local} == NULL)\n        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_NO_KERNEL, \"{fname}: no code object of the module {} for %s\", lib->arch);",
            c_str(k, true)
        );
    }
    for (l, launch) in plan.launches.iter().enumerate() {
        let module = match &launch.module {
            Some(k) => module_local(k),
            None => "cubin".to_string(),
        };
        let _ = writeln!(
            out,
            "    if ((status = aecl_function_get(lib, {module}, \"{}\", {}u, &fn[{l}])) != AEC_OK)\n        return status;",
            c_str(&launch.entry, false),
            launch.dynamic_smem_bytes
        );
    }
    // The plan after the functions: the KV-split rule reads the split
    // launch's occupancy (`aecl_resident_blocks`).
    let resident = match (&plan.kv_splits, plan.split_launch()) {
        (Some(_), Some(l)) => format!(
            "aecl_resident_blocks(lib, fn[{l}], {}u, {}u)",
            plan.launches[l].threads, plan.launches[l].dynamic_smem_bytes
        ),
        _ => "0".to_string(),
    };
    let _ = writeln!(
        out,
        "    if ((status = aecg_{base}_r{i}_plan(lib, s, {resident}, &L, lib->error, sizeof lib->error)) != AEC_OK)\n        return status;"
    );
    for b in caller_buffers(plan).filter(|b| b.when == Some(Condition::SplitKv)) {
        let f = buf_field(&b.name);
        if matches!(b.role, Role::Input | Role::Output) {
            let _ = writeln!(
                out,
                "    if (L.kv_splits > 1 && b->{f} == NULL)\n        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT, \"{fname}: buffers->{f} is NULL, but these sizes run %llu KV splits on this GPU and need it\", (unsigned long long)L.kv_splits);"
            );
        }
    }
    let _ = writeln!(
        out,
        "    if (workspace != NULL && L.workspace_bytes > 0 && (uintptr_t)workspace % AEC_WORKSPACE_ALIGN != 0)\n        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT, \"{fname}: the workspace %p is not 256-byte aligned\", workspace);"
    );
    // The tensor maps, encoded for the caller's pointers before anything is
    // allocated or launched, so a refusal leaves nothing to undo.
    for (k, (m, l)) in maps.iter().enumerate() {
        let b = mapped(m);
        let data_type = match b.dtype {
            Dtype::Bf16 => "AECL_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
            Dtype::F16 => "AECL_CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
            Dtype::F32 => "AECL_CU_TENSOR_MAP_DATA_TYPE_FLOAT32",
        };
        let [b0, b1, b2] = m.box_dims;
        let _ = writeln!(
            out,
            "    {{ /* the tensor map of {}: {}, box [{b0}, {b1}, {b2}] */\n        const uint32_t box[3] = {{{b0}u, {b1}u, {b2}u}};\n        if ((status = aecl_tensor_map_encode(lib, maps + {k}u * AECL_TENSOR_MAP_BYTES, {data_type}, {}u, aecl_dptr(b->{}), L.map{k}, box, \"{fname}\", \"{}\", \"{}\")) != AEC_OK)\n            return status;\n    }}",
            comment(&m.buffer),
            comment(&shape_text(&m.dims)),
            b.dtype.bytes(),
            buf_field(&m.buffer),
            c_str(&plan.launches[*l].entry, false),
            c_str(&m.buffer, false)
        );
    }
    let _ = writeln!(
        out,
        "    if (L.workspace_bytes > 0 && workspace == NULL) {{\n        if ((status = aecl_workspace_alloc(lib, L.workspace_bytes, &ws, \"{fname}\")) != AEC_OK)\n            return status;\n        owned = 1;\n    }}"
    );
    for b in &plan.buffers {
        let f = buf_field(&b.name);
        let value = if b.role == Role::Workspace {
            format!("ws + L.off_{f}")
        } else {
            format!("aecl_dptr(b->{f})")
        };
        match b.when {
            Some(Condition::SplitKv) => {
                let _ = writeln!(out, "    p_{f} = L.kv_splits > 1 ? {value} : 0;");
            }
            None => {
                let _ = writeln!(out, "    p_{f} = {value};");
            }
        }
    }
    for b in plan.buffers.iter().filter(|b| b.zeroed) {
        let f = buf_field(&b.name);
        let _ = writeln!(
            out,
            "    if (status == AEC_OK)\n        status = aecl_zero(lib, p_{f}, L.bytes_{f}, stream, \"{fname}\", \"{}\");",
            c_str(&b.name, false)
        );
    }
    for (l, launch) in plan.launches.iter().enumerate() {
        let cond = match launch.when {
            Some(Condition::SplitKv) => " && L.kv_splits > 1",
            None => "",
        };
        let _ = writeln!(
            out,
            "    if (status == AEC_OK{cond}) {{ /* {} */",
            comment(&launch.entry)
        );
        let mut params = Vec::new();
        for (a, arg) in launch.args.iter().enumerate() {
            match arg {
                ArgPlan::Ptr(n) => params.push(format!("&p_{}", buf_field(n))),
                ArgPlan::Null(_) => params.push("&null_arg".to_string()),
                ArgPlan::I32(e) => {
                    let _ = writeln!(out, "        int a{a} = (int)L.arg{};", arg_index(e));
                    params.push(format!("&a{a}"));
                }
                // The kernel takes the map by value: the parameter is
                // its 128 bytes.
                ArgPlan::TensorMap(m) => {
                    params.push(format!("maps + {}u * AECL_TENSOR_MAP_BYTES", map_index(m)))
                }
            }
        }
        if params.is_empty() {
            out.push_str("        void **args = NULL;\n");
        } else {
            let _ = writeln!(out, "        void *args[] = {{{}}};", params.join(", "));
        }
        let _ = writeln!(
            out,
            "        status = aecl_launch(lib, fn[{l}], L.grid[{l}], {}u, {}u, stream, args, \"{fname}\", \"{}\");\n    }}",
            launch.threads,
            launch.dynamic_smem_bytes,
            c_str(&launch.entry, false)
        );
    }
    // Buffers no launch reads would be unused locals.
    for b in &plan.buffers {
        let f = buf_field(&b.name);
        let read = plan.launches.iter().any(|l| {
            l.args
                .iter()
                .any(|a| matches!(a, ArgPlan::Ptr(n) if *n == b.name))
        });
        if !read && !b.zeroed {
            let _ = writeln!(out, "    (void)p_{f};");
        }
    }
    let _ = writeln!(
        out,
        "    if (owned)\n        status = aecl_workspace_release(lib, ws, stream, status, \"{fname}\");\n    return status;\n}}\n"
    );
}

/// The distinct values `pick` takes from the plan's launch arguments, in
/// order of first use, each with the first launch that passes it.
fn distinct_args<'a, T: PartialEq>(
    plan: &'a EntryPlan,
    pick: impl Fn(&'a ArgPlan) -> Option<&'a T>,
) -> Vec<(&'a T, usize)> {
    let mut out: Vec<(&T, usize)> = Vec::new();
    for (l, launch) in plan.launches.iter().enumerate() {
        for value in launch.args.iter().filter_map(&pick) {
            if !out.iter().any(|(x, _)| *x == value) {
                out.push((value, l));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn variant_names_become_snake_case_c_names() {
        assert_eq!(snake_name("Softmax"), "softmax");
        assert_eq!(snake_name("SoftmaxGQA"), "softmax_gqa");
        assert_eq!(snake_name("SoftmaxGqa"), "softmax_gqa");
        assert_eq!(snake_name("GQASoftmax"), "gqa_softmax");
        assert_eq!(snake_name("Mamba2"), "mamba2");
        assert_eq!(snake_name("RetNetParallel"), "ret_net_parallel");
        assert_eq!(snake_name("Odd-Name  v2"), "odd_name_v2");
        assert_eq!(snake_name("Ünïcode"), "n_code");
        assert_eq!(snake_name("__"), "");
    }

    #[test]
    fn field_names_are_valid_c_and_avoid_keywords_and_macros() {
        assert_eq!(c_identifier("q"), "q");
        assert_eq!(c_identifier("row_outputs"), "row_outputs");
        assert_eq!(c_identifier("int"), "int_");
        assert_eq!(c_identifier("class"), "class_");
        // Every word of the list counts, the ones at its line ends too.
        for k in ["if", "inline", "auto", "I", "xor_eq", "errno"] {
            assert_eq!(c_identifier(k), format!("{k}_"));
        }
        assert_eq!(c_identifier("ifinline"), "ifinline");
        assert_eq!(c_identifier("errno"), "errno_");
        assert_eq!(c_identifier("2d"), "x_2d");
        assert_eq!(c_identifier("_Bias"), "x_Bias");
        assert_eq!(c_identifier("__x"), "x__x");
        assert_eq!(c_identifier("α"), "x_");
        assert_eq!(c_identifier(""), "x_");
    }

    #[test]
    fn expressions_print_as_checked_64_bit_c() {
        let e: SizeExpr = serde_json::from_value(
            json!({"mul": [{"ceil_div": [{"mul": ["H", "Sq"]}, 128]}, "kv_splits"]}),
        )
        .unwrap();
        let var = |n: &str| format!("n_{n}");
        assert_eq!(
            c_expr(&e, &var),
            "aecl_mul(aecl_ceil_div(aecl_mul(n_H, n_Sq, &ovf), 128u, &ovf), n_kv_splits, &ovf)"
        );
        assert_eq!(c_expr(&SizeExpr::Const(5_000_000_000), &var), "5000000000u");
        let g: SizeExpr =
            serde_json::from_value(json!({"min": [{"mul": ["H", "B"]}, "sms"]})).unwrap();
        assert_eq!(
            c_expr(&g, &var),
            "aecl_min(aecl_mul(n_H, n_B, &ovf), n_sms)"
        );
        let pairs: SizeExpr = serde_json::from_value(
            json!({"mul": [2, {"min": [{"ceil_div": ["units", 2]}, {"floor_div": ["sms", 2]}]}]}),
        )
        .unwrap();
        assert_eq!(
            c_expr(&pairs, &var),
            "aecl_mul(2u, aecl_min(aecl_ceil_div(n_units, 2u, &ovf), aecl_floor_div(n_sms, 2u, &ovf)), &ovf)"
        );
        assert_eq!(
            pairs.to_string(),
            "2 * min(ceil(units / 2), floor(sms / 2))"
        );
        assert_eq!(c_expr(&SizeExpr::Op(SizeOp::Mul(vec![])), &var), "1u");
        assert_eq!(
            shape_text(&[SizeExpr::var("B"), SizeExpr::Const(64)]),
            "[B, 64]"
        );
    }

    #[test]
    fn strings_and_comments_are_escaped() {
        assert_eq!(c_str("a\"b\\c??=d%", true), "a\\\"b\\\\c\\?\\?=d%%");
        assert_eq!(c_str("é", false), "\\303\\251");
        assert_eq!(comment("x */ y\nz"), "x * / y z");
    }

    fn plan(buffers: Value) -> Value {
        json!({
            "pass": "forward",
            "sizes": [{"name": "B"}, {"name": "S"}],
            "buffers": buffers,
            "launches": [{"entry": "k", "grid": [1, "S", "B"], "threads": 128, "dynamic_smem_bytes": 0,
                          "args": [{"ptr": "x"}, {"i32": "S"}]}]
        })
    }

    fn manifest(name: &str, buffers: Value) -> Value {
        json!({"variants": [{
            "name": name, "file": "x.rs", "pattern": "recurrent",
            "kernels": [{"pass": "forward", "head_dims": {"D": 64},
                         "builds": [{"target": "h100", "arch": "sm_90a", "cubin": "kernels/k.cubin"}],
                         "plan": plan(buffers)}]
        }]})
    }

    fn x() -> Value {
        json!([{"name": "x", "role": "input", "dtype": "f32", "shape": ["B", "S"], "doc": "x"}])
    }

    #[test]
    fn a_small_manifest_gives_a_deterministic_header() {
        let m = manifest("Tiny", x());
        let h = generate(&m).unwrap();
        assert_eq!(h, generate(&m).unwrap());
        assert!(h.contains("typedef struct aec_tiny_sizes {"), "{h}");
        assert!(
            h.contains("    const float *x; /* input, f32 [B, S]: x */"),
            "{h}"
        );
        assert!(
            h.contains("static inline int aec_tiny_forward(aec_library *lib"),
            "{h}"
        );
        assert!(
            h.contains("if (strcmp(lib->arch, \"sm_90a\") == 0 && s->D == 64) {"),
            "{h}"
        );
        assert!(h.contains("\"aec_tiny_forward: buffers->x is NULL: the input x (f32 [B=%d, S=%d]) is required\", s->B, s->S"), "{h}");
    }

    #[test]
    fn malformed_manifests_are_refused_with_the_place() {
        let e = generate(&json!({"format": 4})).unwrap_err();
        assert!(e.contains("`variants`"), "{e}");
        let mut m = manifest("Tiny", x());
        m["variants"][0]["kernels"][0]["plan"]["launches"][0]["grid"][0] = json!("Q");
        let e = generate(&m).unwrap_err();
        assert!(
            e.contains("variants[0] (`Tiny`).kernels[0].plan") && e.contains("`Q`"),
            "{e}"
        );
        let mut m = manifest("Tiny", x());
        m["variants"][0]["kernels"][0]["plan"]["launches"][0]["args"][0] = json!({"ptr": "y"});
        let e = generate(&m).unwrap_err();
        assert!(e.contains("points to `y`"), "{e}");
        let mut m = manifest("Tiny", x());
        m["variants"][0]["kernels"][0]["plan"]["buffers"][0]["dtype"] = json!("f64");
        let e = generate(&m).unwrap_err();
        assert!(e.contains("kernels[0].plan") && e.contains("f64"), "{e}");
        let mut m = manifest("Tiny", x());
        m["variants"][0]["kernels"][0]["builds"][0] = json!({"target": "h100", "arch": "sm_90a"});
        let e = generate(&m).unwrap_err();
        assert!(e.contains("builds[0]") && e.contains("cubin"), "{e}");
    }

    #[test]
    fn colliding_names_are_refused() {
        let mut m = manifest("SoftmaxGqa", x());
        let second = {
            let mut v = m["variants"][0].clone();
            v["name"] = json!("SoftmaxGQA");
            v
        };
        m["variants"].as_array_mut().unwrap().push(second);
        let e = generate(&m).unwrap_err();
        assert!(
            e.contains("SoftmaxGQA") && e.contains("aec_softmax_gqa_sizes"),
            "{e}"
        );
        assert!(
            generate(&manifest("Library", x())).is_ok(),
            "aec_library_sizes does not collide with the loader's names"
        );
        let bufs = json!([
            {"name": "x", "role": "input", "dtype": "f32", "shape": ["B"], "doc": ""},
            {"name": "x_", "role": "input", "dtype": "f32", "shape": ["B"], "doc": ""},
            {"name": "x-", "role": "input", "dtype": "f32", "shape": ["B"], "doc": ""}
        ]);
        let e = generate(&manifest("Tiny", bufs)).unwrap_err();
        assert!(
            e.contains("`x_` and `x-`") && e.contains("C name `x_`"),
            "{e}"
        );
    }
}
